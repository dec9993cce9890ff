"""Hostile numbers in what the agent reads from the API server (issue #39): NaN, ±Inf, negative, huge and
wrong-typed values in the NodeMetric spec, the NodeSLO, the Node's annotations and capacity, and the NRT in
the cluster. Properties: nothing raises out of a parser, planner or reporter round; what comes out is in range
and JSON an API server accepts (no NaN, no infinity); a rejected field keeps its last valid value or default;
the NRT reporter converges on what it wrote.

The JSON values come from Python's json (`NaN`, `Infinity`, integers of any size), which is what the agent's
JSON decoder hands over when a server sends them."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from koordqos.bus import EventBus
from koordqos.hooks.rules import RuleError, cpu_normalization_ratio, topology_view
from koordqos.kube.client import ClientConfig, KubeClient
from koordqos.kube.reportwriters import NodeMetricWriter, TokenBucket
from koordqos.model.lint import model_of
from koordqos.model.node import MAX_CPU_NORMALIZATION_RATIO, parse_node
from koordqos.model.nodeslo import NodeSLO
from koordqos.model.nodeslo_validate import validate_nodeslo
from koordqos.model.quantity import MAX_RESOURCE_VALUE
from koordqos.model.wirevalue import MAX_DURATION_SECONDS
from koordqos.report.batch import NodeCapacity, calculate
from koordqos.report.history import ReportHistory
from koordqos.report.nodemetric import build_status
from koordqos.report.nodemetricreporter import NodeMetricReporter
from koordqos.report.nrt import desired, modifier
from koordqos.report.policy import MEMORY_POLICIES, CollectPolicy, parse_collect_policy
from koordqos.state import NodeState
from tests.report.conftest import FakeClock, GiB, feed, snapshot
from tests.report.test_report_nrt import EXAMPLE_PODS, inputs
from tests.support.fake_apiserver import FakeAPIServer, make_nodemetric

# -- hostile JSON --------------------------------------------------------------------------------------------

HOSTILE_NUMBERS = st.one_of(
    st.sampled_from(
        [math.nan, math.inf, -math.inf, 0, -1, -(2**63), 2**63, 10**30, 10**400, 1e308, 0.5, -0.0]
    ),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | HOSTILE_NUMBERS | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
VALUES = st.one_of(HOSTILE_NUMBERS, ANY_JSON)


def clean_json(value: Any) -> str:
    """The JSON an API server accepts: raises on NaN/infinity."""
    return json.dumps(value, allow_nan=False)


# -- the NodeMetric spec: the planner ------------------------------------------------------------------------

DURATION_TEXTS = st.one_of(
    st.sampled_from(["5m", "0s", "-5m", "9" * 400 + "h", "2562048h", "1e3s", "NaN", "", "5", "5m0s"]),
    st.text(max_size=12),
)
METRIC_COLLECT_POLICY = st.fixed_dictionaries(
    {},
    optional={
        "aggregateDurationSeconds": VALUES,
        "reportIntervalSeconds": VALUES,
        "nodeAggregatePolicy": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "durations": st.one_of(st.lists(st.one_of(DURATION_TEXTS, VALUES), max_size=4), VALUES)
                },
            ),
            VALUES,
        ),
        "nodeMemoryCollectPolicy": st.one_of(st.sampled_from(MEMORY_POLICIES), VALUES),
    },
)
SPECS = st.one_of(
    st.fixed_dictionaries({"metricCollectPolicy": st.one_of(METRIC_COLLECT_POLICY, VALUES)}), VALUES
)


def assert_valid(policy: CollectPolicy) -> None:
    assert isinstance(policy.aggregate_seconds, int)
    assert isinstance(policy.report_interval_seconds, int)
    assert 60 <= policy.aggregate_seconds <= MAX_DURATION_SECONDS
    assert 30 <= policy.report_interval_seconds <= MAX_DURATION_SECONDS
    assert all(0 < d <= MAX_DURATION_SECONDS and math.isfinite(d) for d in policy.durations)
    assert policy.memory_policy in MEMORY_POLICIES
    for problem in policy.problems:
        assert problem.describe().startswith("spec.metricCollectPolicy")


LAST = CollectPolicy(120, 45, (120.0,), "usageWithPageCache")


@settings(max_examples=300, deadline=None)
@given(spec=SPECS, prior=st.booleans())
def test_any_spec_gives_a_valid_policy_a_status_and_keeps_the_last_valid_values(
    spec: Any, prior: bool
) -> None:
    last = LAST if prior else None
    policy = parse_collect_policy(spec if isinstance(spec, dict) else None, last)
    assert_valid(policy)
    raw = spec.get("metricCollectPolicy") if isinstance(spec, dict) else None
    fallback = last or CollectPolicy()
    rejected = {p.path.split("[")[0].removeprefix("spec.metricCollectPolicy.") for p in policy.problems}
    if "aggregateDurationSeconds" in rejected:
        assert policy.aggregate_seconds == fallback.aggregate_seconds
    if "reportIntervalSeconds" in rejected:
        assert policy.report_interval_seconds == fallback.report_interval_seconds
    if "nodeAggregatePolicy.durations" in rejected or "nodeAggregatePolicy" in rejected:
        assert policy.durations == fallback.durations
    if isinstance(raw, dict) and raw.get("aggregateDurationSeconds") is None:
        assert policy.aggregate_seconds == 300  # unset: the default, not the last value
    # the planner: retention follows the policy, the status is JSON an API server accepts
    clock = FakeClock()
    history = ReportHistory(1.0, clock=clock)
    history.configure(policy.node_retention, policy.pod_retention)
    feed(history, clock, 70, snapshot(1.5, 2 * GiB, {"u": (0.5, GiB)}))
    status = build_status(history, policy, [], [], 1796149800.0)
    if isinstance(status, dict):
        clean_json(status)


# -- the NodeMetric spec: the reporter against the fake API server -------------------------------------------

NODE = "hostile-node"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def api() -> AsyncIterator[tuple[FakeAPIServer, KubeClient]]:
    server = FakeAPIServer(token=None)
    await server.start()
    client = KubeClient(ClientConfig(host=server.url))
    yield server, client
    await client.close()
    await server.stop()


async def no_sleep(_: float) -> None:
    return None


@pytest.mark.asyncio(loop_scope="module")
@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(specs=st.lists(SPECS, min_size=1, max_size=3))
async def test_the_reporter_writes_a_status_after_any_spec(
    api: tuple[FakeAPIServer, KubeClient], specs: list[Any]
) -> None:
    server, client = api
    clock = FakeClock()
    writer = NodeMetricWriter(client, NODE, min_write_interval=0, sleep=no_sleep)
    writer.bucket = TokenBucket(1e6, 10**6)
    reporter = NodeMetricReporter(
        EventBus(state=NodeState()), ReportHistory(1.0, clock=clock), writer, wall=lambda: 1796149800.0
    )
    for spec in specs:
        server.upsert("nodemetrics", make_nodemetric(NODE, spec if isinstance(spec, dict) else {"x": spec}))
        feed(reporter.history, clock, 70, snapshot(1.0, GiB))
        record = await reporter.round()  # never raises
        assert record.outcome == "written", record
        assert_valid(reporter.policy)
        stored = server.get("nodemetrics", NODE)
        assert stored is not None
        clean_json(stored["status"])


# -- the NodeSLO: every integer field ------------------------------------------------------------------------


def _int_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        wire = (*prefix, info.alias or name)
        sub, is_seq = model_of(info.annotation)
        if sub is not None and not is_seq:
            out.extend(_int_fields(sub, wire))
        elif int in get_args(info.annotation) or info.annotation is int or get_origin(info.annotation) is int:
            out.append(wire)
    return out


SLO_INT_FIELDS = [
    p
    for p in _int_fields(NodeSLO)
    if p[0] in ("resourceUsedThresholdWithBE", "resourceQOSStrategy", "cpuBurstStrategy", "systemStrategy")
]


def test_the_nodeslo_has_integer_fields_to_test() -> None:
    assert ("resourceUsedThresholdWithBE", "cpuSuppressThresholdPercent") in SLO_INT_FIELDS
    assert ("resourceQOSStrategy", "beClass", "memoryQOS", "wmarkMinAdj") in SLO_INT_FIELDS
    assert len(SLO_INT_FIELDS) > 60


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.tuples(st.sampled_from(SLO_INT_FIELDS), HOSTILE_NUMBERS), min_size=1, max_size=6))
def test_hostile_numbers_in_any_nodeslo_integer_field_are_rejected_or_in_range(
    values: list[tuple[tuple[str, ...], Any]],
) -> None:
    spec: dict[str, Any] = {}
    for path, value in values:
        node = spec
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    verdict = validate_nodeslo({"kind": "NodeSLO", "spec": spec})
    applied = json.loads(clean_json(dict(verdict.overlay)))  # no NaN or infinity survives
    again = validate_nodeslo({"kind": "NodeSLO", "spec": applied})
    assert again.problems == ()
    for path, value in dict(values).items():  # the last value written to a path is the one in the spec
        bad = (isinstance(value, float) and (not math.isfinite(value) or not value.is_integer())) or not -(
            2**63
        ) <= value < 2**63
        if bad:
            assert any(p.path == "spec." + ".".join(path) for p in verdict.problems), (path, value)


# -- the Node: annotations and capacity, the batch formula and the hook rules --------------------------------

RATIO_TEXTS = st.one_of(
    st.sampled_from(
        ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "1e-400", "0", "-1", "5", "5.0001", "1.2"]
    ),
    st.floats().map(repr),
    st.text(max_size=10),
)
QUANTITIES = st.one_of(
    st.sampled_from(["-4", "9223372036854775807", "9223372036854775808", "1e400", "NaN", "8Ei", "16", "1Gi"]),
    HOSTILE_NUMBERS,
    st.text(max_size=8),
)
RESERVATION = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "resources": st.one_of(st.dictionaries(st.sampled_from(["cpu", "memory"]), QUANTITIES), VALUES),
            "reservedCPUs": st.one_of(
                st.sampled_from(["0", "0-65535", "65536", "0-3,1000000000-1000065535", "-1", "3-1"]),
                VALUES,
            ),
        },
    ),
    VALUES,
).map(json.dumps)
POOLS = st.lists(
    st.fixed_dictionaries({}, optional={"socket": VALUES, "node": VALUES, "cpuset": st.text(max_size=8)}),
    max_size=3,
).map(json.dumps)
STATUS = {
    "nodeMetric": {
        "nodeUsage": {"resources": {"cpu": "4", "memory": "8Gi"}},
        "systemUsage": {"resources": {"cpu": "1", "memory": "1Gi"}},
    },
    "podsMetric": [],
}


@settings(max_examples=300, deadline=None)
@given(
    ratio=RATIO_TEXTS,
    reservation=RESERVATION,
    pools=POOLS,
    capacity=st.dictionaries(st.sampled_from(["cpu", "memory", "pods"]), QUANTITIES, max_size=3),
)
def test_hostile_node_numbers_never_reach_the_batch_formula_or_the_hooks(
    ratio: str, reservation: str, pools: str, capacity: dict[str, Any]
) -> None:
    annotations = {
        "node.koordinator.sh/cpu-normalization-ratio": ratio,
        "node.koordinator.sh/reservation": reservation,
        "node.koordinator.sh/cpu-shared-pools": pools,
    }
    node = parse_node(
        {
            "metadata": {"name": "n", "annotations": annotations},
            "status": {"capacity": capacity, "allocatable": capacity},
        }
    )
    r = node.cpu_normalization_ratio
    assert r is None or (math.isfinite(r) and 0 < r <= MAX_CPU_NORMALIZATION_RATIO)
    for values in (node.capacity, node.allocatable, node.reserved()):
        assert all(isinstance(v, int) and 0 <= v <= MAX_RESOURCE_VALUE for v in values.values())
    res = node.reservation
    if res is not None:
        assert all(0 <= v <= MAX_RESOURCE_VALUE for v in res.resources.values())
        assert all(0 <= c <= 65535 for c in res.reserved_cpus)
    result = calculate(NodeCapacity(node.capacity, node.allocatable, node.reserved(), r), [], STATUS)
    assert 0 <= result.batch_cpu <= MAX_RESOURCE_VALUE * MAX_CPU_NORMALIZATION_RATIO
    assert 0 <= result.batch_memory <= MAX_RESOURCE_VALUE
    try:
        hook_ratio = cpu_normalization_ratio(node)
    except RuleError:
        pass  # the rule keeps its last valid value
    else:
        assert hook_ratio == -1.0 or (
            math.isfinite(hook_ratio) and 0 < hook_ratio <= MAX_CPU_NORMALIZATION_RATIO
        )
    try:
        view = topology_view(annotations)
    except RuleError:
        pass
    else:
        assert all(0 <= p.socket < 2**31 and 0 <= p.node < 2**31 for p in view.share_pools)


# -- the NRT in the cluster: the read-modify-write converges -------------------------------------------------

RESOURCE = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(["cpu", "memory", "vendor.example/gpu"]), VALUES)},
    optional={"capacity": QUANTITIES, "allocatable": QUANTITIES, "available": QUANTITIES},
)
ZONE = st.one_of(
    st.fixed_dictionaries(
        {"name": st.one_of(st.sampled_from(["node-0", "node-1", "node-9"]), VALUES)},
        optional={
            "type": VALUES,
            "resources": st.one_of(st.lists(st.one_of(RESOURCE, VALUES), max_size=3), VALUES),
        },
    ),
    VALUES,
)
NRT = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.one_of(
            st.fixed_dictionaries(
                {"name": st.just("node-a")},
                optional={
                    "annotations": st.one_of(
                        st.dictionaries(
                            st.one_of(
                                st.sampled_from(["node.koordinator.sh/cpu-shared-pools", "x"]),
                                st.text(max_size=6),
                            ),
                            VALUES,
                            max_size=3,
                        ),
                        VALUES,
                    ),
                    "labels": st.one_of(st.dictionaries(st.text(max_size=6), VALUES, max_size=2), VALUES),
                    "resourceVersion": st.just("7"),
                    "generation": VALUES,
                },
            ),
            VALUES,
        ),
        "topologyPolicies": VALUES,
        "zones": st.one_of(st.lists(ZONE, max_size=4), VALUES),
        "attributes": VALUES,
    },
)


@pytest.fixture
def want(tmp_path: Path) -> Any:
    return desired(inputs(tmp_path, EXAMPLE_PODS))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(current=NRT)
def test_any_nrt_in_the_cluster_is_rewritten_clean_and_then_left_alone(
    want: Any, current: dict[str, Any]
) -> None:
    problems: list[Any] = []
    modify = modifier(want, "node-a", "4d1c", problems)
    body = modify(current)  # never raises
    if body is None:
        assert problems == []
        return
    stored = json.loads(clean_json(body))  # an API server accepts it
    again: list[Any] = []
    assert modifier(want, "node-a", "4d1c", again)(stored) is None  # converged: nothing more to write
    assert again == []
    for key, value in want.annotations.items():
        assert stored["metadata"]["annotations"][key] == value
