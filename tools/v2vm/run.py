#!/usr/bin/env python3
"""v2vm: run one command on a real cgroup v2 kernel, in a small VM, and exit with its exit code.

    python tools/v2vm/run.py [options] -- COMMAND [ARG...]

This host mounts cgroup v1; the VM boots Debian's kernel (`/boot/vmlinuz-*`, package linux-image-amd64) with
`cgroup_no_v1=all` under qemu (package qemu-system-x86), from an initramfs made here of busybox-static, the
virtio / 9p / overlay modules (resolved through the kernel's modules.dep) and init.sh. The guest sees the
host's root shared read-only over 9p under a tmpfs overlay (writes stay in the VM), cgroup2 mounted at
/sys/fs/cgroup with cpu, cpuset, io, memory and pids enabled for the children, and a per-run transfer dir
(read-write, at /run/v2vm/xfer, `$V2VM_XFER`). The command runs there as root, in `--cwd` (default: the
current directory), with exactly the environment given (`--env`, `--pass-env`; PATH and LANG are passed).
Its output is streamed (the guest's second serial port), then the VM powers off.

Exit status: the command's own; 124 when `--timeout` passed (qemu killed); 125 when the VM could not run
the command (a missing prerequisite, a boot failure: the console's tail is printed). The initramfs is cached
under ~/.cache/koordqos-v2vm (`$KOORDQOS_V2VM_CACHE`), keyed by the kernel version and the hash of this
script, init.sh, guest.sh and busybox. /dev/kvm is used when it can be opened, else qemu's TCG (slower; a
note says so). Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
INIT = HERE / "init.sh"
GUEST = HERE / "guest.sh"
QEMU = "qemu-system-x86_64"
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
# virtio-pci (the 9p transport's device), 9p over virtio, overlayfs; dependencies come from modules.dep
MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
KERNEL_ARGS = (
    "console=ttyS0",
    "cgroup_no_v1=all",  # every controller on the v2 hierarchy
    "psi=1",  # pressure files in every cgroup (Debian's default too; said, not assumed)
    "panic=-1",  # a panic reboots, and -no-reboot turns that into qemu exiting
    "quiet",
    "loglevel=3",
)
GUEST_XFER = "/run/v2vm/xfer"
EXIT_TIMEOUT = 124
EXIT_UNAVAILABLE = 125
CONSOLE_TAIL_LINES = 40
PREFIX = "v2vm:"


class Unavailable(Exception):
    """The VM cannot run here (or did not run the command); the message says why."""


def note(text: str) -> None:
    """One line of the tool's own on stderr (the command's output stays on stdout)."""
    print(f"{PREFIX} {text}", file=sys.stderr, flush=True)


# -- the kernel and its modules ------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    """A bootable kernel image and its modules directory."""

    image: Path
    version: str
    modules: Path


def _version_key(version: str) -> list[int | str]:
    return [int(p) if p.isdigit() else p for p in re.split(r"[.-]", version)]


def find_kernel(image: str | None) -> Kernel:
    """The kernel to boot: `image`, else the newest /boot/vmlinuz-*; its /lib/modules/<version> must exist."""
    if image:
        path = Path(image)
        if not path.is_file():
            raise Unavailable(f"kernel image {path} not found")
    else:
        found = sorted(Path("/boot").glob("vmlinuz-*"), key=lambda p: _version_key(p.name[8:]))
        if not found:
            raise Unavailable("no /boot/vmlinuz-* (install Debian's linux-image-amd64)")
        path = found[-1]
    version = path.name.removeprefix("vmlinuz-")
    modules = Path("/lib/modules") / version
    if not (modules / "modules.dep").is_file():
        raise Unavailable(f"no {modules}/modules.dep for kernel {path} (its modules are not installed)")
    if not os.access(path, os.R_OK):
        raise Unavailable(f"kernel image {path} is not readable")
    return Kernel(path, version, modules)


def _module_name(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    name = re.sub(r"\.ko(\.(xz|gz|zst))?$", "", name)
    return name.replace("-", "_")


def resolve_modules(modules_dir: Path, wanted: Iterable[str]) -> list[str]:
    """The module files (relative to `modules_dir`) to load for `wanted`, dependencies first; a module
    built into the kernel is left out. Unavailable when one is neither a module nor built in."""
    deps: dict[str, tuple[str, list[str]]] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        target, sep, rest = line.partition(":")
        if sep:
            deps[_module_name(target)] = (target, [_module_name(d) for d in rest.split()])
    builtin: set[str] = set()
    builtin_file = modules_dir / "modules.builtin"
    if builtin_file.is_file():
        builtin = {_module_name(line) for line in builtin_file.read_text().split()}
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        if name not in deps:
            if name in builtin:
                return
            raise Unavailable(f"kernel module {name} is neither in {modules_dir}/modules.dep nor built in")
        target, needs = deps[name]
        for dep in needs:
            visit(dep)
        order.append(target)

    for name in wanted:
        visit(name.replace("-", "_"))
    return order


def _module_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".xz":
        return lzma.decompress(data)
    if path.suffix == ".gz":
        return zlib.decompress(data, 16 + zlib.MAX_WBITS)
    if path.suffix == ".zst":
        raise Unavailable(f"{path}: zstd-compressed modules need a decompressor the standard library lacks")
    return data


def _has_pvh_note(elf: bytes) -> bool:
    """Whether an x86-64 ELF kernel has the PVH entry note (Xen note type 18: XEN_ELFNOTE_PHYS32_ENTRY),
    which lets qemu start it directly, without the bzImage's decompressor or the BIOS."""
    if elf[:5] != b"\x7fELF\x02":
        return False
    phoff = int.from_bytes(elf[0x20:0x28], "little")
    phentsize = int.from_bytes(elf[0x36:0x38], "little")
    phnum = int.from_bytes(elf[0x38:0x3A], "little")
    for i in range(phnum):
        ph = elf[phoff + i * phentsize : phoff + (i + 1) * phentsize]
        if int.from_bytes(ph[0:4], "little") != 4:  # PT_NOTE
            continue
        off, size = int.from_bytes(ph[8:16], "little"), int.from_bytes(ph[32:40], "little")
        notes, pos = elf[off : off + size], 0
        while pos + 12 <= len(notes):
            namesz, descsz, kind = (int.from_bytes(notes[pos + k : pos + k + 4], "little") for k in (0, 4, 8))
            name = notes[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and kind == 18:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def unpacked_kernel(kernel: Kernel, cache: Path) -> Path:
    """The kernel to give qemu: its uncompressed ELF (cached) when the bzImage holds an xz or gzip payload
    with a PVH entry, else the bzImage. Under TCG the bzImage's own decompression takes ~3 s, and the BIOS
    another second; a PVH ELF starts at once."""
    out = cache / "vmlinux"
    if out.is_file():
        return out
    if (cache / "no-pvh").is_file():
        return kernel.image
    image = kernel.image.read_bytes()
    elf = b""
    for magic, unpack in ((b"\xfd7zXZ\x00", "xz"), (b"\x1f\x8b\x08", "gzip")):
        at = image.find(magic)
        if at < 0:
            continue
        try:
            if unpack == "xz":
                elf = lzma.LZMADecompressor().decompress(image[at:])
            else:
                elf = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(image[at:])
        except (lzma.LZMAError, zlib.error, EOFError):
            continue
        if elf[:4] == b"\x7fELF":
            break
    cache.mkdir(parents=True, exist_ok=True)
    if not _has_pvh_note(elf):
        (cache / "no-pvh").write_text("booting the bzImage: no PVH ELF payload found in it\n")
        return kernel.image
    tmp = out.with_name(f".vmlinux.{os.getpid()}")
    tmp.write_bytes(elf)
    tmp.replace(out)
    return out


# -- the initramfs -------------------------------------------------------------------------------------


def find_busybox() -> Path:
    """A statically linked busybox (package busybox-static): the initramfs has no libc."""
    for candidate in BUSYBOX_CANDIDATES:
        path = Path(candidate)
        if path.is_file():
            head = path.read_bytes()[:4096]
            # a dynamic ELF names its interpreter (PT_INTERP): /lib64/ld-linux-x86-64.so.2
            if b"ld-linux" in head or b"/lib64/ld" in head:
                continue
            return path
    raise Unavailable("no statically linked busybox (install Debian's busybox-static)")


class Cpio:
    """A newc ("070701") cpio archive, what the kernel unpacks as an initramfs."""

    def __init__(self) -> None:
        self.data = bytearray()
        self._ino = 1

    def _entry(self, name: str, mode: int, body: bytes) -> None:
        encoded = name.encode() + b"\0"
        fields = (self._ino, mode, 0, 0, 1, 0, len(body), 0, 0, 0, 0, len(encoded), 0)
        self._ino += 1
        self.data += b"070701" + b"".join(b"%08x" % f for f in fields) + encoded
        self.data += b"\0" * (-len(self.data) % 4) + body
        self.data += b"\0" * (-len(self.data) % 4)

    def directory(self, name: str) -> None:
        self._entry(name, 0o040755, b"")

    def file(self, name: str, body: bytes, mode: int = 0o644) -> None:
        self._entry(name, 0o100000 | mode, body)

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0, b"")
        self.data += b"\0" * (-len(self.data) % 512)
        return bytes(self.data)


