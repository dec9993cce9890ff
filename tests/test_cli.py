"""CLI: bad input gives exit code 2 and one line naming the problem, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from koordqos.cli import main


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "koordqos", *argv], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["run", "--feature-gates=Bogus=true"], "unknown feature gate 'Bogus'"),
        (["run", "--log-format=xml"], "invalid choice: 'xml'"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(argv: list[str], needle: str) -> None:
    proc = run_cli(*argv)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr


def test_invalid_config_file_is_rejected_with_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text("nri:\n  plugin_index: abc\n")
    assert main(["config", "validate", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "nri.plugin_index: must be exactly two digits" in err
    assert str(f) in err


def test_unreadable_and_malformed_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "validate", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [unclosed\n")
    assert main(["config", "validate", str(bad)]) == 2
    assert "invalid YAML" in capsys.readouterr().err


def test_valid_agent_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text("dry_run: true\nfeature_gates: {BECPUEvict: true}\n")
    assert main(["config", "validate", str(f)]) == 0
    assert "valid agent config" in capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    from koordqos import __version__
    from koordqos.build import describe

    # the build this test runs on (tests/test_build.py checks that one against the session's expectation)
    assert capsys.readouterr().out == f"koordqos {__version__}, {describe()}\n"


def test_configuration_page_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/configuration.md is `python -m koordqos config flags`: regenerate it when a flag changes."""
    assert main(["config", "flags"]) == 0
    out = capsys.readouterr().out
    page = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    assert page.read_text() == out, "run: python -m koordqos config flags > docs/configuration.md"
    assert "`--dry-run` | `KOORDQOS_DRY_RUN` | `false`" in out


