"""Shared fixtures. Kernel tests need root and nftables; a missing prerequisite is an error."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterator

import pytest
import structlog

from tests import netns


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """Each test starts with structlog's defaults: a test that ran ``nlproxy`` with
    ``--log-level warning`` must not silence the info events a later test captures."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
    logging.getLogger().handlers = []  # what nlproxy's configure() installed
    logging.captureWarnings(False)


@pytest.fixture(scope="session", autouse=True)
def _prerequisites() -> None:
    missing = [tool for tool in ("ip", "nft", "conntrack") if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root (the tests program the kernel)")
    if missing:
        pytest.fail(f"test prerequisites missing: {', '.join(missing)} (run `make test`)")


@pytest.fixture
def make_netns() -> Iterator[Callable[[str], str]]:
    """``make_netns(prefix) -> name``: a fresh namespace, deleted after the test."""
    made: list[str] = []

    def make(prefix: str) -> str:
        name = netns.create(netns.unique_name(prefix))
        made.append(name)
        return name

    yield make
    for name in made:
        netns.delete(name)
