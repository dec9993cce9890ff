"""The agent on a real cgroup v2 kernel (inside the v2 VM): what it writes lands in the kernel's files, and
the kernel acts on it (a running burner throttled by the BE tier's cpu.max, its stalls in the PSI files).

The tests share one node and one agent (conftest.py) and each sets the NodeSLO it needs; they run in file
order, the burner ones last."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .conftest import BURNERS, SUPPRESS_PERCENT, GiB, MiB, Node
from .v2node import flat_keyed, quota_of, read, wait

PAGE = 4096
BE_QOS = "kubepods/besteffort"
RECONCILE_PASSES = "koordqos_hooks_reconcile_passes_total"
STRATEGY_ROUNDS = "koordqos_strategy_runs_total"
PROBLEMS = ("write-failed", "write-refused", "write-invalid")


def _values(rel: str, names: tuple[str, ...]) -> dict[str, str]:
    return {name: read(rel, name) for name in names}


def _wait_values(node: Node, rel: str, want: dict[str, str], what: str) -> None:
    names = tuple(want)
    wait(
        lambda: _values(rel, names) == want,
        lambda: f"{what} in {rel}: {_values(rel, names)}, want {want}\n{node.agent.history(rel)}",
    )


def _blkio_rounds(node: Node) -> float:
    # the strategy's name or its gate's (koordlet's names: the logs and labels may use either)
    names = ("BlkioReconcile", "BlkIOReconcile")
    return sum(sum(node.agent.samples(STRATEGY_ROUNDS, strategy=name)) for name in names)


def _burst_probe(d: dict[str, Any]) -> bool:
    """CPU burst's first write above the quota, which the kernel refuses with EINVAL: how the agent learns
    that this kernel caps the burst at the quota (it caps every burst after it)."""
    burst = d["target"].endswith("/cpu.cfs_burst_us")
    return d["strategy"] == "CPUBurst" and burst and "EINVAL" in d["reason"]


def _problems(node: Node, since: float = 0.0) -> list[dict[str, Any]]:
    """Refused or failed writes since `since`, but CPU burst's EINVAL probes."""
    return [
        d
        for d in node.agent.decisions()
        if d["action"] in PROBLEMS and d["time"] >= since and not _burst_probe(d)
    ]


def test_the_agent_sees_a_v2_node_and_is_ready(node: Node) -> None:
    wait(lambda: node.agent.readyz().get("ready") is True, lambda: f"/readyz ready: {node.agent.readyz()}")
    layout = [d for d in node.agent.log_lines() if d.get("event") == "cgroup layout"]
    assert layout, node.agent.log_tail()
    assert (layout[0]["version"], layout[0]["driver"], layout[0]["hybrid"]) == ("v2", "cgroupfs", False)
    assert "missing_controllers" not in node.agent.readyz(), node.agent.readyz()


def test_seed_be_scenario(node: Node) -> None:
    """batch-cpu request 1000 m → shares 1024 → cpu.weight 39; batch-cpu limit 2000 m → cpu.max 200000;
    batch-memory limit 2 GiB → memory.max: at pod level (the RunPodSandbox pod stage and the reconciler)
    and container level (the reconciler; the NRI reply carries the same values to the runtime)."""
    node.set_nodeslo()
    be = node.be
    want = {"cpu.weight": "39", "cpu.max": "200000 100000", "memory.max": str(2 * GiB)}
    for rel in (be.pod_dir, be.ctr_dir):
        _wait_values(node, rel, want, "the batch values")
    reply = node.replies[be.name]
    assert reply is not None
    res = reply.adjust.linux.resources
    assert (res.cpu.shares.value, res.cpu.quota.value, res.memory.limit.value) == (1024, 200000, 2 * GiB)


