"""Block Kit renderers: pure functions from values to messages."""

from __future__ import annotations
