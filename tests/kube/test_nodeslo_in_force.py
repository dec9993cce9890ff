"""Issue #32 part 5d end to end: the agent (cgroups, metrics, kube, strategies) against the fake API server
and a synthetic node. A NodeSLO value `config validate` rejects is not in force: `cpuSuppressThresholdPercent:
150` leaves koordlet's default (65 %) or the last valid value on the BE quota, counted and logged once each
time it appears."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from koordqos import observability as obs
from koordqos.model.pod import parse_pod
from koordqos.testing.nodefs import GiB, SyntheticNode
from koordqos.testing.poll import wait_until
from tests.strategies.test_agent_integration import (
    CPUS,
    NODE,
    CounterDriver,
    Rates,
    quota,
    rounds,
    running_agent,
    server,
)
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodeslo, make_pod

__all__ = ["server"]  # the fixture, imported for the tests below

FIELD = "spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent"


def slo(threshold: Any) -> dict[str, Any]:
    return {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "cpuSuppressPolicy": "cfsQuota",
            "cpuSuppressThresholdPercent": threshold,
        }
    }


def rejected() -> float:
    return obs.REGISTRY.get_sample_value("koordqos_nodeslo_invalid_fields_total", {"source": "api"}) or 0.0


def errors() -> float:
    labels = {"component": "nodeslo", "kind": "invalid-field"}
    return obs.REGISTRY.get_sample_value("koordqos_errors_total", labels) or 0.0


def near(node: SyntheticNode, cores: float) -> bool:
    return abs(quota(node) - int(cores * 100_000)) <= 30_000


def ls_be_node(tmp_path: Path, server: FakeAPIServer) -> tuple[SyntheticNode, Rates]:
    node = SyntheticNode(tmp_path / "node", cpus=CPUS, memory_total=64 * GiB)
    ls = make_pod("ls", NODE, qos="LS", uid="uid-ls", requests={"cpu": "4"}, limits={"cpu": "8"})
    be = make_pod("be", NODE, qos="BE", uid="uid-be")
    ls_dir, be_dir = node.add_pod(parse_pod(ls)), node.add_pod(parse_pod(be))
    server.upsert("nodes", make_node(NODE, cpu=str(CPUS), memory="64Gi"))
    server.upsert("pods", ls)
    server.upsert("pods", be)
    return node, Rates({ls_dir: 2.0, be_dir: 1.0})


async def test_an_out_of_range_threshold_leaves_the_default_in_force_and_is_counted(
    tmp_path: Path, server: FakeAPIServer
) -> None:
    node, rates = ls_be_node(tmp_path, server)
    server.upsert("nodeslos", make_nodeslo(NODE, slo(150)))
    before, errors_before = rejected(), errors()
    async with running_agent(tmp_path, server, CounterDriver(node, rates)) as agent:
        # the default 65 %: 16 × 0.65 − 2 (LS) = 8.4 cores; 150 % would leave BE 22 cores (the whole node)
        await wait_until(lambda: near(node, 8.4), timeout=10, message="quota ≈ 8.4 cores (65 %)")
        start = rounds(agent)
        await wait_until(lambda: rounds(agent) >= start + 5, timeout=10, message="more rounds")
        assert near(node, 8.4), quota(node)
        source = agent.parts.nodeslo_source
        assert source is not None
        assert source.last_error == f"{FIELD}: out of range: 150 (valid: [0, 100])"
        assert rejected() == before + 1
        assert errors() == errors_before + 1
        events = [e for e in server.events if e["reason"] == "InvalidNodeSLO"]
        assert len(events) == 1
        assert f"{FIELD}: out of range: 150" in events[0]["message"]


async def test_after_a_valid_value_an_invalid_one_keeps_it(tmp_path: Path, server: FakeAPIServer) -> None:
    node, rates = ls_be_node(tmp_path, server)
    server.upsert("nodeslos", make_nodeslo(NODE, slo(60)))
    before = rejected()
    async with running_agent(tmp_path, server, CounterDriver(node, rates)) as agent:
        # 60 %: 16 × 0.6 − 2 = 7.6 cores
        await wait_until(lambda: near(node, 7.6), timeout=10, message="quota ≈ 7.6 cores (60 %)")
        source = agent.parts.nodeslo_source
        assert source is not None
        server.upsert("nodeslos", make_nodeslo(NODE, slo(150)))
        await wait_until(lambda: "150" in source.last_error, timeout=10, message="150 rejected")
        start = rounds(agent)
        await wait_until(lambda: rounds(agent) >= start + 5, timeout=10, message="more rounds")
        assert near(node, 7.6), quota(node)  # the last valid value, not the default (8.4) nor 150 %
        assert rejected() == before + 1

        # good input converges; the same bad value again is a new rejection, counted again
        server.upsert("nodeslos", make_nodeslo(NODE, slo(50)))  # 16 × 0.5 − 2 = 6 cores
        await wait_until(lambda: near(node, 6.0), timeout=10, message="quota ≈ 6 cores (50 %)")
        assert source.last_error == ""
        server.upsert("nodeslos", make_nodeslo(NODE, slo(150)))
        await wait_until(lambda: rejected() == before + 2, timeout=10, message="150 counted again")
        start = rounds(agent)
        await wait_until(lambda: rounds(agent) >= start + 5, timeout=10, message="more rounds")
        assert near(node, 6.0), quota(node)