def cache_root() -> Path:
    override = os.environ.get("KOORDQOS_V2VM_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "koordqos-v2vm"


def cache_dir(kernel: Kernel, busybox: Path) -> Path:
    """Where the boot files of `kernel` are cached: keyed by its version (and its image's size and mtime, in
    case a package rebuilt it) and the hash of this script, init.sh, guest.sh and busybox. Entries of the
    same kernel version under an older key are removed."""
    digest = hashlib.sha256()
    for part in (Path(__file__), INIT, GUEST, busybox):
        digest.update(part.read_bytes())
    st = kernel.image.stat()
    digest.update(f"{MODULES!r} {st.st_size} {st.st_mtime_ns}".encode())
    here = cache_root() / f"{kernel.version}-{digest.hexdigest()[:16]}"
    if not here.is_dir() and here.parent.is_dir():
        for old in here.parent.glob(f"{kernel.version}-*"):
            shutil.rmtree(old, ignore_errors=True)
    return here


def initramfs(kernel: Kernel, busybox: Path, cache: Path) -> Path:
    """The initramfs for `kernel` (built once, then cached)."""
    out = cache / "initramfs.cpio"
    if out.is_file():
        return out
    modules = resolve_modules(kernel.modules, MODULES)
    archive = Cpio()
    for d in ("bin", "modules"):
        archive.directory(d)
    archive.file("bin/busybox", busybox.read_bytes(), 0o755)
    archive.file("init", INIT.read_bytes(), 0o755)
    archive.file("guest.sh", GUEST.read_bytes(), 0o755)
    names = []
    for rel in modules:
        name = rel.rsplit("/", 1)[-1].removesuffix(".xz").removesuffix(".gz")
        archive.file(f"modules/{name}", _module_bytes(kernel.modules / rel))
        names.append(name)
    archive.file("modules.order", "".join(n + "\n" for n in names).encode())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    tmp.write_bytes(archive.finish())
    tmp.replace(out)
    note(f"built the initramfs for {kernel.version}: {out} ({out.stat().st_size // 1024} KiB)")
    return out


# -- the command and the VM ----------------------------------------------------------------------------


def command_script(argv: Sequence[str], cwd: str, env: dict[str, str]) -> str:
    """The guest's command script (run by busybox sh): cwd, exactly `env`, exec the command."""
    pairs = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))
    return (
        f"cd {shlex.quote(cwd)} || exit {EXIT_UNAVAILABLE}\n"
        f"exec /run/v2vm/busybox env -i {pairs} {' '.join(shlex.quote(a) for a in argv)}\n"
    )


