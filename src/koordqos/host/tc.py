"""Traffic control on the default-route NIC (docs/network-qos.md, "tc"): the plan's HTB classes, filters,
ipsets.

The intent is a whole `TcPlan` (or `clean`): iproute2's `tc`, `ipset` and `iptables` are run as subprocesses,
synchronously (the strategy runs `TcShaper.apply` in a worker thread). `NetCommands.prefix` runs each one in
another network namespace (`ip netns exec <ns>`; `--net-qos-netns`): the tests shape a veth in a namespace
they made, never the host's NICs.

What is left in place: the HTB root qdisc `1:` (default class `1:2`), the classes `1:1` (root) `1:2`
(system) `1:3` (LS) `1:4` (BE) and one class per pod with a limit of its own, cgroup filters (net_cls
classid, prio 1–3), one u32 source-IP filter per limited pod (pref = the class minor), the ipsets
`system_class` / `ls_class` / `be_class` (pod IPs) and one `mangle POSTROUTING` CLASSIFY rule per set.
Every step is idempotent; a failed step is reported (`TcStep.error`) and the others still run, so a kernel
without the cgroup classifier (`cls_cgroup`) still gets its classes, ipsets and CLASSIFY rules.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAJOR = 1
ROOT_MINOR = 1
SYSTEM_MINOR = 2
LS_MINOR = 3
BE_MINOR = 4
FIXED_MINORS = frozenset({ROOT_MINOR, SYSTEM_MINOR, LS_MINOR, BE_MINOR})
#: the net_cls.classid of each class (major << 16 | minor): koordlet's 65538 / 65539 / 65540
SYSTEM_CLASSID = MAJOR << 16 | SYSTEM_MINOR
LS_CLASSID = MAJOR << 16 | LS_MINOR
BE_CLASSID = MAJOR << 16 | BE_MINOR
MIN_RATE_BITS = 8  # HTB refuses a zero rate: a class without a guarantee gets the smallest one
IPSETS = {"system_class": SYSTEM_MINOR, "ls_class": LS_MINOR, "be_class": BE_MINOR}
COMMAND_TIMEOUT = 10.0


def classid(minor: int) -> int:
    """A class's net_cls.classid value."""
    return MAJOR << 16 | minor


@dataclass(frozen=True, slots=True)
class HtbClass:
    """One HTB class `1:<minor>` under `1:<parent>` (parent 0: the qdisc), rates in bit/s."""

    minor: int
    parent: int
    rate: int
    ceil: int
    prio: int | None = None

    @property
    def handle(self) -> str:
        """`1:<minor in hex>`, as tc names classes."""
        return f"{MAJOR}:{self.minor:x}"


@dataclass(frozen=True, slots=True)
class PodFilter:
    """A u32 filter sending a pod's source IP to its own class (pref = the class minor)."""

    minor: int
    ip: str


