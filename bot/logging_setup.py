"""Logging for the bot's processes: one format, to stderr or to a file."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"


def configure_logging(level: str | int = "INFO", *, file: Path | None = None) -> None:
    """Send the root logger's records at ``level`` and above to ``file`` (appending; its
    directory is created) or to stderr. Quietens the chattiest libraries to warnings."""
    handler: logging.Handler
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("paramiko", "apscheduler", "slack_sdk", "urllib3", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
