"""Bounded memories of data other parties control: `SeenOnce` (what was already reported, so a repeating
problem is logged once) and `BoundedMemo` (a memo within a byte budget).

The keys are mostly built from data other parties control (pod ids, cgroup paths, annotation values, error
texts that quote them), of any size. A SeenOnce therefore never holds a key: it keeps a 64-bit digest of it
(the key's hash) in a table allocated once, when it is made, at `limit` digests (16 bytes a key, 64 KiB at
the default 4,096). Whatever keys arrive, and however long they are, its memory neither grows nor
fragments the heap. A digest collision (another key with the same 64-bit hash: string hashes are salted
per process, so a remote party cannot aim for one) makes a first report look like a repeat: the log line
is skipped, the problem is still counted by its caller.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_EMPTY = 0  # a free slot
_GONE = 1  # a discarded key's slot (probing goes on past it)
_MASK = (1 << 64) - 1


_NONE = array("Q")


def _zeros(n: int) -> array[int]:
    return array("Q", (0,)) * n  # made at its size: no temporary of that size


def digest(key: Hashable) -> int:
    """The key's 64-bit digest as a SeenOnce stores it (never 0 or 1: those mark free slots)."""
    h = hash(key) & _MASK
    return h | 1 << 63 if h < 2 else h  # no int hashes that high (|hash(int)| < 2**61): no clash with 0/1


class SeenOnce(Generic[K]):
    """Keys already reported; `first(key)` is True only the first time a key is seen.

    Past `limit` keys the memory is dropped at once: a key may then be reported again, which keeps both
    memory and log volume bounded however many distinct problems a node produces. With `scoped`, each key
    can name a scope (e.g. the pod it is about) and `retain_scopes` forgets the keys of scopes that are
    gone; the scopes are kept as digests too (another 8 bytes a slot).
    """

    __slots__ = ("_live", "_scopes", "_slots", "_table", "_used", "limit")

    def __init__(self, limit: int = 4096, *, scoped: bool = False) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._slots = 1 << max(limit * 2 - 1, 1).bit_length()  # a power of two, at least 2x limit
        self._table = _zeros(self._slots)
        self._scopes = _zeros(self._slots) if scoped else None
        self._used = 0  # slots not free (keys and discarded ones)
        self._live = 0  # keys remembered

    @property
    def nbytes(self) -> int:
        """Bytes of the tables (fixed at construction)."""
        return self._slots * 8 * (1 if self._scopes is None else 2)

    def _find(self, h: int) -> tuple[int, int]:
        """(slot of `h` or -1, the slot a new `h` would take)."""
        table, mask = self._table, self._slots - 1
        i = h & mask
        free = -1
        while True:
            v = table[i]
            if v == h:
                return i, free
            if v == _EMPTY:
                return -1, i if free < 0 else free
            if v == _GONE and free < 0:
                free = i
            i = (i + 1) & mask

    def first(self, key: K, scope: Hashable | None = None) -> bool:
        """Remember `key` (in `scope`, for a scoped SeenOnce); True when it was not remembered before."""
        h = digest(key)
        at, free = self._find(h)
        if at >= 0:
            return False
        if self._used >= self.limit:
            if self._live < self.limit:
                self._rebuild(None)  # room taken by discarded keys: drop those only
            if self._live >= self.limit:
                self.clear()  # full: forget everything at once
            free = self._find(h)[1]
        if self._table[free] == _EMPTY:
            self._used += 1
        self._table[free] = h
        if self._scopes is not None:
            self._scopes[free] = 0 if scope is None else digest(scope)
        self._live += 1
        return True

    def __contains__(self, key: object) -> bool:
        try:
            return self._find(digest(key))[0] >= 0
        except TypeError:  # unhashable: never remembered
            return False

    def __len__(self) -> int:
        return self._live

    def discard(self, key: K) -> None:
        """Forget `key` (it is reported again the next time)."""
        at, _ = self._find(digest(key))
        if at >= 0:
            self._table[at] = _GONE
            self._live -= 1

    def clear(self) -> None:
        """Forget every key."""
        # the old table goes before the new one is made: the memory stays at one table, also while clearing
        self._table = _NONE
        self._table = _zeros(self._slots)
        if self._scopes is not None:
            self._scopes = _NONE
            self._scopes = _zeros(self._slots)
        self._used = self._live = 0

    def retain_scopes(self, live: Iterable[Hashable]) -> None:
        """Forget the keys whose scope is not in `live` (e.g. of pods that are gone); keys remembered without
        a scope stay."""
        if self._scopes is None or self._live == 0:
            return
        keep = {digest(s) for s in live}
        keep.add(0)
        if keep.issuperset(self._scopes):  # the usual case, checked at C speed: nothing to forget
            return
        self._rebuild(keep)

    def _rebuild(self, scopes_kept: set[int] | None) -> None:
        """Re-insert the keys (of the scopes in `scopes_kept`; all when None) without discarded slots."""
        table, scopes = self._table, self._scopes
        kept = [
            (v, 0 if scopes is None else scopes[i])
            for i, v in enumerate(table)
            if v > _GONE and (scopes_kept is None or scopes is None or scopes[i] in scopes_kept)
        ]
        self.clear()
        mask = self._slots - 1
        for h, s in kept:
            i = h & mask
            while self._table[i] != _EMPTY:
                i = (i + 1) & mask
            self._table[i] = h
            if self._scopes is not None:
                self._scopes[i] = s
        self._used = self._live = len(kept)