def test_cpu_idle_marks_the_be_pod_and_the_weight_comes_back(node: Node) -> None:
    """BE cpuQOS on: no bvt on this kernel, so group identity's -1 is cpu.idle=1 on the BE pod (never on
    kubepods/besteffort). The kernel then holds the pod's weight (cpu.weight reads 0) and refuses a weight
    write: the agent makes none. Off again: cpu.idle=0 (the kernel resets the weight to 100) and the batch
    weight 39 is written back at once, not after the cache's force-update period."""
    be = node.be
    node.set_nodeslo(be_idle=True)
    since = time.time()
    _wait_values(node, be.pod_dir, {"cpu.idle": "1", "cpu.weight": "0"}, "the BE pod made idle")
    assert read(BE_QOS, "cpu.idle") == "0"
    assert read(be.ctr_dir, "cpu.weight") == "39"  # inside the pod the batch weight stays
    assert read(node.ls.pod_dir, "cpu.idle") == "0"
    # two reconcile passes over the idle pod, and not one refused write
    passes = sum(node.agent.samples(RECONCILE_PASSES))
    wait(lambda: sum(node.agent.samples(RECONCILE_PASSES)) >= passes + 2, "two reconcile passes")
    assert _problems(node, since) == []
    node.set_nodeslo(be_idle=False)
    _wait_values(node, be.pod_dir, {"cpu.idle": "0", "cpu.weight": "39"}, "the BE pod's weight back")


