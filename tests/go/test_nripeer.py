"""koordqos's NRI replies as containerd/nri's real runtime code (`pkg/adaptation`, v0.12.5) receives them.

`tests/go/nripeer` plays the runtime with scripted pods and containers: Synchronize with an existing BE
container, then RunPodSandbox / CreateContainer / UpdateContainer for new pods. The agent runs as a real
subprocess in local mode on a synthetic node tree. What the adaptation merged is printed as JSON and
checked here, so a reply the real runtime code would drop, reject or misread fails the test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from koordqos.testing.nodefs import SyntheticNode
from tests.support.agentproc import AgentLaunch, AgentPopen, agent_argv, agent_env, free_port
from tests.support.gopeer import GoUnavailable, build, go_unavailable, run_peer

pytestmark = pytest.mark.e2e_runtime
HERE = Path(__file__).resolve().parent
RUN_ENV = "KOORDQOS_E2E_RUNTIME"
MI = 1 << 20
EXT = "node.koordinator.sh/extended-resource-spec"


@pytest.fixture(scope="module")
def peer() -> Path:
    reason = go_unavailable()
    if os.environ.get(RUN_ENV) != "1":
        here = f"; it would skip here too: {reason}" if reason else ""
        pytest.skip(f"real-runtime e2e: run `python -m nox -s e2e-runtime` (or set {RUN_ENV}=1){here}")
    if reason is not None:
        if os.environ.get("KOORDQOS_E2E_RUNTIME_REQUIRED") == "1":
            pytest.fail(f"e2e-runtime required but unavailable: {reason}", pytrace=False)
        pytest.skip(reason)
    try:
        return build(HERE / "nripeer")
    except GoUnavailable as exc:
        pytest.skip(str(exc))


def be_pod(pid: str, uid: str, names: tuple[str, ...] = ("main",)) -> dict[str, Any]:
    batch = {
        "requests": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": str(256 * MI)},
        "limits": {"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": str(256 * MI)},
    }
    spec = {"containers": dict.fromkeys(names, batch)}
    return {
        "id": pid,
        "name": pid,
        "uid": uid,
        "namespace": "conformance",
        "labels": {"koordinator.sh/qosClass": "BE"},
        "annotations": {EXT: json.dumps(spec)},
        "linux": {"cgroup_parent": f"/kubepods/besteffort/pod{uid}"},
    }


def lsr_pod(pid: str, uid: str) -> dict[str, Any]:
    return {
        "id": pid,
        "name": pid,
        "uid": uid,
        "namespace": "conformance",
        "labels": {"koordinator.sh/qosClass": "LSR"},
        "annotations": {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "1"})},
        "linux": {"cgroup_parent": f"/kubepods/pod{uid}"},
    }


def container(
    cid: str, pod: dict[str, Any], state: str = "CONTAINER_UNKNOWN", name: str = "main", **cpu: Any
) -> dict[str, Any]:
    return {
        "id": cid,
        "pod_sandbox_id": pod["id"],
        "name": name,
        "state": state,
        "linux": {
            "cgroups_path": f"{pod['linux']['cgroup_parent']}/{cid}",
            "resources": {
                "cpu": {"shares": {"value": "2"}, "period": {"value": "100000"}, **cpu},
                "memory": {},
            },
        },
    }


def run_script(
    peer: Path, tmp_path: Path, node: SyntheticNode, script: dict[str, Any], extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Run the agent (local mode, on `node`, with `extra` flags) against nripeer playing `script`; nripeer's
    JSON output."""
    script_path = tmp_path / "script.json"
    script_path.write_text(json.dumps(script))
    sock = (
        Path("/tmp") / f"kqpeer-{os.getpid()}.sock"
    )  # pytest's tmp_path can exceed a socket path's 107 bytes

    def start() -> AgentPopen:
        port = free_port()
        cmd = agent_argv(
            "--nri-socket",
            str(sock),
            *node.root_flags(),
            "--http-addr",
            f"127.0.0.1:{port}",
            "--log-format",
            "json",
            *extra,
        )
        env = agent_env(home=tmp_path)  # local mode
        return AgentPopen(AgentLaunch(cmd, tmp_path / "agent.log", port, env)).start()

    try:
        out = run_peer(peer, sock, ["-script", str(script_path)], start)
    except RuntimeError:
        print((tmp_path / "agent.log").read_text()[-4000:])
        raise
    finally:
        sock.unlink(missing_ok=True)
    return out


BATCH = {"shares": "1536", "quota": "200000", "memory": str(256 * MI)}


