"""GPU platforms behind one Protocol: manual, aws (boto3), lambda, runpod and vast (REST)."""

from __future__ import annotations
