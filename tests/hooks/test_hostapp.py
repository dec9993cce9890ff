"""NodeSLO host applications through the reconciler (docs/behaviour-runtime-hooks.md, "Host applications";
koordlet's cases G10, S20 end to end)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from koordqos.bus import EventBus
from koordqos.cgroups.executor import CgroupExecutor, Outcome
from koordqos.cgroups.layout import PATH_REFUSED
from koordqos.events.types import NodeSLOUpdated, NodeUpdated
from koordqos.hooks.hostapps import host_app_cgroup_path
from koordqos.hooks.reconcile_plan import RECONCILE_ERRORS
from koordqos.hooks.reconciler import HookReconciler
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import HostApplicationSpec, parse_nodeslo
from koordqos.state import NodeState, reduce
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until

from .conftest import make_node, make_reconciler

POOLS = json.dumps([{"socket": 0, "node": 0, "cpuset": "0-1"}, {"socket": 1, "node": 1, "cpuset": "3"}])
POOLS_NODE = NodeInfo(name="n", annotations={"node.koordinator.sh/cpu-shared-pools": POOLS})
LS_DIR = "host-latency-sensitive/nginx"


def gi_slo(apps: list[dict[str, Any]], lsr: int = 2, ls: int = 2, be: int = -1) -> dict[str, Any]:
    return {
        "resourceQOSStrategy": {
            "lsrClass": {"cpuQOS": {"enable": True, "groupIdentity": lsr}},
            "lsClass": {"cpuQOS": {"enable": True, "groupIdentity": ls}},
            "beClass": {"cpuQOS": {"enable": True, "groupIdentity": be}},
        },
        "hostApplications": apps,
    }


def app(
    name: str, qos: str, base: str = "CgroupRoot", parent: str = "", rel: str | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "qos": qos,
        "cgroupPath": {"base": base, "parentDir": parent, "relativePath": name if rel is None else rel},
    }


def state(*events: object) -> NodeState:
    s = NodeState()
    for e in events:
        s = reduce(s, e)  # type: ignore[arg-type]
    return s


def bvt(node: SyntheticNode, rel: str) -> str:
    return node.read(rel, "cpu", "cpu.bvt_warp_ns")


def cpus(node: SyntheticNode, rel: str) -> str:
    return node.read(rel, "cpuset", "cpuset.cpus")


async def test_ls_app_gets_bvt_and_share_pools_none_app_gets_bvt_zero(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.make_cgroup(LS_DIR)
    node.make_cgroup("kubepods/besteffort/agent")
    node.write("kubepods/besteffort/agent", "cpu", "cpu.bvt_warp_ns", 2)  # so that 0 is a change
    apps = [
        app("nginx", "LS", parent="host-latency-sensitive"),
        app("agent", "", base="KubepodsBesteffort"),
    ]
    rec = make_reconciler(node)
    result = await rec.reconcile(state(NodeUpdated(POOLS_NODE), NodeSLOUpdated(parse_nodeslo(gi_slo(apps)))))
    assert result.host_apps == {"nginx": LS_DIR, "agent": "kubepods/besteffort/agent"}
    assert (bvt(node, LS_DIR), cpus(node, LS_DIR)) == ("2", "0-1,3")
    assert bvt(node, "kubepods/besteffort/agent") == "0"
    # only LS host apps get a cpuset (S20): the QoS-None app's cpuset is refused, its dir's cpuset untouched
    assert "only LS is supported" in result.errors["hostapp/agent/CPUSetAllocator/cpuset.cpus"]
    assert cpus(node, "kubepods/besteffort/agent") == "0-3"
    assert not any(k.startswith("hostapp/nginx") for k in result.errors)


async def test_lsr_app_cpuset_is_refused_but_bvt_applies(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.make_cgroup("host-latency-sensitive/db")
    errors = RECONCILE_ERRORS.labels("hostapp")
    before = errors._value.get()
    rec = make_reconciler(node)
    slo = parse_nodeslo(gi_slo([app("db", "LSR", parent="host-latency-sensitive")], lsr=1))
    with capture_logs() as logs:
        for _ in range(2):
            result = await rec.reconcile(state(NodeUpdated(POOLS_NODE), NodeSLOUpdated(slo)))
    error = result.errors["hostapp/db/CPUSetAllocator/cpuset.cpus"]
    assert error == "ValueError: host application qos LSR: only LS is supported"
    assert bvt(node, "host-latency-sensitive/db") == "1"
    assert cpus(node, "host-latency-sensitive/db") == "0-3"
    assert errors._value.get() == before + 2  # counted every pass...
    warned = [e for e in logs if e["event"] == "host application not fully reconciled"]
    assert [(e["host_app"], e["hook"]) for e in warned] == [
        ("db", "CPUSetAllocator/cpuset.cpus")
    ]  # ...logged once


async def test_no_cgroup_path_uses_the_default_dirs(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    for rel in ("host-latency-sensitive/web", "host-best-effort/batch", "misc"):
        node.make_cgroup(rel)
    apps = [{"name": "web", "qos": "LS"}, {"name": "batch", "qos": "BE"}, {"name": "misc", "qos": "bogus"}]
    rec = make_reconciler(node)
    result = await rec.reconcile(state(NodeSLOUpdated(parse_nodeslo(gi_slo(apps)))))
    assert result.host_apps == {
        "web": "host-latency-sensitive/web",
        "batch": "host-best-effort/batch",
        "misc": "misc",
    }
    assert [bvt(node, d) for d in result.host_apps.values()] == ["2", "-1", "0"]


def test_default_cgroup_path_by_qos() -> None:
    def parent(qos: str) -> str:
        path = host_app_cgroup_path(HostApplicationSpec(name="a", qos=qos))
        return f"{path.base}:{path.parent_dir}:{path.relative_path}"

    assert [parent(q) for q in ("LSE", "LSR", "LS", "BE", "SYSTEM", "")] == [
        "CgroupRoot:host-latency-sensitive:a",
        "CgroupRoot:host-latency-sensitive:a",
        "CgroupRoot:host-latency-sensitive:a",
        "CgroupRoot:host-best-effort:a",
        "CgroupRoot::a",
        "CgroupRoot::a",
    ]


async def test_hostile_paths_write_nothing_and_are_counted(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    outside = node.base / "etc"  # where cpu/../../etc would land on the v1 tree
    outside.mkdir()
    (outside / "cpu.bvt_warp_ns").write_text("0\n")
    (outside / "cpuset.cpus").write_text("0-3\n")
    (node.cgroup_root / "cpu" / "evil").symlink_to(outside, target_is_directory=True)
    node.make_cgroup(LS_DIR)
    apps = [
        app("dotdot", "LS", rel="../../etc"),
        app("symlink", "LS", rel="evil"),
        app("slash-name", "LS", parent="host-latency-sensitive", rel="/../../etc"),
        {"name": "../../etc", "qos": ""},  # no cgroupPath: the name is the dir
        app("root", "LS", rel=""),  # the whole cgroup root: refused too
        app("nginx", "LS", parent="host-latency-sensitive"),
    ]
    dotdot = PATH_REFUSED.labels("dotdot")
    symlink = PATH_REFUSED.labels("symlink")
    errors = RECONCILE_ERRORS.labels("hostapp")
    before = (dotdot._value.get(), symlink._value.get(), errors._value.get())
    rec = make_reconciler(node)
    with capture_logs() as logs:
        for _ in range(2):
            result = await rec.reconcile(
                state(NodeUpdated(POOLS_NODE), NodeSLOUpdated(parse_nodeslo(gi_slo(apps))))
            )
    assert result.host_apps == {"nginx": LS_DIR}  # the good app still gets its settings
    assert (bvt(node, LS_DIR), cpus(node, LS_DIR)) == ("2", "0-1,3")
    assert {w.parent for w in result.writes if "host" in w.parent or "etc" in w.parent} == {LS_DIR}
    assert (outside / "cpu.bvt_warp_ns").read_text() == "0\n"
    assert (outside / "cpuset.cpus").read_text() == "0-3\n"
    refused = ("dotdot", "symlink", "slash-name", "../../etc", "root")
    assert all("cgroup dir refused" in result.errors[f"hostapp/{n}"] for n in refused)
    assert dotdot._value.get() == before[0] + 2 * 3  # dotdot, slash-name and the bare name, each pass
    assert symlink._value.get() == before[1] + 2  # refused dirs are not memoised: checked every pass
    assert errors._value.get() == before[2] + 2 * len(refused)
    warned = [e["host_app"] for e in logs if e["event"] == "host application not fully reconciled"]
    assert sorted(warned) == sorted(refused)  # once each over two passes


async def test_dry_run_writes_nothing_and_records_decisions(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.make_cgroup(LS_DIR)
    rec = make_reconciler(node, dry_run=True)
    slo = parse_nodeslo(gi_slo([app("nginx", "LS", parent="host-latency-sensitive")]))
    await rec.reconcile(state(NodeUpdated(POOLS_NODE), NodeSLOUpdated(slo)))
    assert (bvt(node, LS_DIR), cpus(node, LS_DIR)) == ("0", "0-3")
    recorded = {(d.target, d.new) for d in rec.decisions.recent() if d.dry_run}
    assert {(f"{LS_DIR}/cpu.bvt_warp_ns", "2"), (f"{LS_DIR}/cpuset.cpus", "0-1,3")} <= recorded


async def test_rule_changes_rewrite_the_host_app(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.make_cgroup(LS_DIR)
    apps = [app("nginx", "LS", parent="host-latency-sensitive")]
    rec = make_reconciler(node)
    await rec.reconcile(state(NodeUpdated(POOLS_NODE), NodeSLOUpdated(parse_nodeslo(gi_slo(apps)))))
    assert (bvt(node, LS_DIR), cpus(node, LS_DIR)) == ("2", "0-1,3")
    # GroupIdentity rule change (NodeSLO bvt values)
    result = await rec.reconcile(
        state(NodeUpdated(POOLS_NODE), NodeSLOUpdated(parse_nodeslo(gi_slo(apps, ls=1))))
    )
    assert "GroupIdentity" in result.rules_updated
    assert bvt(node, LS_DIR) == "1"
    # CPUSetAllocator rule change (share pools on the Node)
    narrower = NodeInfo(
        name="n",
        annotations={"node.koordinator.sh/cpu-shared-pools": '[{"socket":0,"node":0,"cpuset":"1-3"}]'},
    )
    result = await rec.reconcile(
        state(NodeUpdated(narrower), NodeSLOUpdated(parse_nodeslo(gi_slo(apps, ls=1))))
    )
    assert "CPUSetAllocator" in result.rules_updated
    assert cpus(node, LS_DIR) == "1-3"


async def test_missing_cgroup_is_not_an_error(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    rec = make_reconciler(node)
    slo = parse_nodeslo(gi_slo([app("later", "LS", parent="host-latency-sensitive")]))
    result = await rec.reconcile(state(NodeUpdated(POOLS_NODE), NodeSLOUpdated(slo)))
    assert result.errors == {}
    mine = [w for w in result.writes if w.parent == "host-latency-sensitive/later"]
    assert {w.resource for w in mine} == {"cpu.bvt_warp_ns", "cpuset.cpus"}
    outcomes = {r.outcome for r in await rec.executor.apply("test", mine)}
    assert outcomes == {Outcome.VANISHED}


async def test_duplicate_names_first_kept(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.make_cgroup("a1")
    node.make_cgroup("a2")
    rec = make_reconciler(node)
    slo = parse_nodeslo(gi_slo([app("a", "BE", rel="a1"), app("a", "LS", rel="a2")]))
    result = await rec.reconcile(state(NodeSLOUpdated(slo)))
    assert result.host_apps == {"a": "a1"}
    assert (bvt(node, "a1"), bvt(node, "a2")) == ("-1", "0")
    assert "duplicate" in result.errors["hostapp/a"]


async def test_running_component_follows_nodeslo_changes_and_the_interval(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.make_cgroup(LS_DIR)
    base = make_reconciler(node)
    executor = CgroupExecutor(node.layout, base.decisions, force_update_seconds=0.0)  # no cache hold-off
    bus = EventBus()
    rec = HookReconciler(
        base.hooks, node.layout, executor, base.host, base.decisions, bus=bus, interval=0.05, settle=0.0
    )
    apps = [app("nginx", "LS", parent="host-latency-sensitive")]
    tasks = [asyncio.create_task(bus.run()), asyncio.create_task(rec.run())]
    try:
        await bus.publish(NodeSLOUpdated(parse_nodeslo(gi_slo(apps))))
        await wait_until(
            lambda: bvt(node, LS_DIR) == "2", timeout=10, message="LS bvt 2 from the new NodeSLO"
        )
        await bus.publish(NodeSLOUpdated(parse_nodeslo(gi_slo(apps, ls=1))))
        await wait_until(lambda: bvt(node, LS_DIR) == "1", timeout=10, message="LS bvt back to 1")
        node.write(LS_DIR, "cpu", "cpu.bvt_warp_ns", -1)  # changed behind the agent's back
        await wait_until(
            lambda: bvt(node, LS_DIR) == "1", timeout=10, message="LS bvt restored"
        )  # the interval pass restores it
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
