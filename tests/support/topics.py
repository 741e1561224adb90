"""Topic names no other test (or an earlier run against the same external broker) has used."""

from __future__ import annotations

import uuid


def unique_topic(prefix: str = "t") -> str:
    """``prefix`` plus ten random hex digits: tests sharing a broker never see each other's records."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
