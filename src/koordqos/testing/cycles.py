"""What a piece of code leaves behind as reference cycles: the garbage only a full collection frees.

The agent's GC policy freezes long-lived objects (`process.gcpolicy.GcPolicy`); a frozen object that later
becomes part of an unreachable cycle is never collected. Code on the agent's long-running paths must
therefore drop what it keeps without cycles (an exception kept with its traceback, a session whose handler
table holds its own bound methods). Tests use `cyclic_garbage` to show it does.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any


def cyclic_garbage(run: Callable[[], Any]) -> list[object]:
    """Run `run` with the collector off and return the objects that then only a collection could free
    (what `run` made and dropped in reference cycles); garbage from before is collected first."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        run()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            found = list(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    finally:
        if was_enabled:
            gc.enable()
    return found


def names(objects: list[object]) -> set[str]:
    """The type names of `objects`, for assertion messages."""
    return {type(o).__qualname__ for o in objects}
