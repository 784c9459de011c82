"""Writes a one-layer OCI image archive (the oci-archive format of ``podman load``,
``skopeo copy oci-archive:`` and ``ctr images import``) from a root filesystem tarball.

    oci.py ROOTFS.tar ARCHIVE.tar --name nlproxy --tag 0.1.0 [--arch arm64] [--cmd ARG]...
        [--label K=V]...

Standard library only, so any python3 runs it. The index names the image twice: with
``org.opencontainers.image.ref.name`` (what podman tags it with) and ``io.containerd.image.name``
(what containerd does), both as Kubernetes resolves the DaemonSet's ``image: NAME:TAG``.

Reproducible: nothing of the moment or the machine goes in. ``created`` (and the
``org.opencontainers.image.created`` label) is ``SOURCE_DATE_EPOCH``, the layer is gzipped
without a timestamp, the JSON documents are written with sorted keys, and the archive's entries
carry no owner or time; so one root filesystem tarball gives one image digest.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

CHUNK = 1 << 20
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
# The OCI platform's variant, for the architectures that have one (the image index's, so that a
# runtime choosing among platforms matches arm64 images as it does any other arm64/v8 image).
VARIANT = {"arm64": "v8"}


class _Hashing(io.RawIOBase):
    """A write-only file that hashes and counts what passes through to ``out``."""

    def __init__(self, out: io.BufferedWriter) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.sha.update(b)
        self.size += len(b)
        self.out.write(b)
        return len(b)


def _blob(blobs: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _layer(blobs: Path, rootfs: Path) -> tuple[dict[str, object], str]:
    """Gzips ``rootfs`` into a blob: its descriptor, and the uncompressed tar's digest."""
    diff = hashlib.sha256()
    tmp = blobs / "layer.tmp"
    with tmp.open("wb") as raw:
        hashing = _Hashing(raw)
        with gzip.GzipFile(fileobj=hashing, mode="wb", compresslevel=1, mtime=0) as gz, \
                rootfs.open("rb") as src:  # fmt: skip
            while chunk := src.read(CHUNK):
                diff.update(chunk)
                gz.write(chunk)
    digest = hashing.sha.hexdigest()
    tmp.rename(blobs / digest)
    desc = {
        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
        "digest": f"sha256:{digest}",
        "size": hashing.size,
    }
    return desc, f"sha256:{diff.hexdigest()}"


def write_archive(
    rootfs: Path,
    archive: Path,
    *,
    name: str,
    tag: str,
    cmd: list[str],
    labels: dict[str, str] | None = None,
    arch: str = ARCH,
) -> str:
    """Writes the archive; the image manifest's digest (what a registry and ``podman
    inspect`` call the image's digest)."""
    created = time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", time.time())))
    )
    all_labels = {
        "org.opencontainers.image.version": tag,
        "org.opencontainers.image.created": created,
        **(labels or {}),
    }
    plat = {"architecture": arch, "os": "linux"}
    if arch in VARIANT:
        plat["variant"] = VARIANT[arch]
    with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
        layout = Path(tmp)
        blobs = layout / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        layer, diff_id = _layer(blobs, rootfs)
        config = {
            "created": created,
            **plat,
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Cmd": cmd,
                "Labels": all_labels,
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": created, "created_by": f"{name} {tag} on Debian"}],
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                **_blob(blobs, json.dumps(config, sort_keys=True).encode()),
            },
            "layers": [layer],
        }
        manifest_blob = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **manifest_blob,
                    "platform": plat,
                    "annotations": {
                        "org.opencontainers.image.ref.name": f"{name}:{tag}",
                        "io.containerd.image.name": f"docker.io/library/{name}:{tag}",
                    },
                }
            ],
        }
        (layout / "index.json").write_text(json.dumps(index, sort_keys=True))
        (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
        part = archive.with_suffix(".part")
        with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
            for path in ("oci-layout", "index.json", "blobs"):
                tar.add(layout / path, arcname=path, filter=_plain)
        shutil.move(part, archive)
    return str(manifest_blob["digest"])


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rootfs", type=Path, help="the root filesystem as an uncompressed tar")
    ap.add_argument("archive", type=Path)
    ap.add_argument("--name", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument(
        "--arch", default=ARCH, help="the image's architecture, as OCI names it (default: this "
        "machine's)",
    )  # fmt: skip
    ap.add_argument("--cmd", action="append", default=[], help="the default command, word by word")
    ap.add_argument("--label", action="append", default=[], help="KEY=VALUE, an image label")
    args = ap.parse_args()
    labels = dict(label.split("=", 1) for label in args.label)
    digest = write_archive(
        args.rootfs, args.archive.resolve(), name=args.name, tag=args.tag, cmd=args.cmd,
        labels=labels, arch=args.arch,
    )  # fmt: skip
    print(digest)


if __name__ == "__main__":
    main()
