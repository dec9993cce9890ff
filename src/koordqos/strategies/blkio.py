"""BlkioReconcile (docs/reconcile.md, "Blkio"): block I/O throttles and weights: planner.

Targets: the besteffort QoS dir (`beClass.blkioQOS`), the blkio root (`cgroupRoot.blkioQOS`: io cost QoS and
model) and the dirs of pods with the `koordinator.sh/blkioQOS` annotation. A block (`device`, `volumegroup`,
`podvolume`) is resolved to its disk number `MAJ:MIN` through the node's local storage; each target gets one
`"<MAJ:MIN> <value>"` line per file and disk, and every disk already present in a target's files but no
longer configured is reset (throttles 0, weight 100, cost qos `enable=0`). A disabled `blkioQOS` means no
blocks, so everything is reset. A block that does not resolve aborts its target for the round (problem
reported). On cgroup v2 the executor maps the throttles to `io.max` and the weight to `io.weight`; there a
disk's weight is planned only while its io cost QoS is on (the kernel refuses a per-disk `io.weight` with
EOPNOTSUPP otherwise: seen in the v2 VM), and a weight other than 100 without it is a reported problem. The
root's cost QoS is switched on before the targets are written and off after them (a weight is written
while its disk's cost QoS is on, a reset too).
Pure: `plan_blkio` turns `BlkioInputs` into `CgroupWrite` intents.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from koordqos.cgroups.executor import CgroupWrite, Level
from koordqos.cgroups.resources import CgroupVersion, parse_device_lines
from koordqos.errors import KoordQoSError
from koordqos.metrics.localstorage import LocalStorage, read_local_storage, read_mounts
from koordqos.model.keys import ANNOTATION_BLKIO_QOS
from koordqos.model.nodeslo import BlkIOQOS, BlockCfg, IOCfg, NodeSLO
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS, QoSClass
from koordqos.state import NodeState
from koordqos.strategies.framework import INVALID_CONFIG, StrategyEnv

if TYPE_CHECKING:
    from koordqos.config import AgentConfig

NAME = "BlkIOReconcile"  # its koordlet gate (koordlet's strategy: BlkioReconcile)
REASON = "UpdateBlkio"
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"

READ_IOPS = "blkio.throttle.read_iops_device"
READ_BPS = "blkio.throttle.read_bps_device"
WRITE_IOPS = "blkio.throttle.write_iops_device"
WRITE_BPS = "blkio.throttle.write_bps_device"
WEIGHT = "blkio.cost.weight"
COST_QOS = "blkio.cost.qos"
COST_MODEL = "blkio.cost.model"
THROTTLE_FILES = (READ_IOPS, READ_BPS, WRITE_IOPS, WRITE_BPS, WEIGHT)
RESET_VALUE = {READ_IOPS: 0, READ_BPS: 0, WRITE_IOPS: 0, WRITE_BPS: 0, WEIGHT: 100}
ROOT_DIR = ""

DEFAULT_IO = IOCfg.model_validate(
    {
        "readIOPS": 0,
        "writeIOPS": 0,
        "readBPS": 0,
        "writeBPS": 0,
        "ioWeightPercent": 100,
        "readLatency": 3000,
        "writeLatency": 3000,
        "readLatencyPercent": 95,
        "writeLatencyPercent": 95,
        "enableUserModel": False,
        "modelReadBPS": 0,
        "modelWriteBPS": 0,
        "modelReadSeqIOPS": 0,
        "modelWriteSeqIOPS": 0,
        "modelReadRandIOPS": 0,
        "modelWriteRandIOPS": 0,
    }
)


@dataclass(frozen=True)
class BlkioInputs:
    """One round's inputs: config, storage, pods and what the target files hold now."""

    slo: NodeSLO | None
    storage: LocalStorage
    pods: Mapping[str, PodInfo]
    be_dir: str
    pod_dirs: Mapping[str, str]  # uid → pod dir (only pods that carry the annotation)
    current: Mapping[tuple[str, str], str]  # (dir, resource) → file content (missing: not read / absent)
    pvc_volumes: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (ns, claim) → PV name
    kubelet_root: str = DEFAULT_KUBELET_ROOT
    # cgroup v2: a disk's io.weight takes a value only while the disk's io cost QoS is on
    weight_needs_cost_qos: bool = False


