"""Health checks as pure functions: facts in (snapshots, probe results, parsed files), a
HealthCheck out. No I/O here; agents.health gathers the facts and calls them in order."""

from __future__ import annotations
