"""TCNetworkQoS for real: the strategy shapes the default-route NIC of a network namespace the test made.

A veth pair joins a "node" namespace (default route through the veth) and a "peer" namespace. The pods' IPs
are addresses on the node side; the strategy runs with `--net-qos-netns` set to the node namespace, so its
`tc`, `ipset` and `iptables` commands run there (never on this machine's own interfaces). UDP senders bound
to the BE, LS and limited pods' IPs blast at the peer for a moment; what each class sent (`tc -s class show`)
and what the peer received per source show the classification and the shaping.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from koordqos.config import AgentConfig, QoSSettings
from koordqos.decisions import DecisionLog
from koordqos.host.tc import BE_CLASSID, LS_CLASSID
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import PodInfo, parse_pod
from koordqos.state import NodeState
from koordqos.strategies.tcqos import TCNetworkQoSStrategy
from koordqos.testing import netns
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.strategyenv import strategy_env
from tests.support.fake_objects import make_pod

BE_IP, LS_IP, LIM_IP = "198.18.0.10", "198.18.0.11", "198.18.0.12"
PORT = 5001
SECONDS = 1.5
MBIT = 1_000_000
TOTAL, BE_CEIL, LIM = 40 * MBIT, 4 * MBIT, 2 * MBIT


@pytest.fixture
def net() -> Iterator[netns.VethPair]:
    reason = netns.unavailable()
    if reason is None:
        missing = [t for t in ("ipset", "iptables") if shutil.which(t) is None]
        reason = f"{', '.join(missing)} not installed (.ci/run installs them)" if missing else None
    if reason is not None:
        pytest.skip(f"network namespace test: {reason}")
    with netns.VethPair(extra_ips=(BE_IP, LS_IP, LIM_IP)) as pair:
        yield pair


def nodeslo(policy: str = "tc", be_limit: int = 10) -> Any:
    return parse_nodeslo(
        {
            "spec": {
                "systemStrategy": {"totalNetworkBandwidth": "40M"},
                "resourceQOSStrategy": {
                    "policies": {"netQOSPolicy": policy},
                    "lsClass": {"networkQOS": {"enable": True, "egressRequest": 50, "egressLimit": 100}},
                    "beClass": {"networkQOS": {"enable": True, "egressRequest": 0, "egressLimit": be_limit}},
                },
            }
        }
    )


def pod(name: str, qos: str, ip: str, **ann: str) -> PodInfo:
    raw = make_pod(name, "n1", qos=qos, uid=f"0000{name}-0000-4000-8000-000000000001", annotations=dict(ann))
    raw["status"]["podIP"] = ip
    return parse_pod(raw)


def class_bytes(net: netns.VethPair) -> dict[str, int]:
    """`tc -s class show`: bytes each class sent."""
    out = net.run(net.node, ["tc", "-s", "class", "show", "dev", net.node_dev])
    got: dict[str, int] = {}
    handle = ""
    for line in out.splitlines():
        m = re.match(r"class htb (\S+) ", line)
        if m:
            handle = m.group(1)
        m = re.match(r"\s*Sent (\d+) bytes", line)
        if m and handle:
            got[handle] = int(m.group(1))
    return got


def blast(net: netns.VethPair, sources: tuple[str, ...] = (BE_IP, LS_IP, LIM_IP)) -> dict[str, int]:
    """The pods at `sources` send UDP at once for SECONDS; bytes the peer received, by source IP."""
    receiver = net.python(net.peer, netns.RECEIVER, netns.PEER_IP, str(PORT), str(SECONDS + 1.5))
    assert receiver.stdout is not None
    assert receiver.stdout.readline().strip() == "ready"
    senders = [
        net.python(net.node, netns.SENDER, ip, netns.PEER_IP, str(PORT), str(SECONDS)) for ip in sources
    ]
    for s in senders:
        s.communicate(timeout=30)
        assert s.returncode == 0
    out, err = receiver.communicate(timeout=30)
    assert receiver.returncode == 0, err
    got: dict[str, int] = json.loads(out.strip().splitlines()[-1])
    return got


async def test_tc_classes_classify_and_shape_pod_traffic_in_a_netns(
    net: netns.VethPair, tmp_path: Path
) -> None:
    node = SyntheticNode(tmp_path / "node")
    limited = pod("lim", "LS", LIM_IP, **{"koordinator.sh/networkQOS": json.dumps({"egressLimit": "2M"})})
    pods = [pod("be", "BE", BE_IP), pod("ls", "LS", LS_IP), limited]
    dirs = {p.uid: node.add_pod(p) for p in pods}
    config = AgentConfig(qos=QoSSettings(net_qos_netns=net.node), feature_gates={"TCNetworkQoS": True})
    env = strategy_env(node.layout, config=config)
    strategy = TCNetworkQoSStrategy()
    assert strategy.enabled(config)
    state = NodeState(pods={p.uid: p for p in pods}, node_slo=nodeslo())
    await strategy.run_once(state, env)

    report = strategy.last_report
    assert report is not None
    assert report.link == net.node_dev
    # only the cgroup classifier may be missing (a kernel without cls_cgroup): everything else took
    failed = {s.action for s in report.failures}
    assert failed <= {"filter-cgroup"}, report.failures
    assert strategy.last_round is not None
    minor = strategy.last_round.pod_minors[limited.uid]
    classes = class_bytes(net)
    assert {"1:1", "1:2", "1:3", "1:4", f"1:{minor:x}"} <= set(classes)
    assert BE_IP in net.run(net.node, ["ipset", "save", "be_class"])
    assert "CLASSIFY" in net.run(net.node, ["iptables", "-t", "mangle", "-S", "POSTROUTING"])
    assert node.read(dirs["0000be-0000-4000-8000-000000000001"], "net_cls", "net_cls.classid") == str(
        BE_CLASSID
    )
    assert node.read(dirs["0000ls-0000-4000-8000-000000000001"], "net_cls", "net_cls.classid") == str(
        LS_CLASSID
    )

    got = blast(net)
    sent = class_bytes(net)
    print("received by source:", got, "sent by class:", sent)
    # classification: each pod's traffic left through its own class
    assert sent["1:4"] >= got.get(BE_IP, 0) > 0
    assert sent["1:3"] >= got.get(LS_IP, 0) > 0
    assert sent[f"1:{minor:x}"] >= got.get(LIM_IP, 0) > 0
    # shaping: LS (prio 2, 20 Mbit guaranteed) takes the spare bandwidth before BE (prio 3, none guaranteed);
    # the limited pod is held at its 2 Mbit, everything together at the 40 Mbit total
    burst = 64 * 1024
    assert got[LS_IP] >= 3 * got[BE_IP]
    assert got[LIM_IP] <= LIM / 8 * (SECONDS + 1) + burst
    assert sum(got.values()) <= TOTAL / 8 * (SECONDS + 1) + burst
    # alone, BE gets its 4 Mbit ceiling and no more
    alone = blast(net, (BE_IP,))
    print("BE alone:", alone)
    assert BE_CEIL / 8 * SECONDS * 0.5 <= alone[BE_IP] <= BE_CEIL / 8 * (SECONDS + 1) + burst

    # a NodeSLO change converges: BE's ceiling raised to 50 % of the total
    await strategy.run_once(NodeState(pods=state.pods, node_slo=nodeslo(be_limit=50)), env)
    show = net.run(net.node, ["tc", "class", "show", "dev", net.node_dev])
    assert re.search(r"class htb 1:4 .*ceil 20Mbit", show), show
    # the limited pod leaves: its class and filter go
    rest = {p.uid: p for p in pods if p is not limited}
    await strategy.run_once(NodeState(pods=rest, node_slo=nodeslo(be_limit=50)), env)
    assert f"1:{minor:x}" not in class_bytes(net)
    assert LIM_IP not in net.run(net.node, ["ipset", "save", "ls_class"])

    # another policy: everything the strategy put on the NIC is removed
    await strategy.run_once(NodeState(pods=rest, node_slo=nodeslo(policy="terway-qos")), env)
    assert strategy.last_report is not None
    assert not strategy.last_report.failures
    assert "htb" not in net.run(net.node, ["tc", "qdisc", "show", "dev", net.node_dev])
    assert "CLASSIFY" not in net.run(net.node, ["iptables", "-t", "mangle", "-S", "POSTROUTING"])
    assert "be_class" not in net.run(net.node, ["ipset", "list", "-n"])


async def test_dry_run_leaves_the_nic_alone(net: netns.VethPair, tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    be = pod("be", "BE", BE_IP)
    node.add_pod(be)
    config = AgentConfig(
        qos=QoSSettings(net_qos_netns=net.node), feature_gates={"TCNetworkQoS": True}, dry_run=True
    )
    env = strategy_env(node.layout, DecisionLog(dry_run=True), config=config)
    strategy = TCNetworkQoSStrategy()
    await strategy.run_once(NodeState(pods={be.uid: be}, node_slo=nodeslo()), env)
    assert "htb" not in net.run(net.node, ["tc", "qdisc", "show", "dev", net.node_dev])
    assert strategy.last_report is None
    assert [d for d in env.decisions.recent(strategy="TCNetworkQoS") if d.strategy == "TCNetworkQoS"]


async def test_the_agent_process_shapes_the_namespace_it_is_given(
    net: netns.VethPair, tmp_path: Path
) -> None:
    """`python -m koordqos run --feature-gates=TCNetworkQoS=true --net-qos-netns=<ns>` in cluster mode (the
    fake API server: the node, its NodeSLO, a BE and an LS pod with their IPs): the namespace's NIC gets the
    classes and the pods' IPs their ipsets; on SIGTERM the agent exits 0."""
    from koordqos.testing.poll import wait_until
    from tests.support.agentproc import AgentLaunch, AsyncAgent, cluster_agent_argv, free_port
    from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodeslo

    server = FakeAPIServer()
    await server.start()
    node = SyntheticNode(tmp_path / "node")
    try:
        server.upsert("nodes", make_node("n1"))
        spec = {
            "systemStrategy": {"totalNetworkBandwidth": "40M"},
            "resourceQOSStrategy": {"beClass": {"networkQOS": {"enable": True, "egressLimit": 10}}},
        }
        server.upsert("nodeslos", make_nodeslo("n1", spec))
        for name, qos, ip in (("be", "BE", BE_IP), ("ls", "LS", LS_IP)):
            raw = make_pod(name, "n1", qos=qos, uid=f"0000{name}-0000-4000-8000-000000000002")
            raw["status"]["podIP"] = ip
            node.add_pod(parse_pod(raw))
            server.upsert("pods", raw)
        port = free_port()
        argv = cluster_agent_argv(
            server.write_kubeconfig(tmp_path / "kubeconfig"),
            "n1",
            node,
            port,
            "--enable-nri=false",
            "--feature-gates=TCNetworkQoS=true",
            f"--net-qos-netns={net.node}",
        )
        agent = await AsyncAgent(AgentLaunch(argv, tmp_path / "agent.log", port)).start()
        try:
            await agent.wait_ready(60)

            def shaped() -> bool:
                classes = net.run(net.node, ["tc", "class", "show", "dev", net.node_dev])
                sets = net.run(net.node, ["ipset", "save"]) if "1:4" in classes else ""
                return f"be_class {BE_IP}" in sets and f"ls_class {LS_IP}" in sets

            await wait_until(shaped, timeout=60, message="the agent's tc classes and ipsets in the namespace")
            show = net.run(net.node, ["tc", "class", "show", "dev", net.node_dev])
            assert re.search(r"class htb 1:4 .*ceil 4Mbit", show), show
        finally:
            code = await agent.stop(30)
        assert code == 0, agent.log_text()[-3000:]
    finally:
        await server.stop()
