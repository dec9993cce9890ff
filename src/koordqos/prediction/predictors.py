"""The Prod-reclaimable predictors (docs/prediction.md, "Pod-based predictor" and the next two): pod-based,
priority-based, and their min-combination, whose result is `prodReclaimableMetric` and whose peak is
`prodPeakMetric`.

Both predictors take only pods of class koord-prod or none (""). They read p95 for CPU and p98 for memory
and scale by (100 + safety margin)/100, truncated: the pod predictor per pod, the priority predictor once on
the sum (sys + prod + none). Values are milli-cores and bytes, keyed `cpu` / `memory`. Pure: predictions
come from a lookup, the wall-clock time is an argument.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from koordqos.model import jsontext
from koordqos.model.node import NodeInfo
from koordqos.model.pod import PodInfo
from koordqos.model.quantity import parse_resource_list
from koordqos.prediction.model import SYS_UID, Prediction, PredictionParams, class_uid

RAW_ALLOCATABLE = "node.koordinator.sh/raw-allocatable"
RESOURCES = ("cpu", "memory")
#: the classes both predictors accept, in koordlet's order
ACCEPTED_CLASSES = ("koord-prod", "")

Resources = dict[str, int]
Lookup = Callable[[str], Prediction | None]
"""A model's prediction by UID; None: no model (the lookup fails)."""


class PredictError(Exception):
    """A predictor cannot answer (no model, no node allocatable, a pod given twice)."""


def zero() -> Resources:
    """`{"cpu": 0, "memory": 0}`."""
    return dict.fromkeys(RESOURCES, 0)


def scale(value: int, margin_percent: int) -> int:
    """`trunc(float(value) · (100 + margin)/100)`: 1035 at 10 % is 1138 (docs/prediction.md, "Reading a
    model")."""
    return int(float(value) * (float(100 + margin_percent) / 100.0))


def pod_request(pod: PodInfo) -> Resources:
    """The effective pod request (Kubernetes `PodRequests`: containers, init containers, sidecars) of cpu
    (milli) and memory (bytes); a missing resource is 0. Pod overhead is not in the agent's pod view."""
    return {r: pod.kube_request(r) for r in RESOURCES}


def node_allocatable(node: NodeInfo | None) -> Resources:
    """The `node.koordinator.sh/raw-allocatable` annotation (pre-amplification) when present and valid,
    else `status.allocatable`; PredictError without a node or an allocatable."""
    if node is None:
        raise PredictError("node not known")
    raw = node.annotations.get(RAW_ALLOCATABLE)
    if raw is not None:
        try:
            doc = jsontext.loads(raw)
        except ValueError:
            doc = None
        if isinstance(doc, Mapping):
            values, errors = parse_resource_list(doc)
            if not errors:
                return {r: values.get(r, 0) for r in RESOURCES}
    if not node.allocatable:
        raise PredictError("node has no allocatable resources")
    return {r: node.allocatable.get(r, 0) for r in RESOURCES}


def _created(pod: PodInfo) -> float | None:
    text = pod.creation_timestamp
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def in_cold_start(pod: PodInfo, wall_now: float, cold_start_seconds: float) -> bool:
    """The pod is at most `cold_start_seconds` old (equality counts); no creation time: not cold (Go's zero
    time is long ago)."""
    created = _created(pod)
    return created is not None and wall_now - created <= cold_start_seconds


def _gone(pod: PodInfo) -> bool:
    return pod.deleting or pod.terminated


def _accepted(pod: PodInfo) -> bool:
    return pod.priority_class.value in ACCEPTED_CLASSES


def _capped(alloc: Resources, unreclaimable: Resources, reclaimable: Resources) -> Resources:
    return {r: min(max(alloc[r] - unreclaimable[r], 0), reclaimable[r]) for r in RESOURCES}


