"""TCNetworkQoS planner (docs/network-qos.md, "tc") and the NodeSLO / annotation parsing it rests on."""

from __future__ import annotations

import json
from typing import Any

import pytest

from koordqos.errors import ModelError
from koordqos.host.tc import BE_CLASSID, LS_CLASSID, SYSTEM_CLASSID, HtbClass, parse_class_handles
from koordqos.model.netqos import (
    NetClass,
    class_value,
    net_class,
    netqos_config,
    pod_bandwidth,
    terway_prio,
)
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import PodInfo, parse_pod
from koordqos.model.qos import KubeQoS, QoSClass
from koordqos.strategies.tcqos import TcInputs, enabled, plan_tc, pod_minor
from tests.support.fake_objects import make_pod

M = 1_000_000


def slo(total: Any = "100M", policy: str | None = None, ls: Any = None, be: Any = None) -> Any:
    rqs: dict[str, Any] = {}
    if policy is not None:
        rqs["policies"] = {"netQOSPolicy": policy}
    if ls is not None:
        rqs["lsClass"] = {"networkQOS": ls}
    if be is not None:
        rqs["beClass"] = {"networkQOS": be}
    return parse_nodeslo(
        {"spec": {"systemStrategy": {"totalNetworkBandwidth": total}, "resourceQOSStrategy": rqs}}
    )


def pod(name: str, qos: str | None, ip: str = "", host_network: bool = False, **ann: str) -> PodInfo:
    raw = make_pod(name, "n1", qos=qos, uid=f"uid-{name}", annotations=dict(ann))
    raw["status"]["podIP"] = ip
    raw["spec"]["hostNetwork"] = host_network
    return parse_pod(raw)


def test_class_values_percent_or_quantity() -> None:
    assert class_value(30, 100 * M) == 30 * M
    assert class_value(101, 100 * M) == 0  # outside 0-100: koordlet counts 0
    assert class_value(-1, 100 * M) == 0
    assert class_value("20M", 100 * M) == 20 * M
    assert class_value(None, 100 * M) == 0
    with pytest.raises(ModelError):
        class_value("lots", 100 * M)


def test_config_from_the_nodeslo() -> None:
    cfg = netqos_config(
        slo(
            "100M",
            ls={"enable": True, "egressRequest": 50, "egressLimit": 100, "ingressRequest": "10M"},
            be={"enable": True, "egressRequest": "5M", "egressLimit": 20},
        )
    )
    assert cfg is not None
    assert cfg.policy == "tc"
    assert cfg.total == 100 * M
    assert (cfg.ls.egress_min, cfg.ls.egress_max, cfg.ls.ingress_min) == (50 * M, 100 * M, 10 * M)
    assert (cfg.be.egress_min, cfg.be.egress_max) == (5 * M, 20 * M)
    # the defaults: policy tc, total "0", every class off
    default = netqos_config(parse_nodeslo({"spec": {}}))
    assert default is not None
    assert default.policy == "tc"
    assert default.total == 0
    assert not default.ls.enabled
    assert not enabled(default)
    assert netqos_config(None) is None


def test_a_bad_class_value_is_a_problem_and_counts_zero() -> None:
    cfg = netqos_config(slo("100M", be={"enable": True, "egressLimit": "fast"}))
    assert cfg is not None
    assert cfg.be.egress_max == 0
    assert any("beClass.networkQOS.egress_limit" in p for p in cfg.problems)


def test_classes_and_priorities() -> None:
    assert net_class(QoSClass.SYSTEM) is NetClass.SYSTEM
    assert {net_class(q) for q in (QoSClass.LSE, QoSClass.LSR, QoSClass.LS)} == {NetClass.LS}
    assert net_class(QoSClass.BE) is NetClass.BE
    assert net_class(QoSClass.NONE) is NetClass.NONE
    assert [terway_prio(q, None) for q in (QoSClass.SYSTEM, QoSClass.LS, QoSClass.LSR, QoSClass.BE)] == [
        0,
        1,
        1,
        2,
    ]
    assert terway_prio(QoSClass.NONE, KubeQoS.GUARANTEED) == 1
    assert terway_prio(QoSClass.NONE, KubeQoS.BURSTABLE) == 1
    assert terway_prio(QoSClass.NONE, KubeQoS.BESTEFFORT) == 2
    assert terway_prio(QoSClass.NONE, None) == 0


def test_pod_annotation() -> None:
    key = "koordinator.sh/networkQOS"
    got = pod_bandwidth({key: json.dumps({"ingressLimit": "10M", "egressLimit": "20M"})})
    assert (got.ingress, got.egress, got.limited) == (10 * M, 20 * M, True)
    assert not pod_bandwidth({}).limited
    assert pod_bandwidth({key: json.dumps({"egressLimit": "1M"})}).ingress == 0
    for bad in ("{", "[]", json.dumps({"egressLimit": 5}), json.dumps({"egressLimit": "x"})):
        with pytest.raises(ModelError):
            pod_bandwidth({key: bad})


