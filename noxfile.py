"""nox sessions: tests, lint, typecheck, compiled, bench, protos, e2e-runtime, e2e-apiserver,
e2e-koordinator, e2e-cgroupv2."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True
# uv when nox was installed with it (`nox[uv]`, the README's command): a session installs in seconds, not
# ~45 s with pip; plain venv + pip otherwise
nox.options.default_venv_backend = "uv|venv"

# None: the interpreter nox runs under (the README's venv), so a stock Python >= 3.11 of any minor works
PYTHON = None


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the whole test suite (unit, integration with real cgroups/sockets/HTTP, e2e subprocesses) on two
    pytest-xdist workers: much of it waits on subprocesses and sockets, so two halve it even on 2 cores."""
    session.install("-e", ".[test]")
    session.run("pytest", *(session.posargs or ["-q", "-n", "2"]))


@nox.session(python=PYTHON, name="e2e-runtime")
def e2e_runtime(session: nox.Session) -> None:
    """The real runtime end to end: containerd v2 (CRI + NRI) with runc on this kernel, crictl, the agent as a
    subprocess, and containerd/nri's pkg/adaptation as a conformance peer. tests/e2e/runtime/setup.sh builds
    the runtime (cached by version); without root, Go or a writable cgroup v1 every test skips with the reason
    (KOORDQOS_E2E_RUNTIME_REQUIRED=1 turns that into a failure)."""
    session.install("-e", ".[test]")
    # the build's own output, once; the fixtures run it again (cached: seconds) and skip with its error line
    session.run("bash", "tests/e2e/runtime/setup.sh", success_codes=[0, 1], external=True)
    session.env["KOORDQOS_E2E_RUNTIME"] = "1"
    session.run("pytest", "-ra", "-m", "e2e_runtime", "tests/e2e/runtime", "tests/go", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff lint and format check, the layer rule (import-linter contracts in pyproject), no import cycle."""
    session.install("-e", ".", "ruff>=0.6", "import-linter>=2.1")
    session.run("ruff", "check", "src", "tests", "bench", "tools", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "bench", "tools", "noxfile.py")
    session.run("lint-imports")
    session.run("python", ".ci/import_cycles.py")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package."""
    session.install("-e", ".[dev,demo]")  # the demo package imports rich and matplotlib (typed)
    session.run("mypy")


# What `compiled` runs against the compiled build: the tests of the compiled modules (NRI, hooks, decisions,
# metrics helpers) and the build check; `nox -s compiled -- tests` runs the whole suite (1,700 tests, ~3 min).
COMPILED_TESTS = [
    "tests/test_build.py",
    "tests/nri",
    "tests/hooks",
    "tests/test_decisions.py",
    "tests/test_observability.py",
    "tests/test_once.py",
    "tests/events/test_records.py",
]


@nox.session(python=PYTHON)
def compiled(session: nox.Session) -> None:
    """Build the NRI hot path compiled by mypyc (tools/compile.py; needs a C compiler) and run the tests of
    what it compiles against it: the build the container image runs (docs/performance-history.md, "The
    compiled build"). `nox -s compiled -- tests` runs the whole suite against it. KOORDQOS_COMPILE_OPT_LEVEL=0
    builds in about half the time (CI): the same code, less optimised by the C compiler."""
    import os

    out = _build_compiled(session, os.environ.get("KOORDQOS_COMPILE_OPT_LEVEL", "3"))
    session.run(
        "pytest",
        "-q",
        *(session.posargs or COMPILED_TESTS),
        env={"PYTHONPATH": out, "KOORDQOS_EXPECT_COMPILED": "1"},
    )


def _build_compiled(session: nox.Session, opt_level: str = "3") -> str:
    """Install the dev tools and build the compiled hot path (tools/compile.py); returns its directory."""
    session.install("-e", ".[test,dev]", "setuptools")
    out = ".build/compiled"
    session.run("python", "tools/compile.py", "--out", out, "--opt-level", opt_level)
    return out


@nox.session(name="e2e-apiserver", python=PYTHON)
def e2e_apiserver(session: nox.Session) -> None:
    """The cluster-mode suite against a real kube-apiserver + etcd (tests/apiserver), built with Go from the
    module proxy and cached under ~/.cache/koordqos-e2e; fails if they cannot be built or started."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "tests.apiserver.build")
    session.run(
        "pytest",
        "tests/apiserver",
        "-m",
        "e2e_apiserver and not e2e_koordinator",
        *(session.posargs or ["-q"]),
        env={"KOORDQOS_E2E_APISERVER": "require"},
    )


@nox.session(name="e2e-koordinator", python=PYTHON)
def e2e_koordinator(session: nox.Session) -> None:
    """koordqos beside the real Koordinator (v1.8.0): koord-manager consuming koordqos's reports and
    driving it by its NodeSLO, and koordlet on a synthetic node, on the real kube-apiserver; both built with
    Go from the module proxy once (about 6 and 4 minutes cold; koordlet needs libpfm4-dev) and cached under
    ~/.cache/koordqos-e2e."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "tests.apiserver.build")
    session.run("python", "-m", "tests.apiserver.koordinator", "koord-manager", "koordlet")
    session.run(
        "pytest",
        "tests/apiserver",
        "-m",
        "e2e_koordinator",
        *(session.posargs or ["-q"]),
        env={"KOORDQOS_E2E_APISERVER": "require", "KOORDQOS_E2E_KOORDINATOR": "require"},
    )


@nox.session(name="e2e-cgroupv2", python=PYTHON)
def e2e_cgroupv2(session: nox.Session) -> None:
    """The cgroup v2 suite on a real v2 kernel (docs/e2e-cgroupv2.md): tools/v2vm/run.py boots Debian's kernel
    with cgroup_no_v1=all in a small qemu VM (this machine's root read-only over 9p, writes in a tmpfs) and
    runs tests/e2e/cgroupv2/guest there: the agent on the VM's /sys/fs/cgroup. tools/v2vm/packages.sh
    installs qemu-system-x86, linux-image-amd64 and busybox-static when missing; without them every test
    skips with the reason (KOORDQOS_E2E_CGROUPV2=require, as .ci/run sets it, fails instead)."""
    import os

    session.install("-e", ".[test]")
    session.run("bash", "tools/v2vm/packages.sh", external=True)
    mode = os.environ.get("KOORDQOS_E2E_CGROUPV2") or "1"
    session.run(
        "pytest",
        "tests/e2e/cgroupv2",
        "-m",
        "e2e_cgroupv2",
        *(session.posargs or ["-q", "-rA"]),
        env={"KOORDQOS_E2E_CGROUPV2": mode},
    )


def _run_benchmarks(session: nox.Session, env: dict[str, str] | None = None) -> None:
    import pathlib

    for script in sorted(pathlib.Path("bench").glob("*.py")):
        if script.name.startswith("_"):
            continue
        session.run("python", str(script), *session.posargs, env=env)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Run every benchmark in bench/ (pass --quick for a smoke run); figures go to docs/performance.md."""
    session.install("-e", ".[test]")
    _run_benchmarks(session)


@nox.session(name="bench-compiled", python=PYTHON)
def bench_compiled(session: nox.Session) -> None:
    """The benchmarks against the compiled build the container image runs (tools/compile.py at -O3, as the
    image; needs a C compiler): every agent and plugin they start imports the compiled modules, and each
    bench's first line says "koordqos compiled (N modules)"."""
    _run_benchmarks(session, env={"PYTHONPATH": _build_compiled(session)})


# (include dir, .proto files, output package dir) compiled by the `protos` session.
NRI_PROTOS = ("protos/nri", ["nri_api.proto"], "src/koordqos/nri/api")
TTRPC_PROTOS = ("protos/ttrpc", ["ttrpc.proto"], "src/koordqos/nri/api")
# The hook-service proto sits at its Python package path so grpclib's generated import is the real module.
RUNTIME_PROTOS = ("protos/runtime", ["koordqos/proxy/api/runtime_api.proto"], "src")


@nox.session(python=PYTHON)
def protos(session: nox.Session) -> None:
    """Regenerate the committed protobuf code (upb runtime), its .pyi stubs and the grpclib service stubs
    (runtime hook API) from protos/."""
    # grpcio-tools pins protoc: newer ones emit protobuf 7 gencode, which the protobuf<7 runtime refuses
    session.install("grpcio-tools>=1.60,<1.82", "mypy-protobuf>=3.6", "grpclib>=0.4")
    for include, files, out in (NRI_PROTOS, TTRPC_PROTOS, RUNTIME_PROTOS):
        # grpc_tools.protoc adds its bundled well-known types (google/protobuf/any.proto) itself
        grpc_out = [f"--grpclib_python_out={out}"] if include == RUNTIME_PROTOS[0] else []
        session.run(
            "python",
            "-m",
            "grpc_tools.protoc",
            f"-I{include}",
            f"--python_out={out}",
            f"--mypy_out={out}",
            *grpc_out,
            *(f"{include}/{f}" for f in files),
        )
