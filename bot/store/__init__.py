"""The store: SQLModel tables, sessions and Alembic migrations (SQLite by default, PostgreSQL by URL)."""

from __future__ import annotations
