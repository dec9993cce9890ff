"""SyntheticNode's counters as a concurrent reader sees them: never empty, never torn.

The agent reads the synthetic node from another process while a test or the demo advances it. A reader
process re-reads /proc/stat, /proc/meminfo and a cpuacct.usage (held open, as the collector holds its cgroup
files) while this process advances them; every read must parse to what the node was at some moment. Before
the files were rewritten without truncating first, about a third of such reads found an empty file: the
demo's agent then missed samples, or read a node of `os.cpu_count()` CPUs (issue: the synthetic demo's
quota stuck at the 2000 µs floor under load).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from koordqos.testing.nodefs import SyntheticNode, overwrite

READER = r"""
import os, sys
from koordqos.metrics.procfs import parse_meminfo, parse_proc_stat
stat, meminfo, usage, stop = sys.argv[1:5]
fds = [os.open(p, os.O_RDONLY) for p in (stat, meminfo, usage)]
print("ready", flush=True)
reads = bad = 0
last = 0
while not os.path.exists(stop):
    for i, fd in enumerate(fds):
        data = os.pread(fd, 65536, 0)
        reads += 1
        try:
            if i == 0:
                ticks = parse_proc_stat(data.decode())
                ok = ticks is not None and ticks.online_cpus == 4
            elif i == 1:
                ok = parse_meminfo(data.decode()).get("MemTotal") == 16 << 30
            else:
                value = int(data)
                ok = value >= last  # a counter never goes back
                last = value
        except ValueError:
            ok = False
        bad += not ok
print(reads, bad, flush=True)
"""


def test_a_concurrent_reader_never_sees_a_counter_file_empty_or_torn(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node", cpus=4)
    rel = node.layout.qos_dirs()[2]
    stop = tmp_path / "stop"
    files = [node.proc_root / "stat", node.proc_root / "meminfo", node.path(rel, "cpuacct", "cpuacct.usage")]
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, *map(str, files), str(stop)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "ready"
        for _ in range(3000):
            node.add_cpu_usage(rel, 1_234_567)
            node.advance_node_cpu(37, 11)
            node.set_meminfo(16 << 30, 8 << 30, 4 << 30)
        stop.touch()
        out, _ = reader.communicate(timeout=60)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    reads, bad = map(int, out.split())
    assert reads > 0
    assert bad == 0, f"{bad} of {reads} reads found a file empty or cut short"
    assert node.cpu_usage_ns(rel) == 3000 * 1_234_567


def test_overwrite_replaces_in_place_and_cuts_a_shorter_content(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("123456\n")
    with path.open("rb") as held:  # a descriptor held open sees the new content: the same file
        overwrite(path, "99\n")
        assert held.read() == b"99\n"
    overwrite(path, "1000000\n")
    assert path.read_text() == "1000000\n"
