"""Start-up misconfiguration (issue #15 items 6, 7): the agent process exits non-zero with one line naming
the problem and no traceback, or (a controller missing) stays up but unready with the reason."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest

from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until
from tests.support.agentproc import AgentLaunch, AsyncAgent, agent_argv, agent_env, free_port

pytestmark = pytest.mark.e2e


def _argv(node: SyntheticNode | None, tmp: Path, port: int, **roots: Path) -> list[str]:
    cgroup = roots.get("cgroup", node.cgroup_root if node else tmp / "cg")
    proc = roots.get("proc", node.proc_root if node else tmp / "proc")
    sys_root = roots.get("sys", node.sys_root if node else tmp / "sys")
    return agent_argv(
        "--cgroup-root",
        str(cgroup),
        "--proc-root",
        str(proc),
        "--sys-root",
        str(sys_root),
        "--nri-socket",
        str(tmp / "nri.sock"),
        "--http-addr",
        f"127.0.0.1:{port}",
        "--log-format",
        "json",
    )


def _one_line_exit(
    argv: list[str], tmp: Path, needle: str, code: int = 2, within: float = 20.0, only_line: bool = True
) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env=agent_env(home=tmp), check=False
    )
    took = time.monotonic() - started
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    if only_line:
        assert len(lines) == 1, proc.stderr
    # the error is the last line and the only one naming the problem; nothing was retried
    assert needle in lines[-1]
    assert [line for line in lines if needle in line] == [lines[-1]], proc.stderr
    assert "crashed" not in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert took < within  # interpreter start-up included; no retry loop
    return proc


@pytest.mark.parametrize("which", ["cgroup", "proc", "sys"])
def test_a_missing_root_exits_2_naming_the_path(tmp_path: Path, which: str) -> None:
    node = SyntheticNode(tmp_path / "node")
    missing = tmp_path / "does-not-exist"
    argv = _argv(node, tmp_path, free_port(), **{which: missing})
    _one_line_exit(argv, tmp_path, f"--{which}-root {missing}: does not exist")


def test_a_cgroup_root_without_a_hierarchy_exits_2(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_exit(
        _argv(node, tmp_path, free_port(), cgroup=empty), tmp_path, f"--cgroup-root {empty}: no cgroup"
    )


def _cgroup_files(node: SyntheticNode) -> dict[str, str]:
    """Every cgroup file of the synthetic node and what it holds (links not followed)."""
    out: dict[str, str] = {}
    for path in sorted(node.cgroup_root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(node.cgroup_root))] = path.read_text()
    return out


def _node_the_agent_acts_on(tmp: Path) -> tuple[SyntheticNode, list[str]]:
    """A node the agent acts on within its first second once its components run: CPU burst records the node's
    state, CPU suppress (enabled by the NodeSLO file, local mode) caps the besteffort quota. Returns the
    node and the NodeSLO flags."""
    node = SyntheticNode(tmp / "node")
    slo = tmp / "nodeslo.yaml"
    slo.write_text(
        "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata: {name: n}\n"
        "spec:\n  resourceUsedThresholdWithBE: {enable: true, cpuSuppressThresholdPercent: 65}\n"
    )
    return node, ["--nodeslo-file", str(slo)]


def test_http_address_in_use_exits_2_before_any_component_starts(tmp_path: Path) -> None:
    """#32 5f: the HTTP address is bound before any component starts: a taken port is one error line and
    exit 2, no component started, no cgroup file written (was: every component started, then the HTTP
    server failed among them)."""
    node, slo_flags = _node_the_agent_acts_on(tmp_path)
    before = _cgroup_files(node)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [*_argv(node, tmp_path, port), *slo_flags]
        proc = _one_line_exit(argv, tmp_path, f"--http-addr 127.0.0.1:{port}", code=2, only_line=False)
    assert "components starting" not in proc.stderr
    assert '"event": "decision"' not in proc.stderr
    assert _cgroup_files(node) == before


def test_a_taken_proxy_socket_exits_2_before_any_component_starts(tmp_path: Path) -> None:
    """#32 5f: the proxy socket (when enabled) is bound before any component starts: another process
    serving it is one error line and exit 2 (was: the proxy component crashed and restarted forever)."""
    node, slo_flags = _node_the_agent_acts_on(tmp_path)
    before = _cgroup_files(node)
    short = Path(tempfile.mkdtemp(prefix="kq-", dir="/tmp"))
    try:
        path = short / "koordlet.sock"
        with socket.socket(socket.AF_UNIX) as live:
            live.bind(str(path))
            live.listen()
            argv = [
                *_argv(node, tmp_path, free_port()),
                *slo_flags,
                "--enable-runtime-hooks-proxy",
                "--runtime-hooks-addr",
                str(path),
                "--runtime-hooks-config-path",
                str(short / "hookserver.d"),
            ]
            proc = _one_line_exit(argv, tmp_path, f"another process serves {str(path)!r}", only_line=False)
        assert "components starting" not in proc.stderr
        assert _cgroup_files(node) == before
        assert not (short / "hookserver.d" / "koordlet.json").exists()  # never registered
    finally:
        shutil.rmtree(short, ignore_errors=True)


async def test_a_missing_controller_keeps_readyz_503_with_the_reason(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    for sub in ("memory",):  # a v1 hierarchy without the memory controller
        shutil.rmtree(node.cgroup_root / sub)
    port = free_port()
    argv = [*_argv(node, tmp_path, port), "--feature-gates", "BEMemoryEvict=true"]
    proc = await AsyncAgent(AgentLaunch(argv, tmp_path / "agent.log", port, agent_env(home=tmp_path))).start()
    try:
        body: dict[str, object] = {}
        async with aiohttp.ClientSession() as session:

            async def answered() -> bool:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        body.update(await resp.json())
                        return resp.status == 503 and "synced" in body and len(body["synced"]) == 3  # type: ignore[arg-type]
                except aiohttp.ClientError:
                    return False

            await wait_until(answered, timeout=60, interval=0.1, message="/readyz answering")
        assert body["ready"] is False
        reason = str(body["not_ready"])
        assert "memory (needed by" in reason
        assert "BEMemoryEvict" in reason
        assert "BatchResource" in reason
        assert proc.returncode is None  # still running
    finally:
        await proc.stop(15)
    _ = json  # (json bodies parsed by aiohttp)


def test_a_controller_link_out_of_the_root_exits_2_naming_it(tmp_path: Path) -> None:
    """systemd's `cpu -> cpu,cpuacct` is followed once at start; a link that leads out of the cgroup root is a
    start-up error, before anything is written."""
    node = SyntheticNode(tmp_path / "node")
    elsewhere = tmp_path / "elsewhere"
    (node.cgroup_root / "cpu,cpuacct").rename(elsewhere)
    (node.cgroup_root / "cpu").unlink()
    (node.cgroup_root / "cpu").symlink_to(elsewhere)
    _one_line_exit(
        _argv(node, tmp_path, free_port()),
        tmp_path,
        f"cgroup controller cpu: {node.cgroup_root / 'cpu'} -> {elsewhere} leads outside the cgroup root",
    )


_KUBECONFIG_OK = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
"""


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing", "{kc}: does not exist"),
        ("directory", "{kc}: is a directory, not a kubeconfig file"),
        ("unparsable", "{kc}: not valid YAML at line 2"),
        ("not-a-mapping", "{kc}: not a kubeconfig"),
        ("no-current-context", "{kc}: no current-context"),
        ("unknown-current-context", "{kc}: current-context 'y' is not among its contexts ('x')"),
        ("cluster-without-server", "{kc}: cluster 'c' has no server"),
    ],
)
@pytest.mark.parametrize("given_by", ["--kubeconfig", "KUBECONFIG", "~/.kube/config"])
def test_an_unusable_kubeconfig_exits_2_with_one_line(
    tmp_path: Path, case: str, needle: str, given_by: str
) -> None:
    """#32 5e: a kubeconfig that cannot select a cluster is one line and exit 2 before anything starts
    (was: cluster mode, the reflectors retrying forever, the loader's plain-text lines in the JSON log)."""
    node = SyntheticNode(tmp_path / "node")
    home = tmp_path / "home"
    kc = home / ".kube" / "config" if given_by == "~/.kube/config" else tmp_path / "kubeconfig"
    kc.parent.mkdir(parents=True, exist_ok=True)
    if case == "directory":
        kc.mkdir()
    elif case == "unparsable":
        kc.write_text("clusters: [\n")
    elif case == "not-a-mapping":
        kc.write_text("- just a list\n")
    elif case == "no-current-context":
        kc.write_text(_KUBECONFIG_OK)
    elif case == "unknown-current-context":
        kc.write_text(_KUBECONFIG_OK + "current-context: y\n")
    elif case == "cluster-without-server":
        kc.write_text(
            _KUBECONFIG_OK.replace('server: "https://127.0.0.1:1"', "insecure: true") + "current-context: x\n"
        )
    if case == "missing" and given_by == "~/.kube/config":
        kc.symlink_to(tmp_path / "gone")  # a dangling link: found, but does not exist
    env = agent_env(home=home)
    argv = _argv(node, tmp_path, free_port())
    if given_by == "--kubeconfig":
        argv += ["--kubeconfig", str(kc)]
        where = f"--kubeconfig {kc}"
    elif given_by == "KUBECONFIG":
        env["KUBECONFIG"] = str(kc)
        where = f"KUBECONFIG {kc}"
    else:
        where = f"~/.kube/config ({kc})"
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    [line] = proc.stderr.splitlines()  # before anything is logged: the mode is not even announced
    assert line.startswith(f"koordqos: error: {needle.format(kc=where)}"), line


