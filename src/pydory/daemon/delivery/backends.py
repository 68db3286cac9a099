"""Which producer backend runs (uvicorn's ``protocols/http/auto.py``): the compiled one
(``compiled_producer``) where ``pydory._cproducer`` is built and binds to the librdkafka
confluent-kafka loaded, else confluent-kafka's (``confluent_producer``, the reference).

``PYDORY_PRODUCER`` in the environment names the backend (``compiled`` or
``confluent-kafka``; read once, at import); ``PYDORY_PURE_PYTHON=1`` forces the
reference, with the hot path's pure-Python codec (pydory.hotpath). ``BACKEND`` is the class every
``ProducerHandle`` builds its producer from; ``WHY`` says why it was chosen. Tests run on
both through :func:`use` (tests/producer_backends.py).

Rule: the producer backend is chosen here alone (`_choose`, or a test's `use`).
"""

from __future__ import annotations

import os
from typing import Final

from pydory.daemon.delivery import compiled_producer
from pydory.daemon.delivery.compiled_producer import CompiledBackend
from pydory.daemon.delivery.confluent_producer import ConfluentBackend
from pydory.daemon.delivery.producer_backend import ProducerBackend
from pydory.hotpath import PURE_PYTHON_VARIABLE

__all__ = ["BACKEND", "PRODUCER_VARIABLE", "WHY", "CompiledBackend", "ConfluentBackend", "use"]


#: The environment variable that names the backend.
PRODUCER_VARIABLE: Final = "PYDORY_PRODUCER"


def _choose() -> tuple[type[ProducerBackend], str]:
    if os.environ.get(PURE_PYTHON_VARIABLE, "") not in ("", "0"):
        return ConfluentBackend, f"{PURE_PYTHON_VARIABLE} is set"
    named = os.environ.get(PRODUCER_VARIABLE, "")
    if named == ConfluentBackend.name:
        return ConfluentBackend, f"{PRODUCER_VARIABLE}={named}"
    backend, why = _compiled_if_it_runs()
    if named not in ("", CompiledBackend.name):
        why += (
            f"; {PRODUCER_VARIABLE}={named!r} ignored: it is {CompiledBackend.name!r} or "
            f"{ConfluentBackend.name!r}"
        )
    return backend, why


def _compiled_if_it_runs() -> tuple[type[ProducerBackend], str]:
    try:
        from pydory import _cproducer  # noqa: F401  (built here or not)
    except ImportError as error:
        return ConfluentBackend, f"the C extension is not built here ({error})"
    try:
        return CompiledBackend, compiled_producer.bind()
    except (ImportError, OSError) as error:
        return ConfluentBackend, f"cannot bind librdkafka: {error}"


def use(backend: type[ProducerBackend]) -> None:
    """From now on, producers are made by ``backend`` (and the intake's burst path, which
    needs the compiled one, follows)."""
    global BACKEND
    BACKEND = backend
    compiled_producer.in_use = backend is CompiledBackend


BACKEND: type[ProducerBackend]
_chosen, WHY = _choose()
use(_chosen)
