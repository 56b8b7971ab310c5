"""The agent's usage error: bad command-line input, reported on stderr with exit code 2.

Standard library only and cheap to import: ``gpu-agent status`` loads it.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad command-line input: reported on stderr (after ``usage``, if any) with exit code 2."""

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message)
        self.usage = usage
