"""`python -m agents` runs the agent CLI."""

from __future__ import annotations

import sys

from agents.cli import main

sys.exit(main())
