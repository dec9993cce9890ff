"""Run a command with the scratch tree as its cgroup root: `python -m koordqos.demo.nsexec ... -- CMD`.

The agent only ever sees `--cgroup-root`; to point it at the scratch tree of the real hierarchy, this
launcher joins the given cgroup (`--join`: cgroup.procs files), enters a private mount namespace and
bind-mounts each scratch dir onto an empty dir (`--bind SRC DST`), then execs the command. The mounts exist
only in that namespace: they vanish with the process, whatever way it ends, and nothing is mounted on the
host. Needs CAP_SYS_ADMIN (root).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import sys

CLONE_NEWNS = 0x00020000
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def isolate_and_bind(binds: list[tuple[str, str]]) -> None:
    """New mount namespace, no propagation back to the host, then the bind mounts."""
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    for src, dst in binds:
        _check(libc.mount(src.encode(), dst.encode(), None, MS_BIND, None), f"bind {src} on {dst}")


def main(argv: list[str] | None = None) -> None:
    """Parse, join the cgroup, isolate, exec."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--join", action="append", default=[], help="cgroup.procs file to write our pid to")
    p.add_argument("--bind", nargs=2, action="append", default=[], metavar=("SRC", "DST"))
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given")
    try:
        for procs in args.join:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        isolate_and_bind([(s, d) for s, d in args.bind])
    except OSError as exc:
        print(f"koordqos demo: cannot prepare the agent's cgroup root: {exc}", file=sys.stderr)
        sys.exit(3)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
