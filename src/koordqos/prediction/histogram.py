"""Bucketed histograms of one resource's usage, with exponential decay (docs/prediction.md, "Histogram",
"Decay").

* `LinearLayout` / `ExponentialLayout`: where the buckets are. The models use the exponential one (CPU from
  0.025 cores, memory from 5 MiB, each bucket 5 % wider than the one before); the linear one exists for the
  spec's unit-test vectors.
* `Histogram`: bucket weights, their total and the range of non-empty buckets; a percentile is the **end** of
  the bucket where the cumulative weight first reaches p·total (no interpolation).
* `DecayingHistogram`: a sample added at t weighs 2^((t − ref)/half-life); the reference starts at Go's zero
  time (year 1), so the first sample moves it to t rounded to a half-life, and it moves again only once t is
  100 half-lives past it (the weights are then scaled down by the whole number of half-lives it moved).
* `HistogramCheckpoint`: the saved form (weights scaled so the largest is 10000, the total exact).

Pure: no I/O, no clock. Times are integer nanoseconds since the Unix epoch; `None` is the zero time. The
weights are an `array('d')` (8 bytes a bucket: 158 for CPU, 205 for memory, ~3 KB a model).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Protocol

#: the largest bucket weight of a checkpoint
MAX_CHECKPOINT_WEIGHT = 10000
#: renormalise once a sample is this many half-lives past the reference
MAX_DECAY_EXPONENT = 100
#: nanoseconds from Go's zero time (0001-01-01T00:00:00Z) to the Unix epoch: rounding to a half-life counts
#: from the zero time (719162 days, so for half-lives dividing a day it is the same as counting from 1970)
ZERO_TIME_OFFSET_NS = 62_135_596_800 * 1_000_000_000
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


class HistogramError(ValueError):
    """A checkpoint this histogram cannot load (negative total, bucket out of range)."""


class BucketLayout(Protocol):
    """Where the buckets of a histogram are (koordlet's `HistogramOptions`)."""

    @property
    def num_buckets(self) -> int: ...

    @property
    def epsilon(self) -> float: ...

    def find(self, value: float) -> int: ...

    def start(self, bucket: int) -> float: ...


@dataclass(frozen=True, slots=True)
class LinearLayout:
    """Buckets of one size from 0; the last starts at or above `max_value` (used by the spec's tests)."""

    max_value: float
    bucket_size: float
    epsilon: float
    num_buckets: int = field(init=False)

    def __post_init__(self) -> None:
        if self.max_value <= 0 or self.bucket_size <= 0 or self.epsilon <= 0:
            raise ValueError("max_value, bucket_size and epsilon must be positive")
        object.__setattr__(self, "num_buckets", math.ceil(self.max_value / self.bucket_size) + 1)

    def find(self, value: float) -> int:
        """The bucket of `value`: truncated value/size, clamped to [0, num_buckets)."""
        bucket = int(value / self.bucket_size)
        return 0 if bucket < 0 else min(bucket, self.num_buckets - 1)

    def start(self, bucket: int) -> float:
        """The lower edge of `bucket`."""
        return bucket * self.bucket_size


@dataclass(frozen=True, slots=True)
class ExponentialLayout:
    """Bucket 0 is [0, first); bucket b ≥ 1 starts at first·(ratio^b − 1)/(ratio − 1); the last start is at
    or above `max_value` and the last bucket has no upper edge."""

    max_value: float
    first_bucket_size: float
    ratio: float
    epsilon: float
    num_buckets: int = field(init=False)
    _starts: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_value <= 0 or self.first_bucket_size <= 0 or self.epsilon <= 0 or self.ratio <= 1:
            raise ValueError("max_value, first_bucket_size and epsilon must be > 0, ratio > 1")
        r, s = self.ratio, self.first_bucket_size
        n = math.ceil(math.log(self.max_value * (r - 1) / s + 1) / math.log(r)) + 1
        object.__setattr__(self, "num_buckets", n)
        starts = (0.0, *(s * (math.pow(r, b) - 1) / (r - 1) for b in range(1, n)))
        object.__setattr__(self, "_starts", starts)

    def find(self, value: float) -> int:
        """The bucket of `value`: 0 below the first size, else the truncated log (clamped to the last).

        Truncation puts a value lying exactly on a computed start often one bucket lower (docs/prediction.md,
        "Histogram")."""
        if value < self.first_bucket_size:
            return 0
        r = self.ratio
        bucket = int(math.log(value * (r - 1) / self.first_bucket_size + 1) / math.log(r))
        return min(bucket, self.num_buckets - 1)

    def start(self, bucket: int) -> float:
        """The lower edge of `bucket`."""
        return self._starts[bucket]


#: CPU in cores: 0.025 cores first, ×1.05, up to 1024 cores → 158 buckets; ε = 0.001 × 0.1
CPU_LAYOUT = ExponentialLayout(1024.0, 0.025, 1.05, 1e-4)
#: memory in bytes: 5 MiB first, ×1.05, up to 2 TiB → 205 buckets
MEMORY_LAYOUT = ExponentialLayout(float(1 << 41), float(5 << 20), 1.05, 1e-4)


@dataclass(frozen=True, slots=True)
class HistogramCheckpoint:
    """A histogram as saved: reference time (None: the zero time), bucket → weight (largest 10000, each at
    most 2^32 − 1) and the exact total."""

    reference_ns: int | None = None
    bucket_weights: dict[int, int] = field(default_factory=dict)
    total_weight: float = 0.0


class Histogram:
    """Bucket weights of one layout; a bucket is empty while its weight is below ε."""

    __slots__ = ("layout", "max_bucket", "min_bucket", "total", "weights")

    def __init__(self, layout: BucketLayout) -> None:
        self.layout = layout
        n = layout.num_buckets
        self.weights = array("d", bytes(8 * n))
        self.total = 0.0
        self.min_bucket = n - 1  # the first non-empty bucket, or the last one when there is none
        self.max_bucket = 0  # the last non-empty bucket, or 0

    def add(self, value: float, weight: float) -> None:
        """Add `weight` (non-negative) to the bucket of `value`."""
        if weight < 0:
            raise ValueError("sample weight must be non-negative")
        b = self.layout.find(value)
        w = self.weights
        w[b] += weight
        self.total += weight
        eps = self.layout.epsilon
        if b < self.min_bucket and w[b] >= eps:
            self.min_bucket = b
        if b > self.max_bucket and w[b] >= eps:
            self.max_bucket = b

    def subtract(self, value: float, weight: float) -> None:
        """Take `weight` off the bucket of `value` and the total; what drops below ε becomes 0."""
        if weight < 0:
            raise ValueError("sample weight must be non-negative")
        b = self.layout.find(value)
        eps = self.layout.epsilon
        total = self.total - weight
        self.total = 0.0 if total < eps else total
        left = self.weights[b] - weight
        self.weights[b] = 0.0 if left < eps else left
        self._repair_bounds()

    def _repair_bounds(self) -> None:
        eps = self.layout.epsilon
        w = self.weights
        last = len(w) - 1
        while w[self.min_bucket] < eps and self.min_bucket < last:
            self.min_bucket += 1
        while w[self.max_bucket] < eps and self.max_bucket > 0:
            self.max_bucket -= 1

    def scale(self, factor: float) -> None:
        """Multiply every weight and the total by `factor` (≥ 0; percentiles do not change)."""
        if factor < 0:
            raise ValueError("scale factor must be non-negative")
        w = self.weights
        for b in range(self.min_bucket, self.max_bucket + 1):
            w[b] *= factor
        self.total *= factor
        self._repair_bounds()

    @property
    def empty(self) -> bool:
        """No bucket holds ε or more."""
        return self.weights[self.min_bucket] < self.layout.epsilon

    def percentile(self, p: float) -> float:
        """The end of the bucket where the cumulative weight from the lowest bucket first reaches p·total
        (the last bucket: its start); 0.0 for an empty histogram."""
        if self.empty:
            return 0.0
        threshold = p * self.total
        w = self.weights
        cum = 0.0
        b = self.min_bucket
        top = self.max_bucket
        while b < top:
            cum += w[b]
            if cum >= threshold:
                break
            b += 1
        layout = self.layout
        return layout.start(b + 1) if b < layout.num_buckets - 1 else layout.start(b)

    def save(self) -> HistogramCheckpoint:
        """Weights scaled so the largest is 10000 (half up), buckets rounding to 0 dropped; total exact."""
        w = self.weights
        lo, hi = self.min_bucket, self.max_bucket
        top = max((w[b] for b in range(lo, hi + 1)), default=0.0)
        weights: dict[int, int] = {}
        if top > 0:
            ratio = MAX_CHECKPOINT_WEIGHT / top
            for b in range(lo, hi + 1):
                q = math.floor(w[b] * ratio + 0.5)
                if q > 0:
                    weights[b] = q
        return HistogramCheckpoint(None, weights, self.total)

    def load(self, cp: HistogramCheckpoint) -> None:
        """Add a checkpoint's weights (rescaled to its total); HistogramError for a negative total or a
        bucket out of range (then nothing is changed). All-zero weights load nothing."""
        if not cp.total_weight >= 0:  # also NaN
            raise HistogramError(f"negative total weight {cp.total_weight!r}")
        n = self.layout.num_buckets
        q_sum = 0
        for b, q in cp.bucket_weights.items():
            if not 0 <= b < n:
                raise HistogramError(f"bucket {b} outside the histogram's {n} buckets")
            q_sum += q
        if q_sum == 0:
            return
        ratio = cp.total_weight / q_sum
        w = self.weights
        for b, q in cp.bucket_weights.items():
            self.min_bucket = min(self.min_bucket, b)
            self.max_bucket = max(self.max_bucket, b)
            w[b] += q * ratio
        self.total += cp.total_weight

    def nbytes(self) -> int:
        """Bytes of the weight array."""
        return self.weights.itemsize * len(self.weights)


def round_to_half_life(t_ns: int, half_life_ns: int) -> int:
    """`t` rounded to the nearest multiple of the half-life counted from Go's zero time, halves up."""
    since = t_ns + ZERO_TIME_OFFSET_NS
    r = since % half_life_ns
    return t_ns - r if r + r < half_life_ns else t_ns + (half_life_ns - r)


class DecayingHistogram:
    """A histogram whose samples weigh 2^((t − reference)/half-life) (docs/prediction.md, "Decay")."""

    __slots__ = ("half_life_ns", "hist", "reference_ns")

    def __init__(self, layout: BucketLayout, half_life_ns: int) -> None:
        if half_life_ns <= 0:
            raise ValueError("half-life must be positive")
        self.hist = Histogram(layout)
        self.half_life_ns = half_life_ns
        self.reference_ns: int | None = None  # Go's zero time until the first sample

    def _shift_reference(self, t_ns: int) -> None:
        new_ref = round_to_half_life(t_ns, self.half_life_ns)
        if self.reference_ns is None:
            # from year 1 the Go duration saturates at −2^63 ns: 2^(−213504) for 12 h, i.e. 0
            diff = _INT64_MIN
        else:
            diff = max(_INT64_MIN, min(_INT64_MAX, self.reference_ns - new_ref))
        exponent = math.floor(diff / self.half_life_ns + 0.5)
        factor = math.inf if exponent > 1024 else math.ldexp(1.0, max(exponent, -1100))
        self.hist.scale(factor)
        self.reference_ns = new_ref

    def _factor(self, t_ns: int) -> float:
        ref = self.reference_ns
        if ref is None or t_ns > ref + self.half_life_ns * MAX_DECAY_EXPONENT:
            self._shift_reference(t_ns)
            ref = self.reference_ns
            assert ref is not None
        factor: float = 2.0 ** (float(t_ns - ref) / float(self.half_life_ns))
        return factor

    def add(self, value: float, weight: float, t_ns: int) -> None:
        """Add a sample of `weight` at time `t_ns`."""
        self.hist.add(value, weight * self._factor(t_ns))

    def subtract(self, value: float, weight: float, t_ns: int) -> None:
        """Take a sample of `weight` at time `t_ns` off."""
        self.hist.subtract(value, weight * self._factor(t_ns))

    def percentile(self, p: float) -> float:
        """See `Histogram.percentile`."""
        return self.hist.percentile(p)

    @property
    def empty(self) -> bool:
        """See `Histogram.empty`."""
        return self.hist.empty

    def save(self) -> HistogramCheckpoint:
        """The checkpoint, with this histogram's reference time."""
        cp = self.hist.save()
        return HistogramCheckpoint(self.reference_ns, cp.bucket_weights, cp.total_weight)

    def load(self, cp: HistogramCheckpoint) -> None:
        """Load a checkpoint and take its reference time (HistogramError: nothing changed)."""
        self.hist.load(cp)
        self.reference_ns = cp.reference_ns

    def nbytes(self) -> int:
        """Bytes of the weight array."""
        return self.hist.nbytes()
