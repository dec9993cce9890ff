"""Build (or find in the cache) the e2e-apiserver binaries; print what it took.

Usage: `python -m tests.apiserver.build` (from the repository root).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from .controlplane import Unavailable, build_binaries


def main() -> int:
    try:
        results = build_binaries(Path(tempfile.mkdtemp(prefix="koordqos-e2e-build-")))
    except Unavailable as exc:
        print(f"e2e-apiserver: {exc}", file=sys.stderr)
        return 1
    for r in results.values():
        if r.cached:
            print(f"e2e-apiserver: {r.target}: cached {r.path}")
        else:
            print(
                f"e2e-apiserver: {r.target}: built in {r.seconds:.0f}s, peak RSS {r.max_rss_mib:.0f} MiB,"
                f" load {r.load_before} -> {r.load_after}: {r.path}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
