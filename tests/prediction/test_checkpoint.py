"""Checkpoint files (docs/prediction.md, "Checkpoint file", "Checkpoints" and "Restore"; koordlet's test
vectors): koordlet's format, the directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from koordqos.prediction.checkpoint import (
    CheckpointDir,
    CheckpointError,
    DirEntry,
    decode,
    encode,
    format_time,
    go_float,
    parse_time,
    restore_plan,
)
from koordqos.prediction.histogram import HistogramCheckpoint
from koordqos.prediction.model import Model, PredictionParams

T0 = 1767225600 * 10**9
MiB = 1 << 20


def model_file(uid: str = "pod-1", saved: int = T0) -> bytes:
    m = Model(PredictionParams())
    m.update(1.0, 2 << 30, T0)
    return encode(uid, m.cpu.save(), m.memory.save(), saved)


def test_encode_is_koordlets_json() -> None:
    data = model_file(saved=T0 + 3600 * 10**9 + 123_456_789)
    assert data == (
        b'{"UID":"pod-1","CPU":{"referenceTimestamp":"2026-01-01T00:00:00Z","bucketWeights":{"22":10000},'
        b'"totalWeight":1},"Memory":{"referenceTimestamp":"2026-01-01T00:00:00Z","bucketWeights":{"62":10000},'
        b'"totalWeight":1},"LastUpdated":"2026-01-01T01:00:00Z"}\n'
    )


def test_empty_histograms_leave_out_weights_and_total() -> None:
    m = Model(PredictionParams())
    doc = json.loads(encode("x", m.cpu.save(), m.memory.save(), T0))
    assert doc["CPU"] == {"referenceTimestamp": "0001-01-01T00:00:00Z"}
    assert doc["Memory"] == {"referenceTimestamp": "0001-01-01T00:00:00Z"}


def test_bucket_keys_sort_as_text_like_go() -> None:
    cp = HistogramCheckpoint(T0, {100: 5, 22: 10000, 9: 1}, 3.5)
    data = encode("x", cp, cp, T0).decode()
    assert '"bucketWeights":{"100":5,"22":10000,"9":1}' in data


def test_round_trip() -> None:
    data = model_file()
    cp = decode(data, "pod-1")
    assert cp.uid == "pod-1"
    assert cp.last_updated_ns == T0
    assert cp.cpu == HistogramCheckpoint(T0, {22: 10000}, 1.0)
    assert cp.memory == HistogramCheckpoint(T0, {62: 10000}, 1.0)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b'{"UID": "other"}',
        b'{"UID": "pod-1", "CPU": []}',
        b'{"UID": "pod-1", "CPU": {"bucketWeights": {"a": 1}}}',
        b'{"UID": "pod-1", "CPU": {"bucketWeights": {"1": -1}}}',
        b'{"UID": "pod-1", "CPU": {"bucketWeights": {"1": 4294967296}}}',
        b'{"UID": "pod-1", "CPU": {"bucketWeights": {"1": 1.5}}}',
        b'{"UID": "pod-1", "CPU": {"totalWeight": NaN}}',
        b'{"UID": "pod-1", "CPU": {"totalWeight": "1"}}',
        b'{"UID": "pod-1", "CPU": {"referenceTimestamp": "yesterday"}}',
        b'{"UID": "pod-1", "LastUpdated": 5}',
        b"[" * 100000,
        b'{"UID": "pod-1", "pad": "' + b"x" * (70 << 10) + b'"}',
    ],
)
def test_decode_refuses_what_is_not_a_checkpoint(data: bytes) -> None:
    with pytest.raises(CheckpointError):
        decode(data, "pod-1")


def test_go_number_and_time_formats() -> None:
    assert go_float(3365.9073549492077) == "3365.9073549492077"
    assert go_float(1e21) == "1e+21"
    assert go_float(1e-7) == "1e-7"
    assert go_float(123456789012345678.0) == "123456789012345680"
    assert go_float(100001.0) == "100001"
    assert format_time(None) == "0001-01-01T00:00:00Z"
    assert format_time(T0 + 500_000_000) == "2026-01-01T00:00:00.5Z"
    assert parse_time("2026-01-01T01:00:00+01:00") == T0
    assert parse_time("0001-01-01T00:00:00Z") is None


def test_restore_plan() -> None:
    good = model_file("pod-1")
    stale = model_file("pod-gone")
    entries = [
        DirEntry("pod-1", good),
        DirEntry("pod-gone", stale),
        DirEntry("pod-1.tmp", b""),
        DirEntry("notes.txt", b"hello"),
        DirEntry("__node__", b"{truncated"),
        DirEntry("subdir", problem="not a regular file"),
    ]
    plan = {i.name: i.action for i in restore_plan(entries, {"pod-1", "__node__"})}
    assert plan == {
        "pod-1": "restore",
        "pod-gone": "delete",
        "pod-1.tmp": "delete",
        "notes.txt": "skip",
        "__node__": "skip",
        "subdir": "skip",
    }
    koordlet = {i.name: i.action for i in restore_plan(entries, {"pod-1"}, delete_invalid=True)}
    assert koordlet["notes.txt"] == koordlet["__node__"] == koordlet["subdir"] == "delete"


def test_directory_save_scan_remove(tmp_path: Path) -> None:
    d = CheckpointDir(tmp_path)
    d.save("pod-1", model_file("pod-1"))
    assert (tmp_path / "pod-1").read_bytes() == model_file("pod-1")
    assert not (tmp_path / "pod-1.tmp").exists()
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "pod-1", tmp_path / "link")
    (tmp_path / "big").write_bytes(b"x" * (65 << 10))
    entries = {e.name: e for e in d.scan()}
    assert entries["pod-1"].data == model_file("pod-1")
    assert entries["sub"].problem == "not a regular file"
    assert entries["link"].problem == "not a regular file"
    assert entries["big"].data is None
    assert d.remove("pod-1") is True
    assert d.remove("pod-1") is False
    with pytest.raises(ValueError, match="file name"):
        d.save("../escape", b"{}")
    with pytest.raises(ValueError, match="file name"):
        d.save("x.tmp", b"{}")


def test_directory_byte_bound(tmp_path: Path) -> None:
    data = model_file("a")
    d = CheckpointDir(tmp_path, max_bytes=2 * len(data))
    d.save("a", data)
    d.save("b", data)
    d.save("a", data)  # a rewrite replaces its own bytes
    with pytest.raises(ValueError, match="bound"):
        d.save("c", data)
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]
    d.remove("a")
    d.save("c", data)
    assert d.used_bytes == 2 * len(data)


def test_missing_directory_errors(tmp_path: Path) -> None:
    d = CheckpointDir(tmp_path / "missing")
    with pytest.raises(FileNotFoundError):
        d.scan()
    with pytest.raises(FileNotFoundError):
        d.save("a", b"{}")
