"""Build koordqos with its NRI hot path compiled by mypyc: `python tools/compile.py [--out DIR]`.

The package is copied to DIR (default `.build/compiled`) and the modules of `HOT_PATH` are compiled there to C
extensions by mypyc, with the project's mypy configuration (strict, the pydantic plugin). Everything else
stays interpreted; an extension module is imported before the `.py` beside it, so `PYTHONPATH=DIR` runs the
compiled build with the same source. Needs mypy (the `dev` extra) and a C compiler with Python's headers.
docs/performance-history.md, "The compiled build", says what it gains and how it is tested; the image
builds it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What a CreateContainer runs through, from the bytes read to the reply written, what every tick calls, and
# a Synchronize's slices (nri/sync.py). Not here: nri/configure.py (a Configure, once a connection),
# nri/calls.py (its call classes use mixins; mypyc compiles single inheritance only: the NodeState
# records built on every call are made in nri/runtime_objects.py, which is), hooks/framework.py (a generic
# frozen dataclass fails at import when compiled), events/types.py (dataclass field order: the runtime's
# records, built on every call, are in events/records.py, which is), state.py and bus.py (compiled
# together, 102 tests failed). state.py alone, with NodeState's `__init__` declared, passes every test and
# takes 8 % off a new container's NRI calls, but interpreted code then reads a state's fields through the
# native class's descriptors, 3× slower (6 → 20 ns a read): the whole agent spent more (200 pods with
# churn 5.3 → 5.9 % of a core; docs/performance-history.md, session 30). Not adopted.
HOT_PATH = (
    "koordqos/nri/mux.py",
    "koordqos/nri/ttrpc.py",
    "koordqos/nri/busypoll.py",
    "koordqos/nri/answer.py",
    "koordqos/nri/connection.py",
    "koordqos/nri/session.py",
    "koordqos/nri/payload.py",
    "koordqos/nri/sync.py",
    "koordqos/nri/convert.py",
    "koordqos/nri/runtime_objects.py",
    "koordqos/events/records.py",
    "koordqos/nri/limits.py",
    "koordqos/hooks/core.py",
    "koordqos/hooks/context.py",
    "koordqos/hooks/resources.py",
    "koordqos/hooks/runtime.py",
    "koordqos/hooks/rules.py",
    "koordqos/hooks/cpusetutil.py",
    "koordqos/hooks/batchresource.py",
    "koordqos/hooks/cpunormalization.py",
    "koordqos/hooks/cpuset.py",
    "koordqos/hooks/coresched.py",
    "koordqos/hooks/groupidentity.py",
    "koordqos/hooks/oomscoreadj.py",
    "koordqos/decisions.py",
    "koordqos/observability.py",
    "koordqos/once.py",
)


# mypyc's setuptools build, run in the copy: one C file per module (multi_file: 55 s on this 2-core machine
# against 74 s for one large file), the extensions built in place. Most of the C is in one shared extension,
# whose sources distutils compiles one after the other: `_compile_in_parallel` compiles them on every core
# (the whole build at -O3 64 → 44 s, at -O0 48 → 34 s on 2 cores).
_SETUP = """
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from mypyc.build import mypycify
from setuptools import setup
from distutils.ccompiler import CCompiler


def _compile_in_parallel(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                         extra_preargs=None, extra_postargs=None, depends=None):
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

    def one(obj):
        src, ext = build[obj]
        self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(one, [o for o in objects if o in build]))
    return objects


CCompiler.compile = _compile_in_parallel
opt, paths = sys.argv[1], sys.argv[2:]
setup(
    name="koordqos-compiled",
    ext_modules=mypycify(["--config-file", "mypy.ini", *paths], opt_level=opt, multi_file=True),
    script_args=["-q", "build_ext", "--inplace"],
)
"""


def mypy_ini(pyproject: Path) -> str:
    """The project's [tool.mypy] as a mypy.ini for the copy (without `files` and `mypy_path`, which name
    the source tree, not the copy)."""
    conf = tomllib.loads(pyproject.read_text())["tool"]["mypy"]
    lines = ["[mypy]"]
    for key, value in conf.items():
        if key in ("files", "mypy_path", "overrides"):
            continue
        lines.append(f"{key} = {', '.join(value) if isinstance(value, list) else value}")
    for override in conf.get("overrides", []):
        lines.append(f"[mypy-{','.join(override['module'])}]")
        lines += [f"{k} = {v}" for k, v in override.items() if k != "module"]
    return "\n".join(lines).replace("= True", "= true").replace("= False", "= false") + "\n"


def build(out: Path, opt_level: str = "3") -> list[Path]:
    """Copy the package to `out` and compile HOT_PATH there (C at `opt_level`); returns the extension modules
    built."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copytree(ROOT / "src" / "koordqos", out / "koordqos", ignore=shutil.ignore_patterns("__pycache__"))
    (out / "mypy.ini").write_text(mypy_ini(ROOT / "pyproject.toml"))
    # the copy first on the path: mypy must read the copy, not an editable install of the source tree
    env = dict(os.environ, MYPYPATH=str(out))
    subprocess.run(
        [sys.executable, "-c", _SETUP, opt_level, *HOT_PATH],
        cwd=out,
        env=env,
        check=True,
    )
    shutil.rmtree(out / "build", ignore_errors=True)  # the C sources and objects
    built = sorted(out.glob("koordqos/**/*.so"))
    missing = [m for m in HOT_PATH if not list((out / m).parent.glob(Path(m).stem + ".*.so"))]
    if missing:
        raise SystemExit(f"mypyc built no extension for {', '.join(missing)}")
    return built


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / ".build" / "compiled", help="the build's directory")
    p.add_argument(
        "--opt-level",
        choices=("0", "1", "2", "3"),
        default="3",
        help="the C compiler's optimisation (3, the default, is what the image runs; 0 builds in half the "
        "time, for tests)",
    )
    args = p.parse_args()
    built = build(args.out.resolve(), args.opt_level)
    print(f"compiled {len(HOT_PATH)} modules into {args.out} ({len(built)} extension files)")
    print(f"run it with: PYTHONPATH={args.out} python -m koordqos run ...")


if __name__ == "__main__":
    main()
