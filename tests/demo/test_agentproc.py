"""The agent command line the demo runs."""

from __future__ import annotations

from pathlib import Path

from koordqos.demo.agentproc import AgentSpec


def test_agent_command_runs_local_mode_with_only_cpu_suppress(tmp_path: Path) -> None:
    spec = AgentSpec(
        cgroup_root=tmp_path / "cg",
        nri_socket=tmp_path / "nri.sock",
        nodeslo_file=tmp_path / "slo.json",
        log_file=tmp_path / "agent.log",
        interval=0.5,
        launcher=["nsexec", "--"],
    )
    cmd = spec.command()
    assert cmd[:2] == ["nsexec", "--"]
    assert cmd[cmd.index("--cgroup-root") + 1] == str(tmp_path / "cg")
    assert cmd[cmd.index("--cpu-suppress-interval-seconds") + 1] == "0.5"
    assert cmd[cmd.index("--collect-interval") + 1] == "0.5"
    gates = next(c for c in cmd if c.startswith("--feature-gates="))
    assert "BECPUSuppress=true" in gates
    assert "CPUBurst=false" in gates
    assert "--kubeconfig" not in cmd
    env = spec.env()
    assert "KUBECONFIG" not in env
    assert env["HOME"] == str(tmp_path)
    from koordqos.cli import build_parser

    args = build_parser().parse_args(cmd[cmd.index("run") :])  # the agent's own parser accepts it
    assert args.command == "run"