def kvm_usable() -> tuple[bool, str]:
    """Whether qemu can run a stock kernel under KVM here (and why not): /dev/kvm opens read-write and the
    CPU has hardware virtualization (vmx/svm). A /dev/kvm without them (a nested host's software KVM such as
    kvm-pvm) runs only guests built for it: a stock kernel hangs in its first instructions there."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return False, f"/dev/kvm: {exc.strerror}"
    os.close(fd)
    try:
        flags = {
            f
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
            for f in line.partition(":")[2].split()
        }
    except OSError as exc:
        return False, f"/proc/cpuinfo: {exc.strerror}"
    if not flags & {"vmx", "svm"}:
        return False, "/dev/kvm is there but the CPU has no vmx/svm (a nested host's software KVM)"
    return True, ""


def choose_accel(wanted: str) -> bool:
    """True for KVM: `wanted` is kvm, tcg or auto (KVM when usable, else TCG with a note)."""
    if wanted == "tcg":
        return False
    kvm, why = kvm_usable()
    if wanted == "kvm" and not kvm:
        raise Unavailable(f"--accel kvm: {why}")
    if not kvm:
        note(f"KVM unusable ({why}): running under TCG, expect it to be several times slower")
    return kvm


def qemu_argv(
    kernel: Path, initrd: Path, xfer: Path, memory_mib: int, cpus: int, kvm: bool, append: Sequence[str]
) -> list[str]:
    """qemu's command line: no devices but two serial ports (console to a file, the command's output to
    qemu's stdout) and the two 9p shares."""
    accel = ["-accel", "kvm"] if kvm else ["-accel", "tcg", "-cpu", "max"]
    return [
        QEMU,
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",  # -nographic without its stdio monitor: stdin and stdout are the command's stream
        "-no-reboot",
        *accel,
        "-m",
        str(memory_mib),
        "-smp",
        str(cpus),
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        " ".join((*KERNEL_ARGS, *append)),
        "-serial",
        f"file:{xfer / 'console.log'}",
        "-serial",
        "stdio",
        "-virtfs",
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        "-virtfs",
        f"local,path={xfer},mount_tag=xfer,security_model=none",
    ]