@dataclass
class BlkioPlan:
    """Writes (in order: the root's cost QoS switched on and models, BE, pods, the root's cost QoS switched
    off) and problems by target."""

    writes: list[CgroupWrite] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)


def io(cfg: IOCfg) -> IOCfg:
    """The block's IOCfg with koordlet's defaults for unset fields."""
    return DEFAULT_IO.model_copy(update=cfg.model_dump(exclude_none=True))


def _blocks(qos: BlkIOQOS | None) -> tuple[BlockCfg, ...]:
    # project decision: a nil `enable` is false
    return qos.blocks if qos is not None and qos.enable is True else ()


def _class_blkio(slo: NodeSLO | None, which: str) -> BlkIOQOS | None:
    if slo is None or slo.resource_qos_strategy is None:
        return None
    conf = getattr(slo.resource_qos_strategy, which)
    return None if conf is None else conf.blkio_qos


def _throttle_lines(number: str, cfg: IOCfg) -> list[tuple[str, str]]:
    c = io(cfg)
    return [
        (READ_IOPS, f"{number} {c.read_iops}"),
        (READ_BPS, f"{number} {c.read_bps}"),
        (WRITE_IOPS, f"{number} {c.write_iops}"),
        (WRITE_BPS, f"{number} {c.write_bps}"),
        (WEIGHT, f"{number} {c.io_weight_percent}"),
    ]


def cost_qos_line(number: str, cfg: IOCfg) -> str:
    """`blkio.cost.qos` of a configured disk."""
    c = io(cfg)
    return (
        f"{number} enable=1 ctrl=user rpct={c.read_latency_percent} rlat={c.read_latency} "
        f"wpct={c.write_latency_percent} wlat={c.write_latency}"
    )


def cost_model_line(number: str, cfg: IOCfg) -> str:
    """`blkio.cost.model` of a configured disk (the user model, or `ctrl=auto`)."""
    c = io(cfg)
    if not c.enable_user_model:
        return f"{number} ctrl=auto"
    return (
        f"{number} ctrl=user rbps={c.model_read_bps} rseqiops={c.model_read_seq_iops} "
        f"rrandiops={c.model_read_rand_iops} wbps={c.model_write_bps} wseqiops={c.model_write_seq_iops} "
        f"wrandiops={c.model_write_rand_iops}"
    )


def pod_volume_mount(kubelet_root: str, uid: str, volume: str) -> str:
    """Where kubelet mounts a CSI volume of a pod."""
    return f"{kubelet_root.rstrip('/')}/pods/{uid}/volumes/kubernetes.io~csi/{volume}/mount"


def resolve(block: BlockCfg, storage: LocalStorage, pod: PodInfo | None, inp: BlkioInputs) -> str:
    """The disk number of a block (ValueError naming what did not resolve)."""
    if block.type == "device":
        number = storage.number_of_device(block.name)
        if number is None:
            raise ValueError(f"device {block.name!r} not found on the node")
        return number
    if block.type == "volumegroup":
        number = storage.number_of_vg(block.name)
        if number is None:
            raise ValueError(f"volume group {block.name!r} not found on the node")
        return number
    if pod is None:
        raise ValueError(f"podvolume block {block.name!r} is only allowed in a pod annotation")
    if block.name not in pod.volumes:
        raise ValueError(f"pod has no volume {block.name!r}")
    claim = pod.volumes[block.name]
    volume = block.name
    if claim:
        pv = inp.pvc_volumes.get((pod.namespace, claim))
        if pv is None:
            raise ValueError(f"volume {block.name!r}: claim {claim!r} is not bound to a known volume")
        volume = pv
    mount = pod_volume_mount(inp.kubelet_root, pod.uid, volume)
    device = storage.mount_device.get(mount)
    if device is None:
        raise ValueError(f"volume {block.name!r}: {mount} is not mounted")
    number = storage.number_of_device(device)
    if number is None:
        raise ValueError(f"volume {block.name!r}: device {device} has no disk")
    return number


