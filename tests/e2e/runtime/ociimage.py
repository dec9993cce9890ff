"""Write a single-layer OCI image archive (what `ctr images import` reads) from a few local files.

No registry is reachable from the test machines, so the pause and workload images are packed here: an
uncompressed layer tar, an image config, a manifest and an `index.json` naming the image through the
`io.containerd.image.name` annotation, all in one tar. Runnable as a script (used by setup.sh):

    python ociimage.py OUT.tar NAME ENTRYPOINT [--file SRC:DEST[:MODE]]... [--link DEST:TARGET]...
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
EPOCH = 0  # fixed mtimes: the same inputs give the same digests


@dataclass
class ImageSpec:
    """What goes into the image: files (dest → (bytes, mode)), symlinks (dest → target), entrypoint."""

    name: str
    entrypoint: list[str]
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    env: list[str] = field(default_factory=lambda: ["PATH=/bin"])


def _dirs_of(paths: list[str]) -> list[str]:
    out: set[str] = set()
    for p in paths:
        parts = p.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            out.add("/".join(parts[:i]))
    return sorted(out)


def layer_tar(spec: ImageSpec) -> bytes:
    """The layer: parent dirs, files and symlinks, owned by root, fixed mtimes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in _dirs_of([*spec.files, *spec.links]):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
            tar.addfile(info)
        for dest, (data, mode) in sorted(spec.files.items()):
            info = tarfile.TarInfo(dest.strip("/"))
            info.size, info.mode, info.mtime = len(data), mode, EPOCH
            tar.addfile(info, io.BytesIO(data))
        for dest, target in sorted(spec.links.items()):
            info = tarfile.TarInfo(dest.strip("/"))
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, EPOCH
            tar.addfile(info)
    return buf.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def image_archive(spec: ImageSpec) -> bytes:
    """The whole OCI archive (oci-layout, index.json, blobs) as tar bytes."""
    layer_digest, layer = _blob(layer_tar(spec))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": spec.entrypoint, "Env": spec.env, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},  # uncompressed: diff id = digest
    }
    config_digest, config_bytes = _blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": layer_digest, "size": len(layer)}],
    }
    manifest_digest, manifest_bytes = _blob(json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": spec.name,
                    "org.opencontainers.image.ref.name": spec.name.rpartition(":")[2],
                },
            }
        ],
    }
    entries: list[tuple[str, bytes]] = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, sort_keys=True).encode()),
    ]
    for digest, data in (
        (layer_digest, layer),
        (config_digest, config_bytes),
        (manifest_digest, manifest_bytes),
    ):
        entries.append((f"blobs/sha256/{digest.removeprefix('sha256:')}", data))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
            tar.addfile(info)
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, EPOCH
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("name")
    p.add_argument("entrypoint", help="space-separated argv")
    p.add_argument("--file", action="append", default=[], help="SRC:DEST[:MODE(octal)]")
    p.add_argument("--link", action="append", default=[], help="DEST:TARGET")
    args = p.parse_args(argv)
    spec = ImageSpec(args.name, args.entrypoint.split())
    for item in args.file:
        src, dest, *mode = item.split(":")
        spec.files[dest] = (Path(src).read_bytes(), int(mode[0], 8) if mode else 0o755)
    for item in args.link:
        dest, target = item.split(":", 1)
        spec.links[dest] = target
    args.out.write_bytes(image_archive(spec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