def test_plan_classes_ipsets_and_classids() -> None:
    cfg = netqos_config(
        slo(
            "100M",
            ls={"enable": True, "egressRequest": 40, "egressLimit": 100},
            be={"enable": True, "egressRequest": 10, "egressLimit": 30},
        )
    )
    pods = [
        pod("be", "BE", "198.18.0.10"),
        pod("ls", "LS", "198.18.0.11"),
        pod("lsr", "LSR", "198.18.0.12"),
        pod("sys", "SYSTEM", "198.18.0.13"),
        pod("none", None, "198.18.0.14"),
        pod("hostbe", "BE", "198.18.0.1", host_network=True),
    ]
    dirs = {p.uid: f"kubepods/pod{p.uid}" for p in pods}
    rnd = plan_tc(TcInputs(cfg, {p.uid: p for p in pods}, dirs, net_cls=True))
    assert rnd.plan is not None
    assert rnd.plan.classes == (
        HtbClass(1, 0, 100 * M, 100 * M),
        HtbClass(2, 1, 50 * M, 100 * M, 1),
        HtbClass(3, 1, 40 * M, 100 * M, 2),
        HtbClass(4, 1, 10 * M, 30 * M, 3),
    )
    assert rnd.plan.ipsets == {
        "system_class": frozenset({"198.18.0.13"}),
        "ls_class": frozenset({"198.18.0.11", "198.18.0.12"}),
        "be_class": frozenset({"198.18.0.10"}),  # the host-network pod's IP is the node's: not in a set
    }
    classids = {w.parent: w.value for w in rnd.writes}
    assert classids == {
        dirs["uid-be"]: BE_CLASSID,
        dirs["uid-ls"]: LS_CLASSID,
        dirs["uid-lsr"]: LS_CLASSID,
        dirs["uid-sys"]: SYSTEM_CLASSID,
        dirs["uid-hostbe"]: BE_CLASSID,
    }
    assert (BE_CLASSID, LS_CLASSID, SYSTEM_CLASSID) == (65540, 65539, 65538)
    # cgroup v2: no net_cls
    assert plan_tc(TcInputs(cfg, {p.uid: p for p in pods}, dirs, net_cls=False)).writes == []


def test_a_class_that_is_off_gets_no_guarantee_and_the_whole_nic() -> None:
    rnd = plan_tc(TcInputs(netqos_config(slo("100M")), {}, {}, net_cls=True))
    assert rnd.plan is not None
    assert rnd.plan.classes[1:] == (
        HtbClass(2, 1, 100 * M, 100 * M, 1),
        HtbClass(3, 1, 0, 100 * M, 2),
        HtbClass(4, 1, 0, 100 * M, 3),
    )


def test_pod_with_its_own_limit_gets_its_own_class_and_filter() -> None:
    limited = pod(
        "lim", "BE", "198.18.0.20", **{"koordinator.sh/networkQOS": json.dumps({"egressLimit": "8M"})}
    )
    host = pod(
        "hlim", "LS", "198.18.0.1", True, **{"koordinator.sh/networkQOS": json.dumps({"egressLimit": "2M"})}
    )
    pods = {p.uid: p for p in (limited, host)}
    dirs = {p.uid: f"kubepods/pod{p.uid}" for p in pods.values()}
    rnd = plan_tc(TcInputs(netqos_config(slo("100M")), pods, dirs, net_cls=True))
    assert rnd.plan is not None
    minor = rnd.pod_minors[limited.uid]
    assert minor == pod_minor(limited.uid, set())
    assert minor >= 0x10
    assert HtbClass(minor, 1, 8 * M, 8 * M, 3) in rnd.plan.classes
    [flt] = rnd.plan.pod_filters  # the host-network pod is classified by its classid only
    assert (flt.minor, flt.ip) == (minor, "198.18.0.20")
    classids = {w.parent: w.value for w in rnd.writes}
    assert classids[dirs[limited.uid]] == (1 << 16) | minor
    assert classids[dirs[host.uid]] == (1 << 16) | rnd.pod_minors[host.uid]
    assert "198.18.0.20" not in rnd.plan.ipsets["be_class"]
    # koordlet's units: the limit divided by 8 twice
    koord = plan_tc(TcInputs(netqos_config(slo("100M")), pods, dirs, net_cls=True, koordlet_units=True))
    assert koord.plan is not None
    assert HtbClass(minor, 1, 125_000, 125_000, 3) in koord.plan.classes


def test_minor_collisions_probe_to_the_next_free_one() -> None:
    first = pod_minor("a", set())
    assert first is not None
    assert pod_minor("a", {first}) == (first + 1 if first < 0xFFF0 else 0x10)


def test_not_enabled_plans_a_clean_up() -> None:
    pods = {p.uid: p for p in [pod("be", "BE", "198.18.0.10")]}
    assert plan_tc(TcInputs(netqos_config(slo("100M", policy="terway-qos")), pods, {}, True)).plan is None
    assert plan_tc(TcInputs(netqos_config(slo("0")), pods, {}, True)).plan is None  # unknown bandwidth
    assert plan_tc(TcInputs(None, pods, {}, True)).plan is None


def test_a_malformed_pod_annotation_is_a_problem_and_the_pod_keeps_its_class() -> None:
    bad = pod("bad", "BE", "198.18.0.30", **{"koordinator.sh/networkQOS": "{"})
    rnd = plan_tc(TcInputs(netqos_config(slo("100M")), {bad.uid: bad}, {}, True))
    assert rnd.plan is not None
    assert "198.18.0.30" in rnd.plan.ipsets["be_class"]
    assert "pod:uid-bad" in rnd.problems


def test_parse_class_handles() -> None:
    text = (
        "class htb 1:1 root rate 80Mbit ceil 80Mbit burst 1600b cburst 1600b \n"
        "class htb 1:2 parent 1:1 prio 1 rate 8bit ceil 80Mbit burst 225b cburst 1600b \n"
        "class htb 1:a3 parent 1:1 prio 3 rate 1Mbit ceil 1Mbit burst 1600b cburst 1600b \n"
    )
    assert parse_class_handles(text) == {"1:1": "root", "1:2": "1:1", "1:a3": "1:1"}
