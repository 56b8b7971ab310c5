"""gpu-agent: the small program gpubot runs on each rented instance (standard library only)."""

from __future__ import annotations

__version__ = "0.1.0"