#: what a dict entry costs besides its key and value (the slot, the index, the tuple or str headers)
ENTRY_OVERHEAD = 160


class BoundedMemo(Generic[K, V]):
    """A memo whose keys and values are sized by the data (paths, annotation texts): bounded by bytes.

    Each entry is weighed when it is put (`weight`: the bytes of its key and value, e.g. their lengths;
    `ENTRY_OVERHEAD` is added); an entry heavier than `max_entry` is not kept (it is computed every time),
    and when the entries would weigh more than `budget` the memo is emptied at once and fills again from
    what is in use. So however long and however many the keys a runtime or a pod sends, the memo holds
    about `budget` bytes at most, and no single one can take a large share of it.
    """

    __slots__ = ("_entries", "_weight", "budget", "max_entry")

    def __init__(self, budget: int, max_entry: int) -> None:
        self.budget = budget
        self.max_entry = max_entry
        self._entries: dict[K, V] = {}
        self._weight = 0

    @property
    def weight(self) -> int:
        """The bytes the entries were weighed at (overheads included)."""
        return self._weight

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value memoised for `key`, or `default`."""
        return self._entries.get(key, default)

    def put(self, key: K, value: V, weight: int) -> None:
        """Memoise `value` for `key` (a key not in the memo: callers put after a miss)."""
        weight += ENTRY_OVERHEAD
        if weight > self.max_entry:
            return
        if self._weight + weight > self.budget:
            self.clear()
        self._entries[key] = value
        self._weight += weight

    def clear(self) -> None:
        """Forget every entry."""
        self._entries = {}
        self._weight = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries


_MISSING: object = object()


class TextMemoized(Generic[V]):
    """A parser of one text (an annotation value) memoised in a BoundedMemo: the text is the key, weighed at
    `factor` bytes a character (the text, and what is parsed from it). Exceptions are not memoised (as with
    functools.lru_cache): a malformed text is parsed, and reported, again. `text_memo` makes one."""

    def __init__(self, parse: Callable[[str], V], budget: int, max_entry: int, factor: int) -> None:
        self.parse = parse
        self.factor = factor
        self.memo: BoundedMemo[str, object] = BoundedMemo(budget, max_entry)
        self.__doc__ = parse.__doc__
        self.__wrapped__ = parse

    def __call__(self, raw: str) -> V:
        hit = self.memo.get(raw, _MISSING)
        if hit is not _MISSING:
            return hit  # type: ignore[return-value]
        value = self.parse(raw)
        self.memo.put(raw, value, len(raw) * self.factor)
        return value


def text_memo(
    budget: int, max_entry: int, factor: int = 4
) -> Callable[[Callable[[str], V]], TextMemoized[V]]:
    """Decorator: memoise a `str -> V` parser within `budget` bytes (koordqos.once.TextMemoized), instead
    of functools.lru_cache's count of entries of any size."""

    def wrap(parse: Callable[[str], V]) -> TextMemoized[V]:
        return TextMemoized(parse, budget, max_entry, factor)

    return wrap
