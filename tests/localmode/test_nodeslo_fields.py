"""Every NodeSLO field a strategy acts on reaches it, end to end: the whole agent (local mode, the NodeSLO
file, pods from the mock NRI runtime) on a node in systemd's cgroup v1 layout; each field is given a value,
its effect is read from the node's files, the field is changed in the file, and the new effect is read.
A strategy that ignored its field (or read the default instead) fails here, not only in a unit test.

Fields and where they show (each checked twice, before and after the change):
| field | file |
|---|---|
| resourceUsedThresholdWithBE.cpuSuppressThresholdPercent | kubepods/besteffort cpu.cfs_quota_us |
| resourceUsedThresholdWithBE.cpuSuppressPolicy | kubepods/besteffort cpuset.cpus (cpuset policy) |
| cpuBurstStrategy.cpuBurstPercent | the LS container's cpu.cfs_burst_us |
| resourceQOSStrategy.lsClass.cpuQOS.groupIdentity | the LS pod's cpu.bvt_warp_ns |
| resourceQOSStrategy.beClass.cpuQOS.groupIdentity | the BE pod's cpu.bvt_warp_ns |
| resourceQOSStrategy.lsClass.memoryQOS.throttlingPercent | the LS container's memory.high |
| systemStrategy.minFreeKbytesFactor | /proc/sys/vm/min_free_kbytes |
| systemStrategy.watermarkScaleFactor | /proc/sys/vm/watermark_scale_factor |
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from koordqos.cgroups.layout import CgroupDriver
from koordqos.model.cpuset import parse_cpuset
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until

from .test_layout_matrix import GiB, Node, running

FIRST: dict[str, Any] = {
    "resourceUsedThresholdWithBE": {
        "enable": True,
        "cpuSuppressThresholdPercent": 65,
        "cpuSuppressPolicy": "cfsQuota",
    },
    "cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 200},
    "resourceQOSStrategy": {
        "lsClass": {
            "cpuQOS": {"enable": True, "groupIdentity": 2},
            "memoryQOS": {"enable": True, "throttlingPercent": 80},
        },
        "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}},
    },
    "systemStrategy": {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 200},
}


def changed(base: dict[str, Any], **paths: Any) -> dict[str, Any]:
    """`base` with the dotted paths set (`a__b__c=v` sets base[a][b][c])."""
    out = copy.deepcopy(base)
    for path, value in paths.items():
        *parents, leaf = path.split("__")
        d = out
        for p in parents:
            d = d[p]
        d[leaf] = value
    return out


SECOND = changed(
    FIRST,
    resourceUsedThresholdWithBE__cpuSuppressThresholdPercent=40,
    cpuBurstStrategy__cpuBurstPercent=300,
    resourceQOSStrategy__lsClass__cpuQOS__groupIdentity=1,
    resourceQOSStrategy__beClass__cpuQOS__groupIdentity=0,
    resourceQOSStrategy__lsClass__memoryQOS__throttlingPercent=60,
    systemStrategy__minFreeKbytesFactor=200,
    systemStrategy__watermarkScaleFactor=300,
)
THIRD = changed(SECOND, resourceUsedThresholdWithBE__cpuSuppressPolicy="cpuset")


class Reads:
    """What each field's strategy wrote, read from the node."""

    def __init__(self, n: Node) -> None:
        self.n = n
        self.be_qos = n.node.layout.qos_dirs()[2]

    def quota(self) -> int:
        return int(self.n.node.read(self.be_qos, "cpu", "cpu.cfs_quota_us"))

    def be_cpus(self) -> set[int]:
        return set(parse_cpuset(self.n.node.read(self.be_qos, "cpuset", "cpuset.cpus")))

    def burst(self) -> str:
        return self.n.node.read(self.n.ls_ctr, "cpu", "cpu.cfs_burst_us")

    def bvt(self, rel: str) -> str:
        return self.n.node.read(rel, "cpu", "cpu.bvt_warp_ns")

    def high(self) -> str:
        return self.n.node.read(self.n.ls_ctr, "memory", "memory.high")

    def sysctl(self, name: str) -> str:
        return (self.n.node.proc_root / "sys" / "vm" / name).read_text().strip()


def high_at(percent: int) -> str:
    """memory.high at `percent` of the LS container's 1 GiB limit, page aligned."""
    return str((GiB * percent // 100) // 4096 * 4096)


async def expect(what: str, check: Any, read: Any) -> None:
    await wait_until(check, timeout=15, message=f"{what} (read {read()!r})")


async def test_every_field_reaches_its_strategy(short_dir: Path) -> None:
    def prepare(node: SyntheticNode) -> None:
        node.add_sysctls()

    async with running(
        "v1-systemd",
        CgroupDriver.CGROUPFS,
        short_dir,
        nodeslo=FIRST,
        gates={"SystemConfig": True},
        prepare=prepare,
    ) as n:
        r = Reads(n)
        slo = short_dir / "nodeslo.json"
        kb = 16 * GiB // 1024  # the node's memory in kB

        # first values: 65 % of 4 CPUs = 2.6 cores for BE (nothing else busy), burst 200 % of 1 CPU, ...
        await expect("suppress at 65 %", lambda: 200_000 <= r.quota() <= 260_000, r.quota)
        await expect("burst 200 %", lambda: r.burst() == "200000", r.burst)
        await expect("LS groupIdentity 2", lambda: r.bvt(n.ls_pod) == "2", lambda: r.bvt(n.ls_pod))
        await expect("BE groupIdentity -1", lambda: r.bvt(n.be_pod) == "-1", lambda: r.bvt(n.be_pod))
        await expect("throttling 80 %", lambda: r.high() == high_at(80), r.high)
        mfk = lambda: r.sysctl("min_free_kbytes")  # noqa: E731
        await expect("minFreeKbytesFactor 100", lambda: mfk() == str(kb * 100 // 10000), mfk)
        wsf = lambda: r.sysctl("watermark_scale_factor")  # noqa: E731
        await expect("watermarkScaleFactor 200", lambda: wsf() == "200", wsf)

        # every field changed in the file: every effect follows
        slo.write_text(json.dumps(SECOND))
        await expect("suppress at 40 %: 1.6 cores", lambda: 100_000 <= r.quota() <= 160_000, r.quota)
        await expect("burst 300 %", lambda: r.burst() == "300000", r.burst)
        await expect("LS groupIdentity 1", lambda: r.bvt(n.ls_pod) == "1", lambda: r.bvt(n.ls_pod))
        await expect("BE groupIdentity 0", lambda: r.bvt(n.be_pod) == "0", lambda: r.bvt(n.be_pod))
        await expect("throttling 60 %", lambda: r.high() == high_at(60), r.high)
        await expect("minFreeKbytesFactor 200", lambda: mfk() == str(kb * 200 // 10000), mfk)
        await expect("watermarkScaleFactor 300", lambda: wsf() == "300", wsf)

        # the suppress policy: cpuset takes over from the quota (koordlet: the quota is lifted)
        slo.write_text(json.dumps(THIRD))
        await expect("cpuset policy: fewer BE CPUs", lambda: 0 < len(r.be_cpus()) < 4, r.be_cpus)
        await expect("cpuset policy: the quota lifted", lambda: r.quota() == -1, r.quota)