def test_memory_qos(node: Node) -> None:
    """LS memoryQOS (min 50 %, low 75 % of the request, high at 80 % between request and limit, OOM
    group): the Guaranteed `db` pod requests what it limits (256 MiB), the Burstable `web` requests no
    memory (local mode) with a 1 GiB limit."""
    node.set_nodeslo()
    db, web = node.db, node.ls
    mem_min, mem_low = str(128 * MiB), str(192 * MiB)
    _wait_values(node, db.pod_dir, {"memory.min": mem_min, "memory.low": mem_low}, "the db pod's protection")
    _wait_values(
        node,
        db.ctr_dir,
        {
            "memory.min": mem_min,
            "memory.low": mem_low,
            "memory.high": str(256 * MiB),
            "memory.oom.group": "1",
        },
        "the db container's memory QoS",
    )
    high = str((GiB * 80 // 100) // PAGE * PAGE)
    _wait_values(node, web.ctr_dir, {"memory.high": high, "memory.oom.group": "1"}, "web's memory.high")
    assert read(web.pod_dir, "memory.oom.group") == "1"
    # the kernel takes memory.min/low as protection: its effective values follow from the parents
    assert int(read(db.ctr_dir, "memory.min")) == 128 * MiB


def test_cpuset_share_pool_of_ls_containers(node: Node) -> None:
    """CPUSetAllocator: with no LSR pod the share pool is every CPU; the reconciler writes it to the LS
    containers' cpuset.cpus (on v2 an empty cpuset.cpus means "the parent's": the file must say it), and
    the kernel's effective set follows."""
    node.set_nodeslo()
    for pod in (node.ls, node.db):
        _wait_values(
            node, pod.ctr_dir, {"cpuset.cpus": "0-1", "cpuset.cpus.effective": "0-1"}, "the share pool"
        )


def test_cpu_burst_is_capped_at_the_quota_by_the_kernel(node: Node) -> None:
    """cpuBurstOnly 200 %: 2 CPUs of burst for web's 1 CPU limit, but the kernel refuses a cpu.max.burst
    above the quota (EINVAL): the agent caps it at the quota and says so."""
    node.set_nodeslo()
    _wait_values(node, node.ls.ctr_dir, {"cpu.max.burst": "100000"}, "web's CFS burst")
    _wait_values(node, node.db.ctr_dir, {"cpu.max.burst": "50000"}, "db's CFS burst")
    capped = [
        d
        for d in node.agent.decisions()
        if d["strategy"] == "CPUBurst" and d["target"].startswith(node.ls.ctr_dir) and "capped" in d["reason"]
    ]
    assert capped, node.agent.history(node.ls.ctr_dir)
    # the kernel's EINVAL taught it: at most one refused burst per container, none after the cap
    probes = [d for d in node.agent.decisions() if _burst_probe(d)]
    assert 1 <= len(probes) <= 2, probes
    assert len({d["target"] for d in probes}) == len(probes), probes
    assert all(d["time"] <= min(c["time"] for c in capped) for d in probes), (probes, capped)


def test_blkio_on_v2_io_files(node: Node) -> None:
    """BE blkioQOS on the null_blk disk: the throttles as io.max keys; the weight in io.weight once the
    disk's io cost QoS is on (cgroupRoot), never written without it (the kernel refuses it then)."""
    if node.blkio is not None:
        raise AssertionError(f"no disk for blkio QoS in the VM: {node.blkio}")
    number = Path("/sys/block/nullb0/dev").read_text().strip()

    def io() -> tuple[dict[str, str], str, str]:
        line = next((ln for ln in read(BE_QOS, "io.max").splitlines() if ln.startswith(number + " ")), "")
        keys = dict(kv.split("=") for kv in line.split()[1:])
        weight = [ln for ln in read(BE_QOS, "io.weight").splitlines() if ln.startswith(number + " ")]
        cost = [ln for ln in read("", "io.cost.qos").splitlines() if ln.startswith(number + " ")]
        return keys, (weight or [""])[0], "enable=1" if cost and "enable=1" in cost[0].split() else ""

    def explain() -> str:
        return (
            f"the BE tier's io.max / io.weight, the root's cost QoS: {io()}\n{node.agent.history(BE_QOS)}\n"
            f"root {node.agent.history('')}\nio.cost.qos: {read('', 'io.cost.qos')!r}"
        )

    throttles = {"rbps": "max", "wbps": str(8 * MiB), "riops": "2000", "wiops": "max"}
    # without the disk's cost QoS (as at the start: the root's blkioQOS off) the weight is not written
    # (the kernel would refuse it) but reported; the file keeps what it had (the kernel keeps a weight set
    # while the cost QoS was on, without effect)
    node.set_nodeslo(cost_qos=False)
    since = time.time()
    wait(lambda: io()[0] == throttles and io()[2] == "", explain)
    rounds = _blkio_rounds(node)
    wait(lambda: _blkio_rounds(node) >= rounds + 2, "two blkio rounds")
    assert _problems(node, since) == []
    skipped = [
        d
        for d in node.agent.log_lines()
        if d.get("event") == "blkio target skipped" and "needs its io cost QoS on" in str(d.get("error"))
    ]
    assert skipped, node.agent.log_tail()
    # with it, the weight lands
    node.set_nodeslo(cost_qos=True)
    wait(lambda: io() == (throttles, f"{number} 60", "enable=1"), explain)
    # and the cost QoS off again: no write fails (the kernel keeps the weight, without effect)
    node.set_nodeslo(cost_qos=False)
    wait(lambda: io()[2] == "", explain)
    rounds = _blkio_rounds(node)
    wait(lambda: _blkio_rounds(node) >= rounds + 2, "two blkio rounds")
    assert _problems(node, since) == []


def test_collector_reads_v2_pod_cpu_and_memory(node: Node, burning: list[int]) -> None:
    """The metrics collector's pod CPU from cpu.stat usage_usec and memory from memory.current/stat."""

    def be_cpu() -> float:
        pods = (node.agent.json("/debug/state").get("last_metrics") or {}).get("pods") or {}
        sample = pods.get(node.be.sandbox.uid) or {}
        return float(sample.get("cpu_usage_cores") or 0.0)

    wait(lambda: be_cpu() > 0.3, lambda: f"the BE pod's CPU from cpu.stat ({be_cpu()} cores)")
    pods = node.agent.json("/debug/state")["last_metrics"]["pods"]
    assert (pods[node.be.sandbox.uid].get("memory_working_set") or 0) > 0, pods


def test_cpu_suppress_throttles_a_running_burner(node: Node, burning: list[int]) -> None:
    """cfsQuota at 40 % of 2 CPUs: kubepods/besteffort/cpu.max gets a quota (the batch quotas of the BE
    pod and container are lifted to max under this policy), and the kernel throttles the burners."""
    node.set_nodeslo(suppress=True)
    cap = 2 * 100_000 * SUPPRESS_PERCENT // 100
    wait(lambda: 0 < quota_of(BE_QOS) <= cap, lambda: f"the BE tier's quota: {read(BE_QOS, 'cpu.max')}")
    _wait_values(node, node.be.pod_dir, {"cpu.max": "max 100000"}, "the BE pod's quota lifted")
    _wait_values(node, node.be.ctr_dir, {"cpu.max": "max 100000"}, "the BE container's quota lifted")
    before = flat_keyed(BE_QOS, "cpu.stat")
    wait(
        lambda: flat_keyed(BE_QOS, "cpu.stat")["nr_throttled"] >= before["nr_throttled"] + 5,
        lambda: f"the kernel throttling the BE tier: {flat_keyed(BE_QOS, 'cpu.stat')} (before: {before})",
    )
    # and the cap holds: the BE tier's CPU over a second stays near its quota, far below BURNERS CPUs
    start, t0 = flat_keyed(BE_QOS, "cpu.stat")["usage_usec"], time.monotonic()
    wait(lambda: time.monotonic() - t0 >= 2.0, "two seconds of throttled burning", timeout=10)
    rate = (flat_keyed(BE_QOS, "cpu.stat")["usage_usec"] - start) / ((time.monotonic() - t0) * 1e6)
    assert rate <= cap / 100_000 + 0.2, (rate, read(BE_QOS, "cpu.max"))
    assert flat_keyed(BE_QOS, "cpu.stat")["throttled_usec"] > before["throttled_usec"]


def test_psi_of_pods_and_containers_under_the_burner(node: Node, burning: list[int]) -> None:
    """The PSI collector reads the BE pod's and container's cpu.pressure and memory.pressure (v2 only):
    koordlet's koordlet_pod_psi / koordlet_container_psi, a CPU stall > 0 under BURNERS burners."""
    assert BURNERS > 2
    be = node.be
    pod = {"pod_name": be.name, "psi_resource_type": "cpu", "psi_degree": "some", "psi_precision": "avg10"}

    def pod_cpu() -> list[float]:
        return node.agent.samples("koordlet_pod_psi", **pod)

    wait(lambda: any(v > 0 for v in pod_cpu()), lambda: f"the BE pod's CPU stall: {pod_cpu()}")
    ctr = {**pod, "container_name": be.container.name}
    wait(
        lambda: any(v > 0 for v in node.agent.samples("koordlet_container_psi", **ctr)),
        lambda: f"the BE container's CPU stall: {node.agent.samples('koordlet_container_psi', **ctr)}",
    )
    memory = node.agent.samples("koordlet_pod_psi", pod_name=be.name, psi_resource_type="mem")
    assert len(memory) == 6, memory  # some and full × avg10/60/300, read from memory.pressure
    assert node.agent.samples("koordlet_pod_psi", pod_name=node.ls.name, psi_resource_type="cpu")
    # and the kernel's own numbers agree: the file the collector read has a stall total
    assert int(read(be.pod_dir, "cpu.pressure").split("total=")[1].split()[0]) > 0


def test_cpu_suppress_recovers(node: Node, burning: list[int]) -> None:
    """Suppress switched off: the BE tier's quota back to max, the batch quotas back on the pod."""
    node.set_nodeslo(suppress=False)
    _wait_values(node, BE_QOS, {"cpu.max": "max 100000"}, "the BE tier's quota recovered")
    _wait_values(node, node.be.pod_dir, {"cpu.max": "200000 100000"}, "the BE pod's batch quota")


def test_nothing_refused_or_failed(node: Node) -> None:
    """Over the whole session, no cgroup write the kernel refused or that was refused before it (but CPU
    burst's probes, test_cpu_burst_is_capped_at_the_quota_by_the_kernel)."""
    assert _problems(node) == []