def _target(
    plan: BlkioPlan,
    inp: BlkioInputs,
    key: str,
    parent: str,
    level: Level,
    blocks: Sequence[BlockCfg],
    pod: PodInfo | None,
    cost_on: frozenset[str] | None,
) -> None:
    """`cost_on`: the disks whose io cost QoS is on (None: a weight needs none, v1)."""
    lines: list[tuple[str, str]] = []
    configured: set[str] = set()
    try:
        for block in blocks:
            number = resolve(block, inp.storage, pod, inp)
            configured.add(number)
            lines += _throttle_lines(number, block.io_cfg)
    except ValueError as exc:
        plan.problems[key] = str(exc)
        return
    for resource in THROTTLE_FILES:
        present = parse_device_lines(inp.current.get((parent, resource), ""))
        for number in sorted(set(present) - configured):
            lines.append((resource, f"{number} {RESET_VALUE[resource]}"))
    if cost_on is not None:
        kept = []
        for resource, value in lines:
            number, _, weight = value.partition(" ")
            if resource != WEIGHT or number in cost_on:
                kept.append((resource, value))
            elif weight != str(RESET_VALUE[WEIGHT]):
                plan.problems[f"{key}:{number}"] = (
                    f"ioWeightPercent {weight} on disk {number} needs its io cost QoS on "
                    "(cgroupRoot blkioQOS): cgroup v2 refuses a disk's io.weight without it"
                )
        lines = kept
    plan.writes += [CgroupWrite(parent, r, v, level) for r, v in lines]


def _cost_on(inp: BlkioInputs, root_writes: Sequence[CgroupWrite]) -> frozenset[str]:
    """The disks whose io cost QoS is on now or is switched on by this plan (and not yet off)."""
    present = parse_device_lines(inp.current.get((ROOT_DIR, COST_QOS), ""))
    on = {number for number, rest in present.items() if "enable=1" in rest.split()}
    for w in root_writes:
        if w.resource == COST_QOS and "enable=1" in str(w.value).split():
            on.add(str(w.value).split()[0])
    return frozenset(on)


def _root(plan: BlkioPlan, inp: BlkioInputs, blocks: Sequence[BlockCfg]) -> None:
    writes: list[CgroupWrite] = []
    configured: set[str] = set()
    try:
        for block in blocks:
            number = resolve(block, inp.storage, None, inp)
            configured.add(number)
            writes.append(CgroupWrite(ROOT_DIR, COST_QOS, cost_qos_line(number, block.io_cfg), Level.QOS))
            writes.append(CgroupWrite(ROOT_DIR, COST_MODEL, cost_model_line(number, block.io_cfg), Level.QOS))
    except ValueError as exc:
        plan.problems["cgroupRoot"] = str(exc)
        return
    present = parse_device_lines(inp.current.get((ROOT_DIR, COST_QOS), ""))
    for number in sorted(set(present) - configured):
        if "enable=1" in present[number].split():
            writes.append(CgroupWrite(ROOT_DIR, COST_QOS, f"{number} enable=0", Level.QOS))
    plan.writes += writes


def pod_blkio(pod: PodInfo) -> BlkIOQOS | str | None:
    """The pod's annotation (None: absent; "" value: no blocks; str: why it is invalid)."""
    raw = pod.annotations.get(ANNOTATION_BLKIO_QOS)
    if raw is None:
        return None
    if raw.strip() == "":
        return BlkIOQOS(enable=True)
    try:
        parsed = BlkIOQOS.model_validate_json(raw)
    except ValueError as exc:
        return f"{ANNOTATION_BLKIO_QOS}: {str(exc).splitlines()[0]}"
    # the annotation's blocks apply as given (`enable` is a node-level switch)
    return parsed.model_copy(update={"enable": True})


