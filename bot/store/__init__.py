"""The store: SQLModel tables, sessions and Alembic migrations (SQLite or PostgreSQL)."""

from __future__ import annotations
