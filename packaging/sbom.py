"""Writes a CycloneDX 1.5 SBOM (JSON) of what a build installed, from the installed
distributions' own metadata: no tool beyond the standard library, so the build's python3 runs it.

    sbom.py OUT.json --site SITE-PACKAGES --name nlproxy --version 0.1.0
        [--wheels DIR]... [--dpkg-status ROOTFS/var/lib/dpkg/status]
    sbom.py OUT.json --extend SBOM.json --dpkg-status ROOTFS/var/lib/dpkg/status

``--site``: every distribution installed there is a component (name, version, licence, its
package URL ``pkg:pypi/...``) with the packages it requires; ``--wheels``: directories of the
wheel files it was installed from, whose sha256 each component then carries (the same hashes as
``packaging/requirements.lock``); ``--dpkg-status``: the Debian packages of a root filesystem
too (the image's), as ``pkg:deb/debian/...``. ``--extend``: an SBOM written before (the .deb's,
as installed in the image), its Debian packages added. ``SOURCE_DATE_EPOCH`` gives the
timestamp and the serial number is derived from the content, so one build's inputs give one
file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import time
import uuid
from importlib.metadata import Distribution, distributions
from pathlib import Path
from typing import Any
from urllib.parse import quote

REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalize(name: str) -> str:
    """A distribution name as package indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _licence(dist: Distribution) -> list[dict[str, Any]]:
    meta = dist.metadata
    expression = meta.get("License-Expression")
    if expression:
        return [{"expression": expression}]
    classifiers = [
        c.rsplit(" :: ", 1)[-1]
        for c in meta.get_all("Classifier") or []
        if c.startswith("License :: ") and c.count(" :: ") >= 2
    ]
    text = (meta.get("License") or "").strip()
    names = classifiers or ([text] if text and "\n" not in text and len(text) < 100 else [])
    return [{"license": {"name": n}} for n in names]


def _wheel_hashes(wheels: list[Path]) -> dict[str, str]:
    """sha256 of each wheel in the directories ``wheels``, by normalized distribution name."""
    out = {}
    for where in wheels:
        for whl in sorted(where.glob("*.whl")):
            name = normalize(whl.name.split("-", 1)[0])
            out[name] = hashlib.sha256(whl.read_bytes()).hexdigest()
    return out


def python_components(
    site: Path, wheels: list[Path]
) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    hashes = _wheel_hashes(wheels)
    dists = sorted(distributions(path=[str(site)]), key=lambda d: normalize(d.metadata["Name"]))
    refs = {normalize(d.metadata["Name"]): f"pkg:pypi/{normalize(d.metadata['Name'])}"
            f"@{d.version}" for d in dists}  # fmt: skip
    components, depends = [], {}
    for d in dists:
        name = normalize(d.metadata["Name"])
        comp: dict[str, Any] = {
            "type": "library",
            "bom-ref": refs[name],
            "name": name,
            "version": d.version,
            "purl": refs[name],
        }
        if licences := _licence(d):
            comp["licenses"] = licences
        if name in hashes:
            comp["hashes"] = [{"alg": "SHA-256", "content": hashes[name]}]
        components.append(comp)
        needs = set()
        for req in d.requires or []:
            m = REQUIREMENT.match(req)
            if m and "extra ==" not in req and normalize(m.group(1)) in refs:
                needs.add(refs[normalize(m.group(1))])
        depends[refs[name]] = sorted(needs)
    return components, depends


def debian_components(status: Path) -> list[dict[str, Any]]:
    """The installed packages of a dpkg status file."""
    out = []
    for stanza in status.read_text().split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Status") != "install ok installed":
            continue
        name, version, arch = fields["Package"], fields["Version"], fields["Architecture"]
        purl = f"pkg:deb/debian/{name}@{quote(version, safe='')}?arch={arch}&distro=debian-12"
        out.append(
            {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}
        )
    return sorted(out, key=lambda c: str(c["name"]))


def bom(
    *, name: str, version: str, site: Path, wheels: list[Path], dpkg_status: Path | None
) -> dict[str, Any]:
    components, depends = python_components(site, wheels)
    main_ref = f"pkg:pypi/{normalize(name)}@{version}"
    main = next((c for c in components if c["bom-ref"] == main_ref), None)
    if main is None:
        raise SystemExit(f"sbom: {name} {version} is not installed in {site}")
    components.remove(main)
    main = {**main, "type": "application"}
    if dpkg_status is not None:
        components += debian_components(dpkg_status)
    deps = [{"ref": ref, "dependsOn": on} for ref, on in sorted(depends.items())]
    return _document(main, components, deps)


def extend(sbom: Path, dpkg_status: Path) -> dict[str, Any]:
    """``sbom`` with the Debian packages of ``dpkg_status`` added (the image's SBOM from the
    .deb's)."""
    doc = json.loads(sbom.read_text())
    components = [*doc["components"], *debian_components(dpkg_status)]
    return _document(doc["metadata"]["component"], components, doc.get("dependencies", []))


def _document(
    main: dict[str, Any], components: list[dict[str, Any]], deps: list[dict[str, Any]]
) -> dict[str, Any]:
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    doc: dict[str, Any] = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)),
            "tools": {"components": [{"type": "application", "name": "nlproxy packaging/sbom.py"}]},
            "component": main,
        },
        "components": components,
        "dependencies": deps,
    }
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).digest()
    doc["serialNumber"] = uuid.UUID(bytes=digest[:16], version=4).urn
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--site", type=Path, help="the site-packages directory")
    ap.add_argument("--name")
    ap.add_argument("--version")
    ap.add_argument("--extend", type=Path, help="an SBOM to add --dpkg-status's packages to")
    ap.add_argument(
        "--wheels",
        type=Path,
        action="append",
        default=[],
        help="a directory of the wheels installed",
    )
    ap.add_argument("--dpkg-status", type=Path, help="a root filesystem's var/lib/dpkg/status")
    args = ap.parse_args()
    if args.extend is not None:
        if args.dpkg_status is None:
            ap.error("--extend needs --dpkg-status")
        doc = extend(args.extend, args.dpkg_status)
        args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        return
    if args.site is None or args.name is None or args.version is None:
        ap.error("--site, --name and --version are needed without --extend")
    doc = bom(name=args.name, version=args.version, site=args.site, wheels=args.wheels,
              dpkg_status=args.dpkg_status)  # fmt: skip
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
