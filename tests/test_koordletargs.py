"""A koordlet DaemonSet's arguments start koordqos and mean the same (#32 6; koordletargs.py, cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordqos.cli import build_parser, koordlet_terms
from koordqos.config import AgentConfig
from koordqos.configload import load_config
from koordqos.errors import ConfigError
from koordqos.features import DEFAULT_GATES

# koordinator-sh/charts v1.8.0 templates/koordlet.yaml with the chart's values (docs/deployment.md, "2.4.1
# koordlet's DaemonSet arguments")
CHART_ARGS = [
    "-addr=:9316",
    "-cgroup-root-dir=/host-cgroup/",
    "-feature-gates=BECPUEvict=true,BEMemoryEvict=true,CgroupReconcile=true,Accelerators=true",
    "-runtime-hooks-host-endpoint=/var/run/koordlet/koordlet.sock",
    "--logtostderr=true",
    "--v=4",
]


def config_of(*args: str) -> tuple[AgentConfig, list[str]]:
    given, ignored = koordlet_terms(["run", *args])
    return load_config(build_parser().parse_args(given), env={"NODE_NAME": "n"}), ignored


def test_the_koordlet_charts_arguments_mean_the_same() -> None:
    cfg, ignored = config_of(*CHART_ARGS)
    assert ignored == []  # every one has a meaning in koordqos
    assert cfg.server.http_addr == ":9316"  # every address, as koordlet's listener
    assert cfg.paths.cgroup_root == Path("/host-cgroup")
    assert cfg.hooks.proxy_host_endpoint == "/var/run/koordlet/koordlet.sock"
    assert cfg.log.level == "debug"  # klog's --v=4 is debug verbosity
    on = {g for g, v in cfg.feature_gates.items() if v}
    assert {"BECPUEvict", "BEMemoryEvict", "CgroupReconcile", "Accelerators"} <= on
    # the chart's comment: on by default in koordlet, so in koordqos
    assert {"BECPUSuppress", "CPUBurst", "RdtResctrl", "NodeTopologyReport"} <= on


def test_kustomizes_all_alpha_all_beta() -> None:
    cfg, _ = config_of("-feature-gates=AllAlpha=true,AllBeta=true")
    assert all(cfg.feature_gates[g] for g in DEFAULT_GATES)


@pytest.mark.parametrize(
    "args",
    [
        ["-addr", ":9316"],  # a separate value
        ["--addr=:9316"],
        ["--addr", ":9316"],
        ["-http-addr=:9316"],  # a koordqos flag with one dash
    ],
)
def test_gos_flag_syntax(args: list[str]) -> None:
    cfg, _ = config_of(*args)
    assert cfg.server.http_addr == ":9316"


def test_a_koordqos_flag_given_as_well_wins_whatever_the_order() -> None:
    for args in (["--log-level=warning", "--v=4"], ["--v=4", "--log-level=warning"]):
        assert config_of(*args)[0].log.level == "warning"
    assert config_of("--v=2")[0].log.level == "info"


def test_durations_booleans_and_the_nri_socket() -> None:
    cfg, _ = config_of(
        "-collect-res-used-interval=500ms",
        "-runtime-hooks-reconcile-interval=10s",  # the same name in koordqos, koordlet's duration
        "-runtime-hooks-nri-backoff-cap=1m",
        "-runtime-hooks-nri-connect-timeout=6s",
        "-enable-nri-runtime-hook=false",
        "-var-run-root-dir=/host-var-run/",
        "-runtime-hooks-nri-plugin-name=koordlet_nri",
    )
    assert cfg.metrics.collect_interval_seconds == 0.5
    assert cfg.hooks.reconcile_interval_seconds == 10.0
    assert (cfg.nri.backoff_cap_seconds, cfg.nri.connect_timeout_seconds) == (60.0, 6.0)
    assert cfg.nri.enabled is False
    assert cfg.nri.socket == Path("/host-var-run/nri/nri.sock")
    assert cfg.nri.plugin_name == "koordlet_nri"
    assert config_of("-runtime-hooks-nri-socket-path=containerd/nri.sock")[0].nri.socket == Path(
        "/var/run/containerd/nri.sock"
    )


def test_flags_without_an_effect_are_accepted_and_listed() -> None:
    cfg, ignored = config_of(
        "--logtostderr=false",
        "-kubelet-sync-interval=10s",
        "-enable-pod-taskids",  # a bare boolean never takes the next argument
        "-runtime-hooks-network=unix",  # the same: not listed
        "-runtime-hooks-plugin-failure-policy",
        "Fail",
        "-addr=:1234",
    )
    assert ignored == [
        "-logtostderr=false",
        "-kubelet-sync-interval=10s",
        "-enable-pod-taskids=true",
        "-runtime-hooks-plugin-failure-policy=Fail",
    ]
    assert cfg.server.http_addr == ":1234"
    assert cfg.hooks.failure_policy == "Ignore"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-runtime-hooks-network=tcp"],
            "-runtime-hooks-network 'tcp': koordqos serves the runtime hooks on",
        ),
        (["--v=high"], "-v: invalid verbosity 'high'"),
        (["-collect-res-used-interval=soon"], "-collect-res-used-interval: invalid duration 'soon'"),
        (["-enable-nri-runtime-hook=maybe"], "-enable-nri-runtime-hook: invalid boolean 'maybe'"),
        (["-addr"], "-addr: needs a value"),
    ],
)
def test_a_koordlet_flag_koordqos_cannot_mean_the_same_by_is_an_error(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
        koordlet_terms(["run", *args])


def test_ds_mode_gives_koordlets_container_paths_as_defaults() -> None:
    cfg, _ = config_of("--agent-mode=dsMode", "-sys-root-dir=/elsewhere/")
    assert cfg.paths.cgroup_root == Path("/host-cgroup")
    assert cfg.paths.sys_root == Path("/elsewhere")  # a flag still wins
    assert cfg.nri.socket == Path("/host-var-run/nri/nri.sock")
    assert cfg.hooks.proxy_addr == Path("/host-var-run-koordlet/koordlet.sock")
    assert cfg.hooks.proxy_config_path == Path("/host-etc-hookserver")
    host, _ = config_of()
    assert (host.agent_mode, host.paths.cgroup_root) == ("hostMode", Path("/sys/fs/cgroup"))


def test_other_commands_are_left_alone() -> None:
    assert koordlet_terms(["config", "validate", "-addr"]) == (["config", "validate", "-addr"], [])
    assert koordlet_terms(["run", "--", "-v=4"])[0] == ["run", "--", "-v=4"]