@dataclass(frozen=True, slots=True)
class TcPlan:
    """Everything the NIC should carry. `cgroup_filters`: (prio, minor) of the net_cls classid filters."""

    classes: tuple[HtbClass, ...]
    cgroup_filters: tuple[tuple[int, int], ...] = ()
    pod_filters: tuple[PodFilter, ...] = ()
    ipsets: Mapping[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TcStep:
    """One command's outcome: what it did (`action`, `target`) and its error ("" when it succeeded)."""

    action: str
    target: str
    error: str = ""

    @property
    def ok(self) -> bool:
        """Whether the command succeeded."""
        return not self.error


@dataclass
class TcReport:
    """The steps of one apply or clean, in order, and the NIC they ran on."""

    link: str = ""
    steps: list[TcStep] = field(default_factory=list)

    @property
    def failures(self) -> list[TcStep]:
        """The steps that failed."""
        return [s for s in self.steps if not s.ok]


@dataclass(frozen=True)
class NetCommands:
    """Runs iproute2 / ipset / iptables, optionally in the network namespace `netns` (`ip netns exec`)."""

    netns: str = ""
    timeout: float = COMMAND_TIMEOUT

    def run(self, argv: Sequence[str]) -> tuple[int, str, str]:
        """(exit code, stdout, stderr); a missing binary or a time-out is exit code 127 / 124."""
        prefix = ("ip", "netns", "exec", self.netns) if self.netns else ()
        try:
            proc = subprocess.run(
                [*prefix, *argv], capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except FileNotFoundError as exc:
            return 127, "", f"{exc.filename}: not installed"
        except subprocess.TimeoutExpired:
            return 124, "", f"timed out after {self.timeout:g}s"
        return proc.returncode, proc.stdout, proc.stderr.strip()


def default_route_link(cmds: NetCommands) -> tuple[str, str]:
    """(the NIC of the IPv4 default route, "") or ("", the reason there is none)."""
    rc, out, err = cmds.run(["ip", "-j", "route", "show", "default"])
    if rc != 0:
        return "", f"ip route: {err or rc}"
    try:
        routes = json.loads(out or "[]")
    except ValueError:
        return "", "ip route: unreadable output"
    for route in routes:
        dev = route.get("dev") if isinstance(route, dict) else None
        if isinstance(dev, str) and dev:
            return dev, ""
    return "", "no default route"


def _json(out: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(out or "[]")
    except ValueError:
        return []
    return [d for d in doc if isinstance(d, dict)] if isinstance(doc, list) else []


def parse_class_handles(text: str) -> dict[str, str]:
    """`tc class show` → {handle: parent} ("root" for a class at the qdisc)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) < 3 or words[0] != "class":
            continue
        handle = words[2]
        if "root" in words[3:4]:
            out[handle] = "root"
        elif "parent" in words:
            out[handle] = words[words.index("parent") + 1]
    return out


def parse_ipset_members(text: str) -> set[str]:
    """`ipset save <set>` → its members."""
    out = set()
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "add":
            out.add(words[2])
    return out


def _ip_hex(ip: str) -> str:
    parts = ip.split(".")
    return "".join(f"{int(p):02x}" for p in parts)


class TcShaper:
    """Brings the default-route NIC to a `TcPlan`, or removes what a plan put there (`clean`)."""

    def __init__(self, cmds: NetCommands | None = None) -> None:
        self.cmds = cmds or NetCommands()

    def _step(self, report: TcReport, action: str, target: str, argv: Sequence[str]) -> bool:
        rc, _, err = self.cmds.run(argv)
        report.steps.append(TcStep(action, target, "" if rc == 0 else (err or f"exit {rc}")))
        return rc == 0

    def _read(self, argv: Sequence[str]) -> str | None:
        rc, out, _ = self.cmds.run(argv)
        return out if rc == 0 else None

    def apply(self, plan: TcPlan) -> TcReport:
        """Qdisc, classes, filters, ipsets and CLASSIFY rules as the plan says; stale pod classes removed."""
        report = TcReport()
        dev, why = default_route_link(self.cmds)
        if not dev:
            report.steps.append(TcStep("find-link", "default route", why))
            return report
        report.link = dev
        self._qdisc(report, dev)
        self._classes(report, dev, plan)
        self._ipsets(report, plan)
        self._classify(report)
        return report

    def _qdisc(self, report: TcReport, dev: str) -> None:
        qdiscs = _json(self._read(["tc", "-j", "qdisc", "show", "dev", dev]) or "[]")
        root = next((q for q in qdiscs if q.get("root")), None)
        if root is not None and root.get("kind") == "htb" and root.get("handle") == f"{MAJOR}:":
            return
        add = ["tc", "qdisc", "replace", "dev", dev, "root", "handle", f"{MAJOR}:", "htb", "default"]
        if self._step(report, "qdisc-add", f"{dev} root {MAJOR}: htb", [*add, str(SYSTEM_MINOR)]):
            return
        # another root qdisc that cannot be replaced in place (a different kind on handle 1:)
        report.steps.pop()
        self._step(report, "qdisc-del", f"{dev} root", ["tc", "qdisc", "del", "dev", dev, "root"])
        self._step(report, "qdisc-add", f"{dev} root {MAJOR}: htb", [*add, str(SYSTEM_MINOR)])

    def _classes(self, report: TcReport, dev: str, plan: TcPlan) -> None:
        filters = _json(self._read(["tc", "-j", "filter", "show", "dev", dev, "parent", f"{MAJOR}:"]) or "[]")
        want_pod = {f.minor: f for f in plan.pod_filters}
        have_pod: dict[int, str] = {}  # pref -> "flowid match" of our u32 filters
        have_cgroup: set[int] = set()
        for f in filters:
            pref = f.get("pref")
            if not isinstance(pref, int):
                continue
            if f.get("kind") == "cgroup":
                have_cgroup.add(pref)
            opts = f.get("options") or {}
            if f.get("kind") == "u32" and isinstance(opts, dict) and "flowid" in opts:
                match = opts.get("match") or {}
                have_pod[pref] = (
                    f"{opts['flowid']} {match.get('value', '') if isinstance(match, dict) else ''}"
                )
        # stale or changed pod filters first: a class a filter points at cannot be deleted
        for pref, what in sorted(have_pod.items()):
            want = want_pod.get(pref)
            if want is None or what != f"{MAJOR}:{want.minor:x} {_ip_hex(want.ip)}":
                self._step(
                    report,
                    "filter-del",
                    f"{dev} pref {pref}",
                    ["tc", "filter", "del", "dev", dev, "parent", f"{MAJOR}:", "pref", str(pref)],
                )
                have_pod.pop(pref)
        want_handles = {c.handle for c in plan.classes}
        existing = parse_class_handles(self._read(["tc", "class", "show", "dev", dev]) or "")
        for handle, parent in sorted(existing.items()):
            if parent == f"{MAJOR}:{ROOT_MINOR}" and handle not in want_handles:
                self._step(
                    report,
                    "class-del",
                    f"{dev} {handle}",
                    ["tc", "class", "del", "dev", dev, "classid", handle],
                )
        for c in plan.classes:
            parent = f"{MAJOR}:" if c.parent == 0 else f"{MAJOR}:{c.parent:x}"
            argv = ["tc", "class", "replace", "dev", dev, "parent", parent, "classid", c.handle, "htb"]
            argv += [
                "rate",
                f"{max(c.rate, MIN_RATE_BITS)}bit",
                "ceil",
                f"{max(c.ceil, c.rate, MIN_RATE_BITS)}bit",
            ]
            if c.prio is not None:
                argv += ["prio", str(c.prio)]
            self._step(report, "class", f"{dev} {c.handle} rate={c.rate} ceil={c.ceil}", argv)
        for prio, minor in plan.cgroup_filters:
            if prio in have_cgroup:
                continue
            self._step(
                report,
                "filter-cgroup",
                f"{dev} prio {prio}",
                [
                    "tc",
                    "filter",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    f"{MAJOR}:",
                    "protocol",
                    "ip",
                    "prio",
                    str(prio),
                    "handle",
                    f"{minor}:",
                    "cgroup",
                ],
            )
        for minor, pf in sorted(want_pod.items()):
            if minor in have_pod:
                continue
            self._step(
                report,
                "filter-pod",
                f"{dev} {pf.ip} -> {MAJOR}:{minor:x}",
                [
                    "tc",
                    "filter",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    f"{MAJOR}:",
                    "protocol",
                    "ip",
                    "pref",
                    str(minor),
                    "u32",
                    "match",
                    "ip",
                    "src",
                    f"{pf.ip}/32",
                    "flowid",
                    f"{MAJOR}:{minor:x}",
                ],
            )

    def _ipsets(self, report: TcReport, plan: TcPlan) -> None:
        for name in IPSETS:
            if not self._step(report, "ipset-create", name, ["ipset", "create", "-exist", name, "hash:ip"]):
                continue
            have = parse_ipset_members(self._read(["ipset", "save", name]) or "")
            want = plan.ipsets.get(name, frozenset())
            for ip in sorted(want - have):
                self._step(report, "ipset-add", f"{name} {ip}", ["ipset", "add", "-exist", name, ip])
            for ip in sorted(have - want):
                self._step(report, "ipset-del", f"{name} {ip}", ["ipset", "del", "-exist", name, ip])

    @staticmethod
    def _rule(name: str, minor: int) -> list[str]:
        return [
            "POSTROUTING",
            "-m",
            "set",
            "--match-set",
            name,
            "src",
            "-j",
            "CLASSIFY",
            "--set-class",
            f"{MAJOR}:{minor}",
        ]

    def _classify(self, report: TcReport) -> None:
        for name, minor in IPSETS.items():
            rule = self._rule(name, minor)
            rc, _, _ = self.cmds.run(["iptables", "-w", "-t", "mangle", "-C", *rule])
            if rc != 0:
                self._step(report, "iptables-add", name, ["iptables", "-w", "-t", "mangle", "-A", *rule])

    def clean(self) -> TcReport:
        """Remove the HTB root qdisc `1:` (its classes and filters go with it), the CLASSIFY rules and the
        ipsets; what is not there is left alone."""
        report = TcReport()
        dev, why = default_route_link(self.cmds)
        if dev:
            report.link = dev
            qdiscs = _json(self._read(["tc", "-j", "qdisc", "show", "dev", dev]) or "[]")
            if any(
                q.get("root") and q.get("kind") == "htb" and q.get("handle") == f"{MAJOR}:" for q in qdiscs
            ):
                self._step(report, "qdisc-del", f"{dev} root", ["tc", "qdisc", "del", "dev", dev, "root"])
        for name, minor in IPSETS.items():
            rule = self._rule(name, minor)
            for _ in range(8):  # a rule added twice by someone: remove every copy, boundedly
                rc, _, _ = self.cmds.run(["iptables", "-w", "-t", "mangle", "-C", *rule])
                if rc != 0:
                    break
                self._step(report, "iptables-del", name, ["iptables", "-w", "-t", "mangle", "-D", *rule])
        for name in IPSETS:
            rc, _, _ = self.cmds.run(["ipset", "list", "-n", name])
            if rc == 0:
                self._step(report, "ipset-destroy", name, ["ipset", "destroy", name])
        if not dev and why:
            report.steps.append(TcStep("find-link", "default route", why))
        return report
