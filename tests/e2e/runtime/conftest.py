"""Fixtures of the e2e-runtime suites: the built runtime (once per session) and a fresh stack per test.

The suites run when KOORDQOS_E2E_RUNTIME=1 (`python -m nox -s e2e-runtime` sets it); otherwise, and when a
prerequisite is missing (root, Go, writable cgroup v1, the build), every test is skipped with the reason.
With KOORDQOS_E2E_RUNTIME_REQUIRED=1 (.ci/run) a missing prerequisite is an error instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .cgview import SEPARATE, Layout
from .prereq import REQUIRED_ENV, RUN_ENV, Toolchain, Unavailable, build_toolchain, missing_prerequisite
from .stack import Stack
from .stack import stack as make_stack

_built: Toolchain | Unavailable | None = None


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"e2e-runtime required ({REQUIRED_ENV}=1) but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def toolchain() -> Toolchain:
    """The runtime binaries and images (setup.sh, once per session), or skip with the reason."""
    global _built
    if os.environ.get(RUN_ENV) != "1":
        missing = missing_prerequisite()
        here = f"; it would skip here too: {missing}" if missing else ""
        pytest.skip(f"real-runtime e2e: run `python -m nox -s e2e-runtime` (or set {RUN_ENV}=1){here}")
    if _built is None:
        reason = missing_prerequisite()
        if reason is not None:
            _built = Unavailable(reason)
        else:
            try:
                _built = build_toolchain()
            except Unavailable as exc:
                _built = exc
    if isinstance(_built, Unavailable):
        _unavailable(str(_built))
    assert isinstance(_built, Toolchain)
    return _built


@pytest.fixture
def tools() -> Toolchain:
    return toolchain()


@pytest.fixture
def rt(tools: Toolchain, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """containerd (with the documented NRI section) running on a fresh scratch cgroup tree; no agent yet.
    The cgroup view's layout is `separate` unless a test parametrizes it:
    `@pytest.mark.parametrize("rt", LAYOUTS, indirect=True)` runs it in both (cgview.py)."""
    layout: Layout = getattr(request, "param", SEPARATE)
    with make_stack(tools, layout) as st:
        yield st