def console_tail(xfer: Path, lines: int = CONSOLE_TAIL_LINES) -> str:
    try:
        text = (xfer / "console.log").read_text(errors="replace")
    except OSError:
        return "(no console output)"
    tail = [ln.rstrip("\r") for ln in text.splitlines() if ln.strip()][-lines:]
    return "\n".join(tail) or "(no console output)"


def _pump(src: int) -> None:
    out = sys.stdout.buffer
    while True:
        try:
            chunk = os.read(src, 65536)
        except OSError:
            break
        if not chunk:
            break
        out.write(chunk)
        out.flush()


@dataclass(frozen=True)
class Result:
    """What a run gave: the command's exit code (None: it did not finish) and the times."""

    rc: int | None
    boot_seconds: float | None  # from qemu's start to the command's start (the guest's marker)
    total_seconds: float
    timed_out: bool


def run(
    argv: Sequence[str],
    *,
    cwd: str,
    env: dict[str, str],
    xfer: Path,
    timeout: float,
    memory_mib: int,
    cpus: int,
    kernel_image: str | None = None,
    append: Sequence[str] = (),
    accel: str = "auto",
) -> Result:
    """Boot, run `argv`, stream its output to stdout, power off; Unavailable when the VM cannot start."""
    if shutil.which(QEMU) is None:
        raise Unavailable(f"no {QEMU} on PATH (install Debian's qemu-system-x86)")
    kernel = find_kernel(kernel_image)
    busybox = find_busybox()
    cache = cache_dir(kernel, busybox)
    initrd = initramfs(kernel, busybox, cache)
    boot_image = unpacked_kernel(kernel, cache)
    kvm = choose_accel(accel)
    xfer.mkdir(parents=True, exist_ok=True)
    for stale in ("rc", "rc.part", "started", "console.log", "qemu.log"):
        (xfer / stale).unlink(missing_ok=True)
    (xfer / "cmd").write_text(command_script(argv, cwd, env))
    start, start_wall = time.monotonic(), time.time()
    with (xfer / "qemu.log").open("wb") as qemu_log:
        proc = subprocess.Popen(
            qemu_argv(boot_image, initrd, xfer, memory_mib, cpus, kvm, append),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=qemu_log,
            start_new_session=True,  # a Ctrl-C here reaches qemu only through the kill below
        )
    assert proc.stdout is not None
    # the command's stream, copied as it comes (a thread: the main one waits for qemu with the timeout)
    pump = threading.Thread(target=_pump, args=(proc.stdout.fileno(),), daemon=True)
    pump.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    pump.join(5)
    proc.stdout.close()
    total = time.monotonic() - start
    stderr = (xfer / "qemu.log").read_text(errors="replace").strip()
    if stderr:
        for line in stderr.splitlines():
            note(f"qemu: {line}")
    boot = None
    started = xfer / "started"
    if started.exists():
        boot = started.stat().st_mtime - start_wall  # written by qemu's 9p server: the host's clock
    rc_file = xfer / "rc"
    rc: int | None = None
    if rc_file.is_file():
        try:
            rc = int(rc_file.read_text().strip())
        except ValueError:
            rc = None
    return Result(rc, boot, total, timed_out)


