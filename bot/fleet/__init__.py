"""Reaching instances: the SSH transport, the local transport and the agent client over either."""

from __future__ import annotations
