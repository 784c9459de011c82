"""A ``--config`` file read within its limits: a regular file (not a FIFO, device or
directory), at most :data:`MAX_CONFIG_BYTES`, one document decoded as manifests are
(``cluster/decode.py``) and of bounded size once its aliases are expanded, and the keys it
writes twice (``duplicates.py``). What the document means is ``kubeproxy.py``'s."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from nlproxy.cluster.decode import FileError, documents
from nlproxy.config.duplicates import Duplicate, duplicate_keys
from nlproxy.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20
"""A configuration file larger than this is refused (kube-proxy's is a few kilobytes)."""
MAX_CONFIG_VALUES = 100_000
"""Values a configuration file may hold once its YAML aliases are expanded: nine aliases of
nine make a billion, which walking (for the unused fields) or printing would never finish."""


def read_config(path: Path) -> tuple[Any, list[Duplicate]]:
    """The one document of a configuration file, read and decoded as manifests are
    (``cluster/decode.py``), and the keys it writes twice in one mapping: a file too large,
    not UTF-8, not valid YAML (or JSON), with an integer of thousands of digits, nested too
    deeply, or an alias bomb is a ConfigError.

    Raises:
        ConfigError: any of those, naming the file.
    """
    where = f"config {path}"
    try:
        data = _read_regular(path, where)
    except OSError as exc:
        raise ConfigError(where, exc.strerror or str(exc)) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(where, f"more than {MAX_CONFIG_BYTES} bytes")
    try:
        docs = documents(path, data)
    except FileError as exc:
        reason = " ".join(str(exc).split())  # one line, whatever the parser's text
        raise ConfigError(where, reason.removeprefix(f"{path.name}: ")) from None
    if len(docs) > 1:
        raise ConfigError(where, f"holds {len(docs)} YAML documents; expected one")
    doc = docs[0] if docs else None
    if _values(doc, MAX_CONFIG_VALUES) > MAX_CONFIG_VALUES:
        raise ConfigError(
            where, f"more than {MAX_CONFIG_VALUES} values once its YAML aliases are expanded"
        )
    return doc, duplicate_keys(data.decode("utf-8"))


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _not_regular(mode: int) -> str | None:
    """Why a file of ``mode`` cannot be a configuration file; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return f"is {_KINDS.get(stat.S_IFMT(mode), 'not a regular file')}, not a regular file"


def _read_regular(path: Path, where: str) -> bytes:
    """The bytes of ``path``, a regular file (symbolic links followed: a ConfigMap mount is a
    link to one), at most ``MAX_CONFIG_BYTES + 1`` of them.

    A FIFO would block the open until a writer came (and then hand over whatever it wrote), a
    device or a directory is no file at all: each is refused before it is opened, and opened
    without blocking and checked again, in case the path was swapped in between.

    Raises:
        ConfigError: not a regular file, or larger than ``MAX_CONFIG_BYTES``.
        OSError: the file cannot be read.
    """
    why = _not_regular(os.stat(path).st_mode)
    if why is None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            why = _not_regular(st.st_mode)
            if why is None:
                if st.st_size > MAX_CONFIG_BYTES:
                    raise ConfigError(where, f"{st.st_size} bytes; at most {MAX_CONFIG_BYTES}")
                return f.read(MAX_CONFIG_BYTES + 1)
    raise ConfigError(where, why)


def _values(doc: object, most: int) -> int:
    """How many values ``doc`` holds with aliases expanded, counting shared ones once per use
    but each container walked once (so a bomb is measured without being expanded); stops
    counting past ``most``."""
    sizes: dict[int, int] = {}

    def size(node: object) -> int:
        if not isinstance(node, dict | list):
            return 1
        known = sizes.get(id(node))
        if known is None:
            items = node.values() if isinstance(node, dict) else node
            known = 1
            for item in items:
                known += size(item)
                if known > most:
                    break
            sizes[id(node)] = known
        return known

    try:
        return size(doc)
    except RecursionError:  # a YAML document cannot nest this deep (the parser refuses it)
        return most + 1
