"""cyclic_garbage finds what a piece of code leaves in reference cycles; detached exceptions leave none."""

from __future__ import annotations

import gc

from koordqos.errors import CgroupError, detached
from koordqos.testing.cycles import cyclic_garbage, names


class Node:
    def __init__(self) -> None:
        self.other: object = None


def test_a_cycle_made_and_dropped_is_found_and_plain_garbage_is_not() -> None:
    def cycle() -> None:
        a = Node()
        a.other = a

    def plain() -> None:
        Node().other = [1, 2, 3]

    assert "Node" in names(cyclic_garbage(cycle))
    assert cyclic_garbage(plain) == []
    assert gc.isenabled()  # restored


def _raise() -> None:
    raise CgroupError("no such dir")


class Holder:
    """Keeps the last error, as a memo of refused paths does."""

    error: BaseException | None = None

    def check(self, detach: bool) -> None:
        try:
            _raise()
        except CgroupError as exc:
            self.error = detached(exc) if detach else exc


def test_an_exception_kept_after_its_except_block_holds_its_frames_unless_detached() -> None:
    # the traceback reaches check's frame, whose `self` keeps the exception: a cycle
    whole = cyclic_garbage(lambda: Holder().check(detach=False))
    assert {"Holder", "traceback", "frame"} <= names(whole)
    assert cyclic_garbage(lambda: Holder().check(detach=True)) == []
    error = detached(CgroupError("x"))
    assert error.__traceback__ is None
    assert error.__context__ is None
    assert str(error) == "x"
