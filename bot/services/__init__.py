"""Services: what commands and the clock do, with no Slack and no SQL in listeners."""

from __future__ import annotations
