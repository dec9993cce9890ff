"""Answer: what serving one ttrpc request gives the connection, owned by that call.

The reply is there at once (`reply`) or comes later (`later`, a coroutine giving it, which the connection
runs on a task); either way the connection writes it and then runs what the call left for after its reply
(`then`: bookkeeping, state events), so the reply never waits for that work. The reply is the serialized
Response envelope when the connection gets the Answer; the session's method handlers fill in the reply's
payload first, and the session wraps it.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["After", "Answer"]

After = list[tuple[Callable[..., object], tuple[Any, ...]]]


class Answer:
    """One call's reply, now (`reply`) or later (`later`), and the work that runs once it is written."""

    __slots__ = ("after", "later", "reply")

    def __init__(
        self, reply: bytes = b"", later: Coroutine[Any, Any, bytes] | None = None, after: After | None = None
    ) -> None:
        self.reply = reply
        # when set, the reply is what this gives (`reply` is then unused); taken by whoever runs it
        self.later = later
        # (fn, args) to call, in order, once the reply is written or dropped; shared with an Answer that
        # serves a call nested in this one (a container event carried by a StateChange)
        self.after: After = [] if after is None else after

    def then(self, fn: Callable[..., object], *args: Any) -> None:
        """Call `fn(*args)` once the reply is written (or dropped: the peer is gone)."""
        self.after.append((fn, args))

    def replied(self) -> None:
        """The reply is written: run what was left for after it, once, in order (an exception stops the rest
        and is the caller's to log)."""
        after = self.after
        if after:
            self.after = []
            for fn, args in after:
                fn(*args)
