"""Fixtures shared by the client-side tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from module_costs import by_cost
from receivers import RECEIVE_TIMEOUT_S

# The Kafka fixtures, from the tools' distribution (pydory-tools), which registers no pytest
# plugin of its own: loaded here only.
pytest_plugins = ["pydory_tools.testing.pytest_plugin"]

# Hypothesis's per-example deadline (200 ms by default) is a timing assertion: beside a CPU
# hog per core one example of a parser took longer and failed the test. A property test
# asserts the property; each test keeps its own max_examples. Loaded here, before any test
# module is imported, so every @settings(...) inherits it.
settings.register_profile("pydory", deadline=None)
settings.load_profile("pydory")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The costliest test modules first (``tests/module_costs.py``), each module's tests
    together and in their order: ``--dist loadfile`` hands the modules out in this order, so
    the long poles start at once and the run ends on short modules on both workers."""
    order = by_cost([item.path.name for item in items])
    items[:] = [items[i] for i in order]


@pytest.fixture
def datagram_path(tmp_path: Path) -> str:
    return str(tmp_path / "dgram.sock")


@pytest.fixture
def datagram_receiver(datagram_path: str) -> Iterator[socket.socket]:
    """A bound UNIX datagram socket standing in for the daemon's."""
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(datagram_path)
    receiver.settimeout(RECEIVE_TIMEOUT_S)
    yield receiver
    receiver.close()