def values(res: dict[str, Any]) -> dict[str, str]:
    """The batch-resource fields of an NRI LinuxResources as nripeer prints it."""
    return {
        "shares": res["cpu"]["shares"]["value"],
        "quota": res["cpu"]["quota"]["value"],
        "memory": res["memory"]["limit"]["value"],
    }


def test_koordqos_replies_through_the_real_adaptation(peer: Path, tmp_path: Path) -> None:
    old = be_pod("old-sandbox", "0000aaaa-0000-4000-8000-000000000001")
    new = be_pod("new-sandbox", "0000aaaa-0000-4000-8000-000000000002")
    lsr = lsr_pod("lsr-sandbox", "0000aaaa-0000-4000-8000-000000000003")
    old_ctr = container("a" * 64, old, "CONTAINER_RUNNING")
    new_ctr = container("b" * 64, new)
    lsr_ctr = container("c" * 64, lsr)
    script = {
        "pods": [old, new, lsr],
        "containers": [old_ctr],
        "steps": [
            {"call": "RunPodSandbox", "pod": new["id"]},
            {"call": "CreateContainer", "pod": new["id"], "container": new_ctr},
            {
                "call": "UpdateContainer",
                "pod": new["id"],
                "container": new_ctr["id"],
                "resources": {"cpu": {"shares": {"value": "2"}}},
            },
            {"call": "RunPodSandbox", "pod": lsr["id"]},
            {"call": "CreateContainer", "pod": lsr["id"], "container": lsr_ctr},
        ],
    }
    node = SyntheticNode(tmp_path / "node")
    for p in (old, new):
        node.make_cgroup(f"kubepods/besteffort/pod{p['uid']}")
    node.make_cgroup(f"kubepods/pod{lsr['uid']}")
    out = run_script(peer, tmp_path, node, script)
    # Synchronize: the existing BE container, created without koordqos, is corrected
    [sync] = out["synchronize_updates"]
    assert sync["container_id"] == old_ctr["id"]
    assert values(sync["linux"]["resources"]) == BATCH

    _, create_new, update_new, _, create_lsr = out["results"]
    assert [r.get("error", "") for r in out["results"]] == [""] * 5
    assert values(create_new["response"]["adjust"]["linux"]["resources"]) == BATCH
    # UpdateContainer: the runtime's own entry for the container carries the batch values again
    [upd] = update_new["response"]["update"]
    assert upd["container_id"] == new_ctr["id"]
    assert values(upd["linux"]["resources"]) == BATCH
    # LSR: pinned to the scheduler's cpuset, CFS quota lifted
    lsr_res = create_lsr["response"]["adjust"]["linux"]["resources"]
    assert lsr_res["cpu"]["cpus"] == "1"
    assert lsr_res["cpu"]["quota"]["value"] == "-1"


def test_a_large_synchronize_through_the_real_adaptation(peer: Path, tmp_path: Path) -> None:
    """A Synchronize of 40 BE pods x 40 running containers (≈ 0.5 MB in one chunk: the mux streams the large
    frame, the ttrpc decoder hands the message over, the envelope is split around its payload) as the real
    runtime code frames it: every container corrected, and the calls after it answered."""
    names = tuple(f"c{j}" for j in range(40))
    pods = [be_pod(f"sync-{i:02d}", f"0000bbbb-0000-4000-8000-{i:012d}", names) for i in range(40)]
    ctrs = [
        container(f"{i:04x}{j:04x}".ljust(64, "e"), pod, "CONTAINER_RUNNING", name)
        for i, pod in enumerate(pods)
        for j, name in enumerate(names)
    ]
    new = be_pod("new-sandbox", "0000bbbb-0000-4000-8000-100000000000")
    new_ctr = container("f" * 64, new)
    script = {
        "pods": [*pods, new],
        "containers": ctrs,
        "steps": [
            {"call": "RunPodSandbox", "pod": new["id"]},
            {"call": "CreateContainer", "pod": new["id"], "container": new_ctr},
        ],
    }
    assert len(json.dumps(script)) > 500_000  # the Synchronize is far above the 64 KiB hand-over size
    node = SyntheticNode(tmp_path / "node")
    for p in [*pods, new]:
        node.make_cgroup(f"kubepods/besteffort/pod{p['uid']}")
    out = run_script(peer, tmp_path, node, script)

    updates = out["synchronize_updates"]
    assert sorted(u["container_id"] for u in updates) == sorted(c["id"] for c in ctrs)
    assert all(values(u["linux"]["resources"]) == BATCH for u in updates)
    assert [r.get("error", "") for r in out["results"]] == ["", ""]
    assert values(out["results"][1]["response"]["adjust"]["linux"]["resources"]) == BATCH
