"""Seeds of their own for the random streams of a run, so that conditions stay paired."""

from __future__ import annotations

import hashlib


def derive_seed(seed: int, stream: str) -> int:
    """A seed of its own for one random stream (``"adapter"``, ``"dropout"``, ``"data_order"`` ...) of a run
    seeded with ``seed``: streams drawn from one global generator would shift whenever another stream
    draws more numbers (an adapter with more parameters), and conditions would stop being paired."""
    return int(hashlib.sha256(f"{seed}:{stream}".encode()).hexdigest()[:8], 16) % (2**31)
