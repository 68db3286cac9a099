"""Run tests on each producer backend (pydory.daemon.delivery.backends): the compiled one
(pydory._cproducer) and confluent-kafka's (the reference), as uvicorn runs every HTTP
test on both of its protocol implementations.

A test module takes both with one module-scoped autouse fixture::

    producer_backend = producer_backends.module_fixture()

which makes ``backends.use`` the backend for every producer the test makes (a daemon in
the test's process), and sets ``PYDORY_PRODUCER`` for a daemon started as a process of its
own. The compiled variant is skipped where the extension is not built or cannot bind.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pydory.daemon.delivery import backends, compiled_producer

BACKENDS = ("compiled", "confluent-kafka")


@contextmanager
def using(name: str) -> Iterator[None]:
    """Make every producer on backend ``name`` ("compiled" or "confluent-kafka")."""
    chosen = {"compiled": backends.CompiledBackend, "confluent-kafka": backends.ConfluentBackend}
    if name == "compiled" and compiled_producer.bound() is None:
        pytest.skip(f"the compiled producer does not run here: {backends.WHY}")
    previous = backends.BACKEND
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(backends.PRODUCER_VARIABLE, name)
        backends.use(chosen[name])
        try:
            yield
        finally:
            backends.use(previous)


def module_fixture() -> Any:
    """A module-scoped autouse fixture running every test of the module on each backend."""

    @pytest.fixture(autouse=True, scope="module", params=BACKENDS)
    def producer_backend(request: pytest.FixtureRequest) -> Iterator[str]:
        with using(request.param):
            yield request.param

    return producer_backend
