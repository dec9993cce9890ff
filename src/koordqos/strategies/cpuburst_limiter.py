"""CPUBurst's burst limiter (docs/behaviour-qos-manager.md, "Burst limiter"): a token bucket per container
bounding time spent above the limit."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from koordqos.model.nodeslo import CPUBurstConfig

LIMITER_CONSUME_PERCENT = 100  # usage at or above the limit spends tokens
LIMITER_SAVE_PERCENT = 60  # usage below this saves tokens


@dataclass
class BurstLimiter:
    """Token bucket limiting how long a container may run above its limit (one token = 1 %·s over it)."""

    capacity: int
    tokens: int
    last_update: float
    expire_seconds: float

    @classmethod
    def new(
        cls, period_seconds: int, percent: int, now: float, rand: Callable[[], float] = random.random
    ) -> BurstLimiter:
        """capacity = period × (percent − 100), started below half full at random (pods desynchronised)."""
        capacity = period_seconds * (percent - 100)
        return cls(capacity, int(capacity * rand() * 0.5), now, 2.0 * period_seconds)

    def allow(self, now: float, usage_percent: int) -> bool:
        """Spend tokens above 100 % usage, save below 60 %; allowed while tokens remain."""
        elapsed = int(now - self.last_update)
        self.last_update = now
        if usage_percent >= LIMITER_CONSUME_PERCENT:
            self.tokens -= (usage_percent - 100) * elapsed
        elif usage_percent < LIMITER_SAVE_PERCENT:
            self.tokens += (100 - usage_percent) * elapsed
        self.tokens = max(min(self.tokens, self.capacity), -self.capacity)
        return self.tokens > 0

    def expired(self, now: float) -> bool:
        """Not updated for more than 2 × the burst period."""
        return now - self.last_update > self.expire_seconds


@dataclass
class LimiterPool:
    """Limiters by container id; re-created when their capacity changes, dropped when they expire."""

    rand: Callable[[], float] = random.random
    limiters: dict[str, BurstLimiter] = field(default_factory=dict)

    def get(self, key: str, period_seconds: int, percent: int, now: float) -> BurstLimiter:
        """The container's limiter for this config (a new one when absent or the capacity changed)."""
        lim = self.limiters.get(key)
        if lim is None or lim.capacity != period_seconds * (percent - 100):
            lim = self.limiters[key] = BurstLimiter.new(period_seconds, percent, now, self.rand)
        return lim

    def recycle(self, now: float) -> list[str]:
        """Drop expired limiters; returns their keys."""
        gone = [k for k, lim in self.limiters.items() if lim.expired(now)]
        for k in gone:
            del self.limiters[k]
        return gone


def limiter_allows(
    pool: LimiterPool, key: str, cfg: CPUBurstConfig, usage_cores: float | None, limit_milli: int, now: float
) -> bool:
    """The limiter check of one container (run before the policy check: it updates the bucket)."""
    period = cfg.cfs_quota_burst_period_seconds
    if period is None or period < 0:
        return True
    percent = cfg.cfs_quota_burst_percent
    if percent is None or percent < 100:
        return False
    usage = usage_cores if usage_cores is not None else limit_milli / 1000
    usage_percent = int(usage * 1000 * 100 / limit_milli)
    return pool.get(key, period, percent, now).allow(now, usage_percent)