def test_a_kubeconfig_the_loader_refuses_exits_2_and_every_log_line_is_json(tmp_path: Path) -> None:
    """#32 5e: what only the loader finds (a client certificate that does not exist) exits 2 too, before any
    component starts; every line before the error is a JSON object (the loader's stdlib logging included)."""
    node = SyntheticNode(tmp_path / "node")
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        _KUBECONFIG_OK.replace(
            "{token: t}", f"{{client-certificate: {tmp_path}/no.crt, client-key: {tmp_path}/no.key}}"
        )
        + "current-context: x\n"
    )
    argv = [*_argv(node, tmp_path, free_port()), "--kubeconfig", str(kc)]
    # the agent is built (~4 s of CPU) before the loader runs: a loaded machine's budget, still no retry loop
    proc = _one_line_exit(argv, tmp_path, f"--kubeconfig {kc}: cannot load: ", within=45, only_line=False)
    *logged, last = proc.stderr.splitlines()
    assert last.startswith("koordqos: error: ")
    assert all(isinstance(json.loads(line), dict) for line in logged), logged
    assert "components starting" not in proc.stderr


async def test_a_koordlet_daemonsets_arguments_start_the_agent(tmp_path: Path) -> None:
    """#32 6: the koordlet chart's arguments (its cgroup root and address pointed at this test's) start the
    agent: koordlet's names and Go's flag syntax, the inert gate the chart turns on (Accelerators) and a
    koordlet flag without effect each warned about once, klog's --v=4 logging at debug."""
    node = SyntheticNode(tmp_path / "node")
    port = free_port()
    argv = agent_argv(
        f"-addr=127.0.0.1:{port}",
        f"-cgroup-root-dir={node.cgroup_root}/",
        "-feature-gates=BECPUEvict=true,BEMemoryEvict=true,CgroupReconcile=true,Accelerators=true",
        "-runtime-hooks-host-endpoint=/var/run/koordlet/koordlet.sock",
        "--logtostderr=true",
        "--v=4",
        "-enable-pprof",
        f"-proc-root-dir={node.proc_root}",
        f"-sys-root-dir={node.sys_root}",
        f"-var-run-root-dir={tmp_path}",
        "--log-format=json",
    )
    log_path = tmp_path / "agent.log"
    agent = await AsyncAgent(AgentLaunch(argv, log_path, port, agent_env(home=tmp_path))).start()
    try:
        await agent.wait_ready(60)
    finally:
        assert await agent.stop(15) == 0
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    gates = [
        line for line in lines if line["event"].startswith("feature gates on that koordqos does not act")
    ]
    assert [(g["not_implemented"], g["not_acted_on_yet"], g["level"]) for g in gates] == [
        ([], ["Accelerators"], "warning")
    ]
    flags = [line for line in lines if line["event"] == "koordlet flags with no effect in koordqos"]
    assert [f["flags"] for f in flags] == [["-enable-pprof=true"]]
    assert any(line["level"] == "debug" for line in lines)
    nri = [line for line in lines if line["event"] == "NRI runtime socket unavailable"]
    assert nri
    assert nri[0]["socket"] == str(tmp_path / "nri" / "nri.sock")  # -var-run-root-dir + nri/nri.sock
    started = [line for line in lines if line["event"] == "qos manager started"]
    assert "BECPUSuppress" in started[0]["enabled"]  # strategies log under their gate names


def test_an_unknown_feature_gate_exits_2_with_did_you_mean(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    argv = [*_argv(node, tmp_path, free_port()), "-feature-gates=CPUSuppress=true"]
    _one_line_exit(argv, tmp_path, "unknown feature gate 'CPUSuppress' (did you mean 'BECPUSuppress'?)")
