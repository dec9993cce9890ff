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
    assert capsys.readouterr().out.startswith("koordqos ")


def test_configuration_page_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/configuration.md is `python -m koordqos config flags`: regenerate it when a flag changes."""
    assert main(["config", "flags"]) == 0
    out = capsys.readouterr().out
    page = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    assert page.read_text() == out, "run: python -m koordqos config flags > docs/configuration.md"
    assert "`--dry-run` | `KOORDQOS_DRY_RUN` | `false`" in out
