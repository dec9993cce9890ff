"""Node local storage (koordlet's NodeLocalStorageInfo) from the sys and proc roots.

What blkio needs to turn a device, a volume group or a pod volume into a disk number `MAJ:MIN`:
* disks and partitions from `<sys>/block/<disk>/dev` and `<sys>/block/<disk>/<part>/dev`;
* LVM from device-mapper: `<sys>/block/dm-N/dm/name` is `<vg>-<lv>` (a dash inside a name is doubled) and
  `<sys>/block/dm-N/slaves/` holds the physical volume(s), so VG → disk;
* mount points from `<proc>/mounts` (mount point → device).
`parse_*` functions are pure; `read_local_storage` is the thin reader (called once per round at most, and
only by blkio).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class LocalStorage:
    """Disk numbers and the maps to reach a disk from a partition, a VG, an LV or a mount point."""

    disk_number: Mapping[str, str] = field(default_factory=dict)  # "/dev/vdb" → "253:16"
    partition_disk: Mapping[str, str] = field(default_factory=dict)  # "/dev/vdb1" → "/dev/vdb"
    vg_disk: Mapping[str, str] = field(default_factory=dict)  # "yoda-pool0" → "/dev/vdb"
    lv_vg: Mapping[str, str] = field(default_factory=dict)  # "/dev/mapper/yoda--pool0-lv" → "yoda-pool0"
    mount_device: Mapping[str, str] = field(default_factory=dict)  # "/var/lib/…/mount" → "/dev/…"

    def disk_of_device(self, device: str) -> str | None:
        """The disk of a disk, a partition or a logical volume device path."""
        if device in self.disk_number:
            return device
        if device in self.partition_disk:
            return self.partition_disk[device]
        vg = self.lv_vg.get(device)
        if vg is not None:
            return self.vg_disk.get(vg)
        return None

    def number_of_device(self, device: str) -> str | None:
        """`MAJ:MIN` of the disk holding `device`."""
        disk = self.disk_of_device(device)
        return None if disk is None else self.disk_number.get(disk)

    def number_of_vg(self, vg: str) -> str | None:
        """`MAJ:MIN` of the disk of a volume group."""
        disk = self.vg_disk.get(vg)
        return None if disk is None else self.disk_number.get(disk)


def split_dm_name(name: str) -> tuple[str, str] | None:
    """Device-mapper name `<vg>-<lv>` (dashes in names doubled) → (vg, lv); None when not LVM-shaped."""
    parts = re.split(r"(?<!-)-(?!-)", name)
    if len(parts) != 2 or not all(parts):
        return None
    vg, lv = (p.replace("--", "-") for p in parts)
    return vg, lv


def parse_mounts(text: str) -> dict[str, str]:
    """`/proc/mounts` → {mount point: device} (octal escapes such as `\\040` decoded)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].startswith("/dev/"):
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
            out[point] = fields[0]
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_local_storage(sys_root: Path | str, proc_root: Path | str) -> LocalStorage:
    """Scan `<sys>/block` and `<proc>/mounts` (missing parts give empty maps)."""
    block = Path(sys_root) / "block"
    disks: dict[str, str] = {}
    parts: dict[str, str] = {}
    vg_disk: dict[str, str] = {}
    lv_vg: dict[str, str] = {}
    try:
        names = sorted(e.name for e in os.scandir(block))
    except OSError:
        names = []
    dm: list[str] = []
    for name in names:
        number = _read(block / name / "dev")
        if number is None:
            continue
        if name.startswith("dm-"):
            dm.append(name)
            continue
        disks[f"/dev/{name}"] = number
        try:
            subs = sorted(e.name for e in os.scandir(block / name) if e.is_dir(follow_symlinks=False))
        except OSError:
            subs = []
        for sub in subs:
            if sub.startswith(name) and (block / name / sub / "dev").exists():
                parts[f"/dev/{sub}"] = f"/dev/{name}"
    for name in dm:
        dm_name = _read(block / name / "dm" / "name")
        split = split_dm_name(dm_name or "")
        if dm_name is None or split is None:
            continue
        vg, _lv = split
        lv_vg[f"/dev/mapper/{dm_name}"] = vg
        try:
            slaves = sorted(e.name for e in os.scandir(block / name / "slaves"))
        except OSError:
            slaves = []
        for slave in slaves:
            dev = f"/dev/{slave}"
            disk = dev if dev in disks else parts.get(dev)
            if disk is not None:
                vg_disk.setdefault(vg, disk)
    return LocalStorage(disks, parts, vg_disk, lv_vg, read_mounts(proc_root))


def read_mounts(proc_root: Path | str) -> dict[str, str]:
    """Mount point → device from `<proc>/mounts`."""
    return parse_mounts(_read(Path(proc_root) / "mounts") or "")
