"""Hook registry: the hook modules, one line each.

Adding a hook is one new module (its plugin class and `HOOK = HookSpec(...)`) plus one line here. Stage hooks
run in name order whatever the order here; reconcilers run in this order at each level.
"""

from __future__ import annotations

from koordqos.hooks import (
    batchresource,
    coresched,
    cpunormalization,
    cpuset,
    gpu,
    groupidentity,
    oomscoreadj,
    rdma,
    resctrl,
)
from koordqos.hooks.framework import HookPlugin, HookSpec

HOOKS: tuple[HookSpec[HookPlugin], ...] = (
    batchresource.HOOK,
    cpuset.HOOK,
    cpunormalization.HOOK,
    groupidentity.HOOK,
    coresched.HOOK,
    oomscoreadj.HOOK,
    resctrl.HOOK,
    gpu.HOOK,
    rdma.HOOK,
)
