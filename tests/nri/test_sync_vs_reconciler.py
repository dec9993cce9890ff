"""One cpuset from one state (issue #32 item 5b): the NRI Synchronize answer and the reconciler's cpuset come
from the same share-pool computation (the NRT reporter's) of the state each plans from, so the reconciler
keeps what the runtime was answered. Before: the answer used the pools of the last NRT round (computed before
the runtime's pods were known: `web/nginx cpus=0-3`), the reconciler those of the next (`0-3 -> 2-3`)."""

from __future__ import annotations

from pathlib import Path

from koordqos.bus import EventBus
from koordqos.cgroups.executor import CgroupExecutor
from koordqos.decisions import DecisionLog
from koordqos.events.types import NodeSLOUpdated, PodsReplaced, RuntimeSynchronized, SourceSynced
from koordqos.hooks import probe_bvt_system
from koordqos.hooks.core import HookCore, run_call
from koordqos.hooks.reconcile_plan import LOCAL_POD_SOURCES
from koordqos.hooks.reconciler import HookReconciler
from koordqos.hooks.runtime import HookOptions, RuntimeHooks
from koordqos.host import HostActuator
from koordqos.localsources import load_nodeslo_file, pod_from_sandbox
from koordqos.metrics.hardware import read_hardware
from koordqos.metrics.topology import read_topology
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.nri.calls import NRISynchronize
from koordqos.nri.convert import NRIHooks
from koordqos.nri.runtime_objects import runtime_container, runtime_sandbox
from koordqos.report.kubelet import KubeletCPUManager
from koordqos.report.topologyreporter import KubeletSources, TopologyReporter
from koordqos.state import NodeState, reduce
from koordqos.testing.mock_nri.scenarios import colocation


async def test_the_synchronize_answer_is_the_cpuset_the_reconciler_keeps(tmp_path: Path) -> None:
    scenario = colocation(tmp_path / "node")
    node = scenario.node
    bus = EventBus()
    hooks = RuntimeHooks(HookOptions(bvt=probe_bvt_system(node.layout, node.proc_root)))
    reporter = TopologyReporter(
        bus,
        "node",
        read_topology(node.sys_root),
        read_hardware(node.proc_root, node.sys_root),
        None,
        kubelet=KubeletSources(
            explicit=KubeletCPUManager(policy="none", source="config"), kubelet_root=tmp_path
        ),
        on_topology=lambda want: hooks.update_topology(want.annotations),
    )

    def topology_of(state: NodeState) -> dict[str, str] | None:
        want = reporter.desired_for(state)
        return None if want is None else dict(want.annotations)

    hooks.topology_source = topology_of
    # the agent's first NRT round, before any pod: every CPU is in the share pool
    await reporter.round()
    assert hooks.cpuset is not None
    assert hooks.cpuset.rule is not None
    assert [p.cpuset for p in hooks.cpuset.rule.share_pools] == ["0-3"]

    decisions = DecisionLog()
    executor = CgroupExecutor(node.layout, decisions)
    nri = NRIHooks(HookCore(hooks, executor, decisions), node.layout)
    sandboxes = tuple(runtime_sandbox(p) for p in scenario.pods)
    uid_of = {p.id: p.uid for p in scenario.pods}
    records = tuple(runtime_container(c, uid_of[c.pod_sandbox_id]) for c in scenario.containers)
    slo = parse_nodeslo(load_nodeslo_file(scenario.nodeslo_file))
    # as the session does: the runtime's view is in NodeState before the hooks run
    state = NodeState()
    for e in (SourceSynced("pods"), NodeSLOUpdated(slo), RuntimeSynchronized(sandboxes, records)):
        state = reduce(state, e)
    state = reduce(state, SourceSynced("nri"))
    event = NRISynchronize(list(scenario.pods), list(scenario.containers))
    await run_call("NRISynchronize", 2.0, "Ignore", lambda call: nri(event, state, call))
    answer = {u.container_id: u.linux.resources.cpu.cpus for u in event.updates}
    nginx, postgres, _worker = scenario.containers
    assert (answer[nginx.id], answer[postgres.id]) == ("2-3", "0-1")

    host = HostActuator(decisions, proc_root=node.proc_root, sys_root=node.sys_root)
    rec = HookReconciler(hooks, node.layout, executor, host, decisions, pod_sources=LOCAL_POD_SOURCES)
    cpusets = {
        rel: node.layout.normalize_parent(c.linux.cgroups_path)
        for rel, c in (("nginx", nginx), ("postgres", postgres))
    }
    # the reconciler on the same state, and on the one after the local pod source turned the sandboxes into
    # pods: the same cpusets, whatever the NRT reporter did meanwhile
    pods = tuple(pod_from_sandbox(sb, "node") for sb in sandboxes)
    for planned in (state, reduce(state, PodsReplaced(pods, source="nri"))):
        result = rec.compute(planned)
        got = {
            name: {w.value for w in result.writes if w.parent == rel and w.resource == "cpuset.cpus"}
            for name, rel in cpusets.items()
        }
        assert got == {"nginx": {"2-3"}, "postgres": {"0-1"}}
