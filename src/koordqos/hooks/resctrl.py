"""Resctrl (docs/behaviour-runtime-hooks.md, "Resctrl hook"; gate `Resctrl`): a pod with
`node.koordinator.sh/resctrl` starts its containers in its own resctrl group `koordlet-<pod uid>`.

PreCreateContainer puts the group into the NRI adjustment (`linux.resources.rdt_class`), so the runtime
starts the container's first process there. The group itself (mkdir, schemata from the annotation), the
threads started later and the removal of groups of pods that lost the annotation are the ResctrlReconcile
round's (strategies/resctrl.py, within one reconcile interval).
Project decision: the class is only set once the group exists. runc refuses to start a container whose
closid names a missing group, and a container start must never fail because of QoS; until the group is
there, the reconcile round moves the container's threads into it.
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.hooks.context import ContainerContext, Stage
from koordqos.hooks.framework import HookFn, HookPlugin, HookSpec
from koordqos.model.keys import ANNOTATION_RESCTRL
from koordqos.model.resctrl import parse_pod_resctrl, pod_group
from koordqos.once import SeenOnce

log = structlog.get_logger("koordqos.hooks.resctrl")

NAME = "Resctrl"
GATE = "Resctrl"

SKIPPED = Counter(
    "koordqos_hooks_resctrl_skipped_total",
    "Containers of annotated pods started without their resctrl class, by reason",
    ["reason"],
    registry=obs.REGISTRY,
)


class Resctrl(HookPlugin):
    """The hook plugin (PreCreateContainer only)."""

    name = NAME
    gate = GATE

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._reported: SeenOnce[tuple[str, str]] = SeenOnce(4096)

    def stage_hooks(self) -> dict[Stage, tuple[str, HookFn]]:
        """Stage → (description, fn)."""
        return {Stage.PRE_CREATE_CONTAINER: ("set the pod's resctrl class", self.set_rdt_class)}

    def set_rdt_class(self, ctx: ContainerContext | None) -> None:
        """`koordlet-<uid>` into the response when the pod asks for it and its group exists."""
        if ctx is None:
            raise ValueError("nil container context")
        req = ctx.request
        raw = (req.pod_annotations or {}).get(ANNOTATION_RESCTRL)
        if raw is None or req.sandbox or self.root is None:
            return
        try:
            parse_pod_resctrl(raw)
        except Exception as exc:  # ModelError; reported by the reconcile round as well
            SKIPPED.labels("bad-annotation").inc()
            if self._reported.first((req.pod_uid, "bad")):
                log.warning("ignoring malformed resctrl annotation", pod_uid=req.pod_uid, error=str(exc))
            return
        group = pod_group(req.pod_uid)
        try:
            exists = os.path.isdir(self.root / group) and not os.path.islink(self.root / group)
        except ValueError:  # a uid with a NUL byte
            exists = False
        if not exists:
            SKIPPED.labels("group-not-ready").inc()
            return
        ctx.response.rdt_class = group


HOOK: HookSpec[Resctrl] = HookSpec(NAME, GATE, lambda opts: Resctrl(opts.resctrl_root))
