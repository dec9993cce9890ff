"""Network namespaces a test makes for itself: a veth pair between a "node" and a "peer" namespace.

`VethPair()` (a context manager) creates two uniquely named namespaces (`kq<pid>-<n>{node,peer}`), a veth
pair `kqnode` ↔ `kqpeer` between them with RFC 2544 benchmarking addresses (198.18.0.0/15: never routed,
and only ever inside these namespaces), and a default route in the node namespace via the peer, so code that
looks for "the default-route NIC" finds `kqnode`. Everything is deleted on exit, also on failure; the host's
interfaces are never touched (every command runs with `ip -n <ns>` / `ip netns exec <ns>`).
`unavailable()` says why it cannot run here (not root, no `ip`, no netns support) or None.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

NODE_IP = "198.18.0.1"
PEER_IP = "198.18.0.2"
PREFIX = 24
_counter = itertools.count()


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} (iproute2) is not installed"
    probe = f"kqprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"ip netns add: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _run(argv: Sequence[str]) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=20)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


@dataclass
class VethPair:
    """Two namespaces joined by a veth pair; `extra_ips` are added to the node side (pods' addresses)."""

    extra_ips: tuple[str, ...] = ()
    node: str = ""
    peer: str = ""
    node_dev: str = "kqnode"
    peer_dev: str = "kqpeer"
    _made: list[str] = field(default_factory=list)

    def __enter__(self) -> VethPair:
        n = next(_counter)
        self.node = f"kq{os.getpid()}-{n}node"
        self.peer = f"kq{os.getpid()}-{n}peer"
        try:
            for ns in (self.node, self.peer):
                _run(["ip", "netns", "add", ns])
                self._made.append(ns)
            _run(
                [
                    "ip",
                    "-n",
                    self.node,
                    "link",
                    "add",
                    self.node_dev,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    self.peer_dev,
                    "netns",
                    self.peer,
                ]
            )
            _run(["ip", "-n", self.node, "addr", "add", f"{NODE_IP}/{PREFIX}", "dev", self.node_dev])
            for ip in self.extra_ips:
                _run(["ip", "-n", self.node, "addr", "add", f"{ip}/32", "dev", self.node_dev])
            _run(["ip", "-n", self.peer, "addr", "add", f"{PEER_IP}/{PREFIX}", "dev", self.peer_dev])
            for ns, dev in ((self.node, self.node_dev), (self.peer, self.peer_dev)):
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
                _run(["ip", "-n", ns, "link", "set", dev, "up"])
            _run(["ip", "-n", self.node, "route", "add", "default", "via", PEER_IP])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Delete the namespaces (the veth pair goes with them)."""
        while self._made:
            ns = self._made.pop()
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)

    def run(self, ns: str, argv: Sequence[str]) -> str:
        """A command in one of the namespaces; its stdout (RuntimeError on failure)."""
        return _run(["ip", "netns", "exec", ns, *argv])

    def python(self, ns: str, code: str, *args: str) -> subprocess.Popen[str]:
        """This interpreter running `code` in a namespace (stdout piped)."""
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", code, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


#: a UDP sender: `<src ip> <dst ip> <port> <seconds>`; prints the bytes it handed to the kernel
SENDER = """
import socket, sys, time
src, dst, port, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, 0))
payload = b"x" * 1200
sent = 0
end = time.monotonic() + secs
while time.monotonic() < end:
    try:
        sent += s.sendto(payload, (dst, port))
    except OSError:  # ENOBUFS: the class's queue is full, the shaper is working
        time.sleep(0.0005)
print(sent)
"""

#: a UDP receiver: `<ip> <port> <seconds>`; prints "ready" once bound, then {source ip: bytes} as JSON
RECEIVER = """
import json, socket, sys, time
ip, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((ip, port))
s.settimeout(0.2)
print("ready", flush=True)
got = {}
end = time.monotonic() + secs
while time.monotonic() < end:
    try:
        data, (src, _) = s.recvfrom(65536)
    except socket.timeout:
        continue
    got[src] = got.get(src, 0) + len(data)
print(json.dumps(got))
"""
