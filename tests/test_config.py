"""AgentConfig: flags, env, file precedence; feature gates; precise errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordqos.cli import build_parser
from koordqos.config import build_config
from koordqos.configload import load_config
from koordqos.errors import ConfigError
from koordqos.features import DEFAULT_GATES, parse_feature_gates


def parse(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["run", *argv])


def test_defaults_match_the_documented_values() -> None:
    cfg = load_config(parse(), env={})
    assert cfg.paths.cgroup_root == Path("/sys/fs/cgroup")
    assert cfg.paths.proc_root == Path("/proc")
    assert cfg.nri.socket == Path("/var/run/nri/nri.sock")
    assert cfg.nri.plugin_index == "00"
    assert cfg.server.http_addr == "0.0.0.0:9316"
    assert cfg.hooks.failure_policy == "Ignore"
    assert cfg.executor.resource_force_update_seconds == 60
    assert cfg.gate("BECPUSuppress")
    assert cfg.gate("CPUBurst")
    assert not cfg.gate("BECPUEvict")
    assert cfg.dry_run is False


def test_node_name_from_flag_then_env_then_hostname() -> None:
    assert load_config(parse("--node-name", "n1"), env={"NODE_NAME": "n2"}).node_name == "n1"
    assert load_config(parse(), env={"NODE_NAME": "n2"}).node_name == "n2"
    assert load_config(parse(), env={}).node_name  # hostname, never empty


def test_flags_override_env_which_overrides_file(tmp_path: Path) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text(
        "server: {http_addr: '127.0.0.1:1'}\nlog: {level: debug}\nqos: {cpu_evict_cool_time_seconds: 7}\n"
    )
    env = {"KOORDQOS_CONFIG": str(f), "KOORDQOS_HTTP_ADDR": "127.0.0.1:2", "KOORDQOS_DRY_RUN": "true"}
    cfg = load_config(parse("--http-addr", "127.0.0.1:3"), env=env)
    assert cfg.server.http_addr == "127.0.0.1:3"
    assert cfg.log.level == "debug"
    assert cfg.qos.cpu_evict_cool_time_seconds == 7
    assert cfg.dry_run is True
    assert load_config(parse(), env=env).server.http_addr == "127.0.0.1:2"


def test_koordlet_interval_flags_are_taken_as_given() -> None:
    args = parse(
        "--reconcile-interval-seconds=2",
        "--cpu-suppress-interval-seconds=2",
        "--cpu-evict-interval-seconds=2",
        "--memory-evict-interval-seconds=2",
        "--memory-evict-cool-time-seconds=8",
        "--cpu-evict-cool-time-seconds=40",
        "--qos-extension-plugins=test-plugin=true",
        "--only-evict-by-api=false",
    )
    q = load_config(args, env={}).qos
    assert q.extension_plugins == {"test-plugin": True}
    assert q.only_evict_by_api is False
    assert (q.reconcile_interval_seconds, q.cpu_suppress_interval_seconds, q.cpu_evict_interval_seconds) == (
        2,
        2,
        2,
    )
    assert (
        q.memory_evict_interval_seconds,
        q.memory_evict_cool_time_seconds,
        q.cpu_evict_cool_time_seconds,
    ) == (
        2,
        8,
        40,
    )


def test_bool_flag_without_value_means_true() -> None:
    assert load_config(parse("--dry-run"), env={}).dry_run is True
    assert load_config(parse("--dry-run=false"), env={}).dry_run is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nri-plugin-index", "7"], "nri.plugin_index: must be exactly two digits"),
        (["--http-addr", "nowhere"], "server.http_addr: must be HOST:PORT"),
        (["--feature-gates", "NoSuchGate=true"], "unknown feature gate 'NoSuchGate'"),
        (["--feature-gates", "CPUBurst=maybe"], "CPUBurst: invalid value 'maybe'"),
        (["--dry-run", "perhaps"], "--dry-run: invalid boolean 'perhaps'"),
        (["--runtime-hooks-disable-stages", "PreCreate"], "hooks.disable_stages: unknown stage 'PreCreate'"),
        (["--qos-extension-plugins", "test-plugin"], "qos.extension_plugins: invalid entry 'test-plugin'"),
        (["--collect-interval", "0"], "metrics.collect_interval_seconds: Input should be greater than 0"),
    ],
)
def test_invalid_values_name_the_problem(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(parse(*argv), env={})


def test_unknown_config_file_keys_are_rejected() -> None:
    with pytest.raises(ConfigError, match="server.bogus: Extra inputs are not permitted"):
        build_config({"server": {"bogus": 1}})


def test_feature_gates_all_alpha_and_overrides() -> None:
    gates = parse_feature_gates("AllAlpha=true,CPUEvict=false")
    assert gates["BEMemoryEvict"]
    assert gates["OOMScoreAdj"]
    assert not gates["CPUEvict"]
    assert gates["BECPUSuppress"] == DEFAULT_GATES["BECPUSuppress"]
    with pytest.raises(ConfigError, match="expected Name=true"):
        parse_feature_gates("CPUBurst")


def test_disable_stages_flag_is_a_comma_separated_list() -> None:
    cfg = load_config(
        parse("--runtime-hooks-disable-stages", "PreCreateContainer, PostStopContainer"), env={}
    )
    assert cfg.hooks.disable_stages == ("PreCreateContainer", "PostStopContainer")


def test_nri_plugin_name_accepts_what_the_runtime_accepts() -> None:
    assert (
        load_config(parse("--nri-plugin-name", "koord+qos_v1.2-x"), env={}).nri.plugin_name
        == "koord+qos_v1.2-x"
    )
    with pytest.raises(ConfigError, match="nri.plugin_name"):
        load_config(parse("--nri-plugin-name", "bad/name"), env={})
