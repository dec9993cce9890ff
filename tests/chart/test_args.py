"""The DaemonSet's command line is one the agent accepts, and it points at the paths the pod mounts."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import pytest

from koordqos.cli import build_parser
from koordqos.config import AgentConfig
from koordqos.configload import load_config

from .chart_render import Rendered, render


def _config(rendered: Rendered) -> AgentConfig:
    """Parse the container's args with the real CLI parser and build the agent's config from them."""
    container = rendered.container
    assert container["command"] == ["python", "-m", "koordqos"]
    args = container["args"]
    assert args[0] == "run"
    parsed = build_parser().parse_args(args)
    assert parsed.command == "run"
    env = {e["name"]: e.get("value", "") for e in container["env"] if "value" in e}
    env["NODE_NAME"] = "node-1"  # the downward API fills this in on the node
    return load_config(parsed, env=env)


def _mount_paths(rendered: Rendered) -> set[Path]:
    return {Path(m["mountPath"]) for m in rendered.container["volumeMounts"]}


def test_default_args_are_accepted(default_render: Rendered) -> None:
    cfg = _config(default_render)
    assert cfg.node_name == "node-1"
    assert cfg.dry_run is False
    assert cfg.log.format == "json"
    assert cfg.log.level == "info"
    assert cfg.nri.enabled is True
    assert cfg.nri.plugin_index == "00"
    assert cfg.nri.plugin_name == "koordqos"
    assert cfg.hooks.proxy_enabled is False
    assert cfg.hooks.failure_policy == "Ignore"
    assert cfg.server.http_addr == "0.0.0.0:9316"
    assert cfg.shutdown_timeout_seconds == 5
    # No --feature-gates flag: the agent's defaults apply.
    assert cfg.feature_gates == AgentConfig().feature_gates


def test_non_default_args_are_accepted(custom_render: Rendered) -> None:
    cfg = _config(custom_render)
    assert cfg.dry_run is True
    assert cfg.log.format == "console"
    assert cfg.log.level == "debug"
    assert cfg.nri.plugin_index == "07"  # the integer 7 was padded to two digits
    assert cfg.nri.plugin_name == "koordqos-test"
    assert cfg.hooks.failure_policy == "Fail"
    assert cfg.hooks.proxy_enabled is True
    assert cfg.server.http_addr == "0.0.0.0:19316"
    assert cfg.server.debug_endpoints is True
    assert cfg.kube.eviction_qps == 2  # from extraArgs
    assert cfg.metrics.collect_interval_seconds == 2  # from extraEnv (KOORDQOS_COLLECT_INTERVAL)
    assert cfg.shutdown_timeout_seconds == 8
    assert cfg.gate("CPUBurst") is False
    assert cfg.gate("BECPUEvict") is True
    assert cfg.gate("BEMemoryEvict") is True
    # terminationGracePeriodSeconds leaves the agent time to finish its own graceful stop.
    assert custom_render.pod_spec["terminationGracePeriodSeconds"] > cfg.shutdown_timeout_seconds


def test_host_roots_are_the_mounted_paths(any_render: Rendered) -> None:
    cfg = _config(any_render)
    mounts = _mount_paths(any_render)
    assert cfg.paths.cgroup_root in mounts
    assert cfg.paths.proc_root in mounts
    assert cfg.paths.sys_root in mounts
    assert cfg.nri.socket.parent in mounts
    if cfg.hooks.proxy_enabled:
        assert cfg.hooks.proxy_addr.parent in mounts
        assert cfg.hooks.proxy_config_path in mounts


def test_nri_disabled_is_accepted(chart: helm.Chart) -> None:
    cfg = _config(render(chart, {"agent": {"nri": {"enabled": False}}}))
    assert cfg.nri.enabled is False


@pytest.mark.parametrize("index", ["3", 42, "42"])
def test_plugin_index_forms(chart: helm.Chart, index: str | int) -> None:
    cfg = _config(render(chart, {"agent": {"nri": {"pluginIndex": index}}}))
    assert cfg.nri.plugin_index == f"{int(index):02d}"


def test_an_unknown_flag_is_caught(chart: helm.Chart) -> None:
    """The parser check is not vacuous: a flag the CLI does not have fails it."""
    rendered = render(chart, {"agent": {"extraArgs": ["--no-such-flag=1"]}})
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(rendered.container["args"])
    assert exc.value.code == 2