def _env(args: argparse.Namespace) -> dict[str, str]:
    env = {"HOME": "/root", "V2VM_XFER": GUEST_XFER, "V2VM": "1"}
    for name in ("PATH", "LANG", *args.pass_env):
        if name in os.environ:
            env[name] = os.environ[name]
    for pair in args.env:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"{PREFIX} --env wants NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tools/v2vm/run.py",
        description="Run a command on a real cgroup v2 kernel in a small VM; exit with its exit code.",
    )
    parser.add_argument("command", nargs="+", help="the command (after --)")
    parser.add_argument("--cwd", default=os.getcwd(), help="its working directory (default: this one)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="set in its env")
    parser.add_argument(
        "--pass-env", action="append", default=[], metavar="NAME", help="pass this variable of ours"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds until qemu is killed (600)")
    parser.add_argument("--memory", type=int, default=1536, metavar="MiB", help="guest memory (1536)")
    parser.add_argument("--cpus", type=int, default=2, help="virtual CPUs (2)")
    parser.add_argument("--kernel", help="kernel image (default: the newest /boot/vmlinuz-*)")
    parser.add_argument(
        "--accel",
        choices=("auto", "kvm", "tcg"),
        default=os.environ.get("KOORDQOS_V2VM_ACCEL", "auto"),
        help="KVM, qemu's TCG, or KVM when usable (auto, the default; $KOORDQOS_V2VM_ACCEL)",
    )
    parser.add_argument("--append", action="append", default=[], help="one more kernel argument")
    parser.add_argument(
        "--xfer", help="use (and keep) this transfer dir, the guest's $V2VM_XFER (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    env = _env(args)
    keep = args.xfer is not None
    xfer = Path(args.xfer).resolve() if keep else Path(tempfile.mkdtemp(prefix="koordqos-v2vm-"))
    try:
        try:
            result = run(
                args.command,
                cwd=str(Path(args.cwd).resolve()),
                env=env,
                xfer=xfer,
                timeout=args.timeout,
                memory_mib=args.memory,
                cpus=args.cpus,
                kernel_image=args.kernel,
                append=args.append,
                accel=args.accel,
            )
        except Unavailable as exc:
            note(f"cannot run the VM: {exc}")
            return EXIT_UNAVAILABLE
        boot = "" if result.boot_seconds is None else f", booted in {result.boot_seconds:.1f} s"
        if result.timed_out:
            note(f"timed out after {args.timeout:.0f} s{boot}; qemu killed. Console tail:")
            print(console_tail(xfer), file=sys.stderr, flush=True)
            return EXIT_TIMEOUT
        if result.rc is None:
            note(f"the VM stopped without the command's exit status{boot}. Console tail:")
            print(console_tail(xfer), file=sys.stderr, flush=True)
            return EXIT_UNAVAILABLE
        note(f"exit code {result.rc}{boot}, {result.total_seconds:.1f} s in all")
        return result.rc
    finally:
        if not keep:
            shutil.rmtree(xfer, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
