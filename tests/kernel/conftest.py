"""Fixtures for the tests that program the kernel: they need root and the tools they drive
(``ip``, ``nft``, ``conntrack``); a missing prerequisite fails the run instead of skipping it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests import netns


@pytest.fixture(scope="session", autouse=True)
def _prerequisites() -> None:
    if missing := netns.missing_prerequisites():
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
