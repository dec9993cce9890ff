"""OOMScoreAdj: per-container oom_score_adj from pod annotations (docs/behaviour-runtime-hooks.md,
"OOMScoreAdj").

koordlet applies it only through the reconciler (per-PID writes). Project extension: the value is also
put into the NRI CreateContainer adjustment, so the container's first process starts with it.
Removing the annotation does not revert processes (the original values are not recorded).
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.hooks.context import ContainerContext, ContainerRequest, Stage
from koordqos.hooks.framework import HookFn, HookPlugin, HookSpec
from koordqos.model import jsontext
from koordqos.once import SeenOnce

log = structlog.get_logger("koordqos.hooks.oomscoreadj")

NAME = "OOMScoreAdj"
GATE = "OOMScoreAdj"
ANNOTATION_OOM_SCORE_ADJ = "koordinator.sh/oom-score-adj"
ANNOTATION_OOM_SCORE_ADJ_SPEC = "koordinator.sh/oom-score-adj-spec"
MIN_OOM_SCORE_ADJ = -1000
MAX_OOM_SCORE_ADJ = 1000
MAX_REPORTED = 4096  # (pod, annotation) pairs remembered for log-once; forgotten all at once beyond this

BAD_ANNOTATIONS = Counter(
    "koordqos_hooks_oom_score_adj_bad_annotation_total",
    "Containers whose oom-score-adj annotation was ignored (every evaluation), by reason",
    ["reason"],
    registry=obs.REGISTRY,
)


def target_oom_score_adj(annotations: Mapping[str, str] | None, container: str) -> int | None:
    """The container's wanted value; None for no intervention; ValueError on malformed annotations."""
    if annotations is None:
        return None
    spec = annotations.get(ANNOTATION_OOM_SCORE_ADJ_SPEC, "")
    if spec:
        try:
            doc = jsontext.loads(spec)
        except ValueError:
            raise ValueError(f"{ANNOTATION_OOM_SCORE_ADJ_SPEC}: invalid JSON {spec[:64]!r}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{ANNOTATION_OOM_SCORE_ADJ_SPEC}: expected an object")
        if container in doc:
            value = doc[container]
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{ANNOTATION_OOM_SCORE_ADJ_SPEC}: {container}: not an integer")
            return value
    pod = annotations.get(ANNOTATION_OOM_SCORE_ADJ, "")
    if pod:
        try:
            return int(pod)
        except ValueError:
            raise ValueError(f"{ANNOTATION_OOM_SCORE_ADJ}: not an integer: {pod!r}") from None
    return None


def in_range(value: int) -> bool:
    """Whether `value` is a valid oom_score_adj."""
    return MIN_OOM_SCORE_ADJ <= value <= MAX_OOM_SCORE_ADJ


class OOMScoreAdj(HookPlugin):
    """The hook plugin (no rule)."""

    name = NAME
    gate = GATE

    def __init__(self) -> None:
        # (pod uid, annotation values) already logged: the reconciler re-evaluates every pass
        self._reported: SeenOnce[tuple[str, str, str]] = SeenOnce(MAX_REPORTED)

    def stage_hooks(self) -> dict[Stage, tuple[str, HookFn]]:
        """Stage → (description, fn)."""
        return {Stage.PRE_CREATE_CONTAINER: ("set container oom_score_adj", self.set_container_oom_score_adj)}

    def _first_report(self, req: ContainerRequest) -> bool:
        annotations = req.pod_annotations or {}
        key = (
            req.pod_uid,
            annotations.get(ANNOTATION_OOM_SCORE_ADJ, ""),
            annotations.get(ANNOTATION_OOM_SCORE_ADJ_SPEC, ""),
        )
        return self._reported.first(key)

    def target(self, ctx: ContainerContext) -> int | None:
        """Wanted value for the container; None for sandboxes, absent/malformed/out-of-range annotations."""
        req = ctx.request
        if req.sandbox:
            return None
        try:
            value = target_oom_score_adj(req.pod_annotations, req.container_name)
        except ValueError as exc:
            BAD_ANNOTATIONS.labels("malformed").inc()
            if self._first_report(req):
                obs.ERRORS.labels("hooks.oomscoreadj", "bad_annotation").inc()
                log.warning(
                    "ignoring malformed oom-score-adj annotation",
                    pod=f"{req.pod_namespace}/{req.pod_name}",
                    pod_uid=req.pod_uid,
                    container=req.container_name,
                    error=str(exc),
                )
            return None
        if value is None:
            return None
        if not in_range(value):
            BAD_ANNOTATIONS.labels("out_of_range").inc()
            if self._first_report(req):
                obs.ERRORS.labels("hooks.oomscoreadj", "bad_annotation").inc()
                log.warning(
                    "oom-score-adj out of range; ignored",
                    pod=f"{req.pod_namespace}/{req.pod_name}",
                    pod_uid=req.pod_uid,
                    container=req.container_name,
                    value=value,
                )
            return None
        return value

    def set_container_oom_score_adj(self, ctx: ContainerContext | None) -> None:
        """Put the wanted value into the response (NRI adjustment)."""
        if ctx is None:
            raise ValueError("nil container context")
        value = self.target(ctx)
        if value is not None:
            ctx.response.oom_score_adj = value


HOOK: HookSpec[OOMScoreAdj] = HookSpec(NAME, GATE, lambda opts: OOMScoreAdj())
