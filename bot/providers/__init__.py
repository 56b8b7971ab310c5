"""GPU platforms behind one Protocol: manual, aws (boto3), lambda, runpod, vast and compshare
(REST)."""

from __future__ import annotations
