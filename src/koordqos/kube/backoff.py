"""Capped exponential backoff with jitter (for watch/list retries)."""

from __future__ import annotations

import random


class Backoff:
    """delay(n) = min(cap, base·2^(n−1)) · (1 ± jitter); `reset()` after a success."""

    def __init__(
        self, base: float = 0.5, cap: float = 30.0, jitter: float = 0.2, rng: random.Random | None = None
    ) -> None:
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        """Count one more failure and return how long to wait before retrying."""
        self.failures += 1
        delay = min(self.cap, self.base * 2 ** min(self.failures - 1, 30))
        jittered: float = delay * (1 + self._rng.uniform(-self.jitter, self.jitter))
        return max(0.0, jittered)

    def reset(self) -> None:
        """A success: the next failure starts from `base` again."""
        self.failures = 0
