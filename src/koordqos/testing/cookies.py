"""FakeCookieKernel: core-scheduling cookies per PID in memory, for tests without prctl."""

from __future__ import annotations

from collections.abc import Sequence


class FakeCookieKernel:
    """Cookies per PID; `broken` PIDs fail every operation; new cookies count from `next_cookie`."""

    def __init__(
        self,
        cookies: dict[int, int] | None = None,
        broken: set[int] | None = None,
        next_cookie: int = 1000000,
    ) -> None:
        self.cookies = {} if cookies is None else cookies
        self.broken = set() if broken is None else broken
        self.next_cookie = next_cookie

    def _check(self, pid: int) -> None:
        if pid in self.broken:
            raise OSError(3, "no such process")

    def get(self, pid: int) -> int:
        """The cookie of `pid` (0 = none)."""
        self._check(pid)
        return self.cookies.get(pid, 0)

    def create(self, pid: int) -> int:
        """A new cookie on `pid`."""
        self._check(pid)
        self.cookies[pid] = self.next_cookie
        self.next_cookie += 1
        return self.cookies[pid]

    def assign(self, from_pid: int, pids: Sequence[int]) -> list[int]:
        """Copy `from_pid`'s cookie to `pids`; the broken ones fail."""
        cookie = self.get(from_pid)
        failed = []
        for pid in pids:
            if pid in self.broken:
                failed.append(pid)
            else:
                self.cookies[pid] = cookie
        return failed

    def clear(self, pids: Sequence[int]) -> list[int]:
        """Reset the cookie of `pids`; the broken ones fail."""
        failed = []
        for pid in pids:
            if pid in self.broken:
                failed.append(pid)
            else:
                self.cookies[pid] = 0
        return failed
