"""Fixtures every test gets. Unit tests need neither root nor the kernel tools: the root and tool
check lives with the tests that program the kernel (``tests/kernel/conftest.py``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """Each test starts with structlog's defaults: a test that ran ``nlproxy`` with
    ``--log-level warning`` must not silence the info events a later test captures."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
    logging.getLogger().handlers = []  # what nlproxy's configure() installed
    logging.captureWarnings(False)