def test_validate_names_unknown_nodeslo_keys_and_the_closest_valid_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue #15 item 8: this was "valid NodeSLO"
    f = tmp_path / "slo.yaml"
    f.write_text("resourceUsedThresholdWithBE:\n  enabel: true\n  cpuSupressThresholdPercent: 65\n")
    assert main(["config", "validate", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert 'resourceUsedThresholdWithBE.enabel: unknown field (did you mean "enable"?)' in err
    assert 'cpuSupressThresholdPercent: unknown field (did you mean "cpuSuppressThresholdPercent"?)' in err


def test_validate_rejects_an_out_of_range_percentage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "slo.yaml"
    f.write_text(
        "kind: NodeSLO\nspec:\n  resourceUsedThresholdWithBE:\n    cpuSuppressThresholdPercent: 165\n"
    )
    assert main(["config", "validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert "resourceUsedThresholdWithBE.cpuSuppressThresholdPercent" in err
    assert "out of range: 165 (valid: [0, 100])" in err


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n"])
def test_validate_rejects_an_empty_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    f = tmp_path / "empty.yaml"
    f.write_text(text)
    assert main(["config", "validate", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"koordqos: error: {f}: empty file: expected a NodeSLO or an agent config"


def test_run_help_shows_meaningful_metavars_and_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    # issue #15 item 10: `run --help` showed OPT_* placeholders and no defaults
    from koordqos.configflags import FLAGS, flag_default

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "OPT_" not in text
    for usage in (
        "--cgroup-root DIR",
        "--http-addr HOST:PORT",
        "--nri-socket SOCKET",
        "--collect-interval SECONDS",
        "--feature-gates GATE=BOOL[,...]",
        "--dry-run [BOOL]",
        "--log-level {debug,info,warning,error}",
    ):
        assert usage in text
    with_default = [f for f in FLAGS if flag_default(f)]
    assert len(with_default) >= 30
    for flag in with_default:
        assert f"default {flag_default(flag)}" in text, flag.name
    assert "default /sys/fs/cgroup" in text
    assert "default 0.0.0.0:9316" in text


# -- issue #32 part 5d: config validate is the agent's NodeSLO validator ------------------------------------

NODESLO_HEAD = "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata:\n  name: node-1\n"


def test_validate_rejects_what_koordinators_crd_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "slo.yaml"
    f.write_text(
        NODESLO_HEAD
        + "spec:\n"
        + "  resourceUsedThresholdWithBE:\n    cpuSuppressThresholdPercent: '65'\n"
        + "  resourceQOSStrategy:\n"
        + "    lsClass:\n      resctrlQOS: {catRangeStartPercent: 60, catRangeEndPercent: 40}\n"
        + "      memoryQOS: {wmarkRatio: 101}\n"
        + "    beClass:\n      resctrlQOS: {catRangeEndPercent: 101, mbaPercent: 110}\n"
    )
    assert main(["config", "validate", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    for problem in (
        'spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent: wrong type: "65" (valid: an integer)',
        "spec.resourceQOSStrategy.lsClass.resctrlQOS.catRangeStartPercent: out of range: 60 "
        "(valid: below catRangeEndPercent (40))",
        "spec.resourceQOSStrategy.lsClass.memoryQOS.wmarkRatio: out of range: 101 (valid: [0, 100])",
        "spec.resourceQOSStrategy.beClass.resctrlQOS.catRangeEndPercent: out of range: 101 (valid: [0, 100])",
        "spec.resourceQOSStrategy.beClass.resctrlQOS.mbaPercent: out of range: 110 (valid: [0, 100])",
    ):
        assert problem in err
    for pydantic_wording in ("Input should", "validation error", "type="):
        assert pydantic_wording not in err


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (
            "apiVersion: slo.koordinator.sh/v1beta1\nkind: NodeSLO\n",
            'apiVersion: not a NodeSLO\'s: "slo.koordinator.sh/v1beta1" '
            '(valid: "slo.koordinator.sh/v1alpha1")',
        ),
        (
            "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeMetric\n",
            'kind: not a NodeSLO: "NodeMetric" (valid: "NodeSLO", apiVersion "slo.koordinator.sh/v1alpha1")',
        ),
    ],
)
def test_validate_rejects_a_wrong_api_version_or_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], head: str, expected: str
) -> None:
    f = tmp_path / "slo.yaml"
    f.write_text(head + "spec: {}\n")
    assert main(["config", "validate", str(f)]) == 2
    assert capsys.readouterr().err.strip() == f"koordqos: error: {f}: {expected}"


def test_validate_names_the_slo_controller_configmap_and_what_to_pass_instead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "cm.yaml"
    f.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: slo-controller-config\n"
        "  namespace: koordinator-system\ndata:\n"
        '  resource-threshold-config: \'{"clusterStrategy": {"enable": true}}\'\n'
        "  resource-qos-config: '{}'\n"
    )
    assert main(["config", "validate", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err == (
        f"koordqos: error: {f}: this is koord-manager's slo-controller-config ConfigMap (the cluster-wide "
        "settings it renders every node's NodeSLO from), not a NodeSLO: pass a node's NodeSLO instead "
        "(kubectl get nodeslo <node> -o yaml)"
    )


def test_validate_accepts_a_valid_nodeslo_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "slo.yaml"
    f.write_text(
        NODESLO_HEAD
        + "spec:\n  resourceUsedThresholdWithBE: {enable: true, cpuSuppressThresholdPercent: 100}\n"
        "  resourceQOSStrategy:\n    beClass:\n"
        "      resctrlQOS: {catRangeStartPercent: 0, catRangeEndPercent: 100}\n"
    )
    assert main(["config", "validate", str(f)]) == 0
    assert capsys.readouterr().out.strip() == f"{f}: valid NodeSLO"


def test_validate_rejects_the_threshold_the_agent_refuses_with_the_same_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the agent's log line and counted error for this document name the same problem (test_nodeslo_in_force)
    f = tmp_path / "slo.yaml"
    f.write_text(NODESLO_HEAD + "spec:\n  resourceUsedThresholdWithBE: {cpuSuppressThresholdPercent: 150}\n")
    assert main(["config", "validate", str(f)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"koordqos: error: {f}: invalid NodeSLO: "
        "spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent: out of range: 150 (valid: [0, 100])"
    )
