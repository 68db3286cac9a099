"""Run tests against each implementation of the hot path (pydory.hotpath): the compiled
one (pydory._cwire) and the pure-Python reference.

A test module takes both with one module-scoped autouse fixture::

    implementation = hotpaths.module_fixture()

which patches the names the daemon's modules bound at import (the intake's
``parse_burst`` and the burst path's ``WHOLE_PARSES``, the stream connection's
``StreamFramer``, the datagram input's ``DatagramReader``, identity's
``identity_headers``, and ``wire.StreamFramer`` for tests that build one themselves), and
sets ``PYDORY_PURE_PYTHON`` for a daemon started as a process of its own. The compiled
variant is skipped where the extension is not built (test_cwire.py requires it to be
wherever a C compiler is).

``"compiled"`` reads the UNIX stream connections with their transports. The daemon's
default where compiled is a thread (pydory.daemon.inputs.stream_drain): the daemons the
suite starts without this fixture run it, and with ``PYDORY_TESTS_STREAM_DRAIN=1`` in the
suite's environment every module on both hot paths runs a third time, ``"sdrain"``:
compiled, the UNIX stream connections read by that thread.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pydory import hotpath, wire
from pydory.daemon.admission import burst_path, intake
from pydory.daemon.inputs import datagram, datagram_drain, stream_connection, stream_drain
from pydory.daemon.spool import identity

#: The suite's switch that adds "sdrain" to IMPLEMENTATIONS (the module's docstring).
STREAM_DRAIN_TESTS_VARIABLE = "PYDORY_TESTS_STREAM_DRAIN"
IMPLEMENTATIONS: tuple[str, ...] = ("pure", "compiled") + (
    ("sdrain",) if os.environ.get(STREAM_DRAIN_TESTS_VARIABLE) == "1" else ()
)
#: For the datagram input's tests: also the compiled path with the socket drained by a
#: thread (pydory.daemon.inputs.datagram_drain, the daemon's default where compiled).
DATAGRAM_IMPLEMENTATIONS = ("pure", "compiled", "drain")


def compiled_module() -> Any:
    """pydory._cwire, or None where it is not built."""
    try:
        return importlib.import_module("pydory._cwire")
    except ImportError:
        return None


@contextmanager
def using(name: str) -> Iterator[None]:
    """Run the daemon's hot path on implementation ``name`` ("pure", "compiled", "drain":
    compiled, the datagram socket drained by a thread, or "sdrain": compiled, the UNIX
    stream connections read by a thread)."""
    cwire = compiled_module()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(datagram_drain.DRAIN_VARIABLE, "0")  # "compiled": the loop's reader
        patch.setenv(stream_drain.DRAIN_VARIABLE, "0")  # the transports read the streams
        drain = stream_reader = None
        if name in ("compiled", "drain", "sdrain"):
            if cwire is None:
                pytest.skip("the C extension pydory._cwire is not built here")
            parse_burst = hotpath._compiled_parse_burst(cwire.parse_burst)
            whole: tuple[type, ...] = (list, cwire.ParsedBurst)
            framer, reader = cwire.StreamFramer, cwire.DatagramReader
            headers = cwire.identity_headers
            patch.delenv(hotpath.PURE_PYTHON_VARIABLE, raising=False)
            if name == "drain":
                drain = cwire.DatagramDrain
                patch.setenv(datagram_drain.DRAIN_VARIABLE, "1")
            if name == "sdrain":
                stream_reader = cwire.StreamDrain
                patch.setenv(stream_drain.DRAIN_VARIABLE, "1")
        else:
            parse_burst, framer, reader = hotpath._pure_parse_burst, wire.StreamFramer, None
            whole = (list,)
            headers = hotpath._pure_identity_headers
            patch.setenv(hotpath.PURE_PYTHON_VARIABLE, "1")
        patch.setattr(intake, "parse_burst", parse_burst)
        patch.setattr(burst_path, "WHOLE_PARSES", whole)
        patch.setattr(stream_connection, "StreamFramer", framer)
        patch.setattr(wire, "StreamFramer", framer)
        patch.setattr(datagram, "DatagramReader", reader)
        patch.setattr(identity, "identity_headers", headers)
        patch.setattr(datagram_drain, "DRAIN", drain)
        patch.setattr(stream_drain, "DRAIN", stream_reader)
        yield


def module_fixture(implementations: tuple[str, ...] = IMPLEMENTATIONS) -> Any:
    """A module-scoped autouse fixture running every test of the module on each one."""

    @pytest.fixture(autouse=True, scope="module", params=implementations)
    def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
        with using(request.param):
            yield request.param

    return implementation


def datagram_fixture() -> Any:
    """A fixture (not autouse) running a test on each datagram reader: the pure one, the
    compiled one, and the compiled one drained by a thread."""

    @pytest.fixture(params=DATAGRAM_IMPLEMENTATIONS)
    def datagram_implementation(request: pytest.FixtureRequest) -> Iterator[str]:
        with using(request.param):
            yield request.param

    return datagram_implementation