class PodPredictor:
    """Pod-based predictor (docs/prediction.md): per pod, peak = p95 CPU / p98 memory × margin; reclaimable
    sums the positive request − peak."""

    def __init__(self, lookup: Lookup, params: PredictionParams, wall_now: float) -> None:
        self.lookup = lookup
        self.params = params
        self.wall_now = wall_now
        self.reclaimable = zero()
        self.unreclaimable = zero()
        self.unpredicted = zero()
        self._added: set[str] = set()

    def add_pod(self, pod: PodInfo) -> None:
        """Count one pod (PredictError: given twice, or no prediction — its request then counts as peak)."""
        if not _accepted(pod):
            return
        if pod.uid in self._added:
            raise PredictError(f"pod {pod.key} added twice")
        self._added.add(pod.uid)
        request = pod_request(pod)
        if in_cold_start(pod, self.wall_now, self.params.cold_start_seconds):
            for r in RESOURCES:
                self.unpredicted[r] += request[r]
            return
        if _gone(pod):
            return
        prediction = self.lookup(pod.uid)
        if prediction is None:
            for r in RESOURCES:
                self.unpredicted[r] += request[r]
            raise PredictError(f"no prediction for pod {pod.key}")
        margin = self.params.safety_margin_percent
        peak = {
            "cpu": scale(prediction["p95"].cpu_milli, margin),
            "memory": scale(prediction["p98"].memory, margin),
        }
        for r in RESOURCES:
            self.unreclaimable[r] += peak[r]
            d = request[r] - peak[r]
            if d > 0:
                self.reclaimable[r] += d

    def result(self, node: NodeInfo | None) -> Resources:
        """min(max(allocatable − Σ peaks, 0), Σ reclaimable) per resource (no system part)."""
        return _capped(node_allocatable(node), self.unreclaimable, self.reclaimable)

    def peak(self) -> Resources:
        """Σ peaks + the requests of cold and unpredicted pods."""
        return {r: self.unreclaimable[r] + self.unpredicted[r] for r in RESOURCES}


class PriorityPredictor:
    """Priority-based predictor (docs/prediction.md): unReclaimable = (sys + the accepted classes' models) ×
    margin, once; reclaimable = Σ requests of the accepted, live pods − unReclaimable."""

    def __init__(self, lookup: Lookup, params: PredictionParams) -> None:
        self.lookup = lookup
        self.params = params
        self.reclaim_request = zero()

    def add_pod(self, pod: PodInfo) -> None:
        """Count a pod's request (no cold-start check: its usage is in the class model already)."""
        if not _accepted(pod) or _gone(pod):
            return
        request = pod_request(pod)
        for r in RESOURCES:
            self.reclaim_request[r] += request[r]

    def unreclaimable(self) -> Resources:
        """sys p95/p98 plus koord-prod's and none's, scaled once; PredictError when a model is missing."""
        raw = zero()
        for uid in (SYS_UID, *(class_uid(c) for c in ACCEPTED_CLASSES)):
            prediction = self.lookup(uid)
            if prediction is None:
                raise PredictError(f"no prediction for {uid}")
            raw["cpu"] += prediction["p95"].cpu_milli
            raw["memory"] += prediction["p98"].memory
        margin = self.params.safety_margin_percent
        return {r: scale(raw[r], margin) for r in RESOURCES}

    def result(self, node: NodeInfo | None) -> Resources:
        """min(max(allocatable − unReclaimable, 0), max(Σ request − unReclaimable, 0))."""
        unrec = self.unreclaimable()
        reclaimable = {r: max(self.reclaim_request[r] - unrec[r], 0) for r in RESOURCES}
        return _capped(node_allocatable(node), unrec, reclaimable)

    def peak(self) -> Resources:
        """unReclaimable."""
        return self.unreclaimable()


@dataclass(frozen=True, slots=True)
class ProdPrediction:
    """`prodReclaimableMetric` (result) and `prodPeakMetric` (peak), milli-cores and bytes."""

    reclaimable: Resources
    peak: Resources


class MinPredictor:
    """Min predictor (docs/prediction.md): each pod to the pod predictor, then the priority predictor,
    stopping at the first error; the result is the per-resource min, the peak the max."""

    def __init__(self, lookup: Lookup, params: PredictionParams, wall_now: float) -> None:
        self.pods = PodPredictor(lookup, params, wall_now)
        self.priority = PriorityPredictor(lookup, params)

    def add_pod(self, pod: PodInfo) -> None:
        """PredictError from the pod predictor: the priority predictor does not see this pod."""
        self.pods.add_pod(pod)
        self.priority.add_pod(pod)

    def result(self, node: NodeInfo | None) -> Resources:
        """Per-resource min of both results (PredictError when either fails)."""
        a, b = self.pods.result(node), self.priority.result(node)
        return {r: min(a[r], b[r]) for r in RESOURCES}

    def peak(self) -> Resources:
        """Per-resource max of both peaks (PredictError when either fails)."""
        a, b = self.pods.peak(), self.priority.peak()
        return {r: max(a[r], b[r]) for r in RESOURCES}

    def predict(self, node: NodeInfo | None) -> ProdPrediction:
        """Result and peak (PredictError when either predictor fails)."""
        return ProdPrediction(self.result(node), self.peak())
