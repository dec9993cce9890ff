"""SeenOnce: a bounded memory of what was already reported, so a repeating problem is logged once."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


class SeenOnce(set[K]):
    """Keys already reported; `first(key)` is True only the first time a key is seen.

    Past `limit` keys the memory is dropped at once: a key may then be reported again, which keeps both
    memory and log volume bounded however many distinct problems a node produces.
    """

    def __init__(self, limit: int = 4096) -> None:
        super().__init__()
        self.limit = limit

    def first(self, key: K) -> bool:
        """Remember `key`; True when it was not remembered before."""
        if key in self:
            return False
        if len(self) >= self.limit:
            self.clear()
        self.add(key)
        return True

    def retain(self, keep: Callable[[K], bool]) -> None:
        """Forget the keys `keep` rejects (e.g. of pods that are gone)."""
        self.difference_update([k for k in self if not keep(k)])