def plan_blkio(inp: BlkioInputs) -> BlkioPlan:
    """BE class, root and annotated pods."""
    plan = BlkioPlan()
    root_plan = BlkioPlan()
    root = _class_blkio(inp.slo, "cgroup_root")
    if root is not None:
        _root(root_plan, inp, _blocks(root))
    plan.problems.update(root_plan.problems)
    # the disks' cost QoS on before the targets' weights, off after their resets
    switch_off = [w for w in root_plan.writes if str(w.value).endswith(" enable=0")]
    plan.writes += [w for w in root_plan.writes if not str(w.value).endswith(" enable=0")]
    cost_on = _cost_on(inp, plan.writes) if inp.weight_needs_cost_qos else None
    be = _class_blkio(inp.slo, "be_class")
    if be is not None:
        _target(plan, inp, "beClass", inp.be_dir, Level.QOS, _blocks(be), None, cost_on)
    for cls in ("lsr_class", "ls_class"):
        conf = _class_blkio(inp.slo, cls)
        if conf is not None and conf.enable is True and conf.blocks:
            plan.problems[cls] = "blkioQOS blocks are only supported for beClass and cgroupRoot"
    for uid in sorted(inp.pods):
        pod = inp.pods[uid]
        if pod.qos_raw is QoSClass.NONE or pod.phase != "Running":
            continue
        parsed = pod_blkio(pod)
        if parsed is None:
            continue
        if isinstance(parsed, str):
            plan.problems[pod.key] = parsed
            continue
        parent = inp.pod_dirs.get(uid)
        if parent is None:
            continue
        _target(plan, inp, pod.key, parent, Level.POD, _blocks(parsed), pod, cost_on)
    plan.writes += switch_off
    return plan


# -- the strategy as the QoS manager runs it -------------------------------------------------------------

STORAGE_REFRESH_SECONDS = 60.0  # disks and LVs change rarely; pod volume mounts are re-read every round


class BlkioReconcileStrategy:
    """BlkioReconcile: reads what the target files hold, plans, applies (cacheable) through the executor."""

    name = NAME

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._storage: LocalStorage | None = None
        self._storage_at = float("-inf")
        self.last_plan: BlkioPlan | None = None

    def enabled(self, config: AgentConfig) -> bool:
        """Gate BlkIOReconcile and a positive interval."""
        return config.gate("BlkIOReconcile") and config.qos.reconcile_interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """--reconcile-interval-seconds."""
        return config.qos.reconcile_interval_seconds

    def storage(self, env: StrategyEnv) -> LocalStorage:
        """The node's local storage (block devices re-scanned every minute, mounts every round)."""
        cfg = env.config.paths
        now = self.clock()
        if self._storage is None or now - self._storage_at >= STORAGE_REFRESH_SECONDS:
            self._storage = read_local_storage(cfg.sys_root, cfg.proc_root)
            self._storage_at = now
        else:
            self._storage = replace(self._storage, mount_device=read_mounts(cfg.proc_root))
        return self._storage

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        """Plan from the state, the storage and the files' current content; apply in target order."""
        layout, executor = env.layout, env.executor
        if state.node_slo is None:
            return
        if layout.version is CgroupVersion.V2 and not env.config.qos.blkio_v2_io_files:
            env.warn_once("blkio:v2", "blkio QoS is cgroup v1 only (--blkio-v2-io-files=false): idle")
            return
        be_dir = layout.qos_dir(KubeQoS.BESTEFFORT)
        pod_dirs: dict[str, str] = {}
        for uid, pod in state.pods.items():
            if ANNOTATION_BLKIO_QOS in pod.annotations and pod.phase == "Running":
                with contextlib.suppress(KoordQoSError):
                    pod_dirs[uid] = layout.pod_dir(pod)
        current: dict[tuple[str, str], str] = {}
        for parent in (be_dir, *pod_dirs.values()):
            for resource in THROTTLE_FILES:
                text = executor.read(parent, resource)
                if text is not None:
                    current[(parent, resource)] = text
        text = executor.read(ROOT_DIR, COST_QOS)
        if text is not None:
            current[(ROOT_DIR, COST_QOS)] = text
        claims: dict[tuple[str, str], str] = {}  # the PVC watch's bindings (kube/pvc.py)
        for key, volume in state.volume_claims.items():
            ns, _, claim = key.partition("/")
            claims[(ns, claim)] = volume
        inp = BlkioInputs(
            state.node_slo,
            self.storage(env),
            state.pods,
            be_dir,
            pod_dirs,
            current,
            pvc_volumes=claims,
            weight_needs_cost_qos=layout.version is CgroupVersion.V2,
        )
        plan = plan_blkio(inp)
        self.last_plan = plan
        for key, msg in plan.problems.items():
            INVALID_CONFIG.labels(NAME).inc()
            env.warn_once(f"blkio:{key}:{msg}", "blkio target skipped", target=key, error=msg)
        if plan.writes:
            await executor.apply_sequential(NAME, plan.writes, REASON)
