"""The compiled producer binds only a librdkafka at least as new as the header it was
compiled against (issue 30): an older one is refused with both versions and what to do,
and the daemon starts on the reference backend instead; an equal or newer one binds."""

from __future__ import annotations

from typing import Any

import pytest

from pydory.daemon.delivery import backends, compiled_producer
from pydory.daemon.delivery.compiled_producer import (
    CompiledBackend,
    LibrdkafkaTooOld,
    check_librdkafka,
    version_text,
)
from pydory.daemon.delivery.confluent_producer import ConfluentBackend

V2_3_0 = 0x020300FF
V2_6_1 = 0x020601FF
LIBRARY = "/site-packages/confluent_kafka.libs/librdkafka-1a2b3c.so.1"


def test_version_text_reads_librdkafka_numbers() -> None:
    assert version_text(V2_3_0) == "2.3.0"
    assert version_text(V2_6_1) == "2.6.1"
    assert version_text(0x0B0C0D00) == "11.12.13"


def test_an_older_librdkafka_is_refused_naming_both_versions_and_the_remedy() -> None:
    with pytest.raises(LibrdkafkaTooOld) as refused:
        check_librdkafka(V2_3_0, V2_6_1, LIBRARY)
    text = str(refused.value)
    assert "librdkafka 2.3.0" in text
    assert "librdkafka 2.6.1" in text
    assert LIBRARY in text
    assert "install a confluent-kafka that bundles librdkafka 2.6.1 or newer" in text
    assert "rebuild pydory" in text
    assert isinstance(refused.value, ImportError)  # the start's "cannot bind" case


def test_an_older_patch_release_is_refused_too() -> None:
    with pytest.raises(LibrdkafkaTooOld):
        check_librdkafka(0x020600FF, V2_6_1, LIBRARY)


@pytest.mark.parametrize("found", [V2_6_1, 0x020602FF, 0x030000FF])
def test_an_equal_or_newer_librdkafka_passes(found: int) -> None:
    check_librdkafka(found, V2_6_1, LIBRARY)  # no exception


compiled = pytest.mark.skipif(
    compiled_producer.bound() is None,
    reason=f"the compiled producer does not run here: {backends.WHY}",
)


@compiled
def test_the_start_names_the_librdkafka_confluent_kafka_loaded() -> None:
    """What the start checks is the library bound, with the header's version beside it."""
    from pydory import _cproducer

    found, path = _cproducer.library_version(compiled_producer.cimpl.__file__)
    version, library = _cproducer.bind(compiled_producer.cimpl.__file__)
    assert version_text(found) == version.split("-")[0]
    assert path == library
    assert found >= _cproducer.HEADER_VERSION  # this build binds (the test above it ran)


@compiled
def test_the_start_refuses_an_older_librdkafka_and_runs_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydory import _cproducer

    built_against = _cproducer.HEADER_VERSION
    older = built_against - 0x100  # one patch release older
    if older >> 8 & 0xFF == 0xFF:  # built against x.y.0: the release before it
        older = built_against - 0x10000
    found_older: Any = lambda module: (older, LIBRARY)  # noqa: E731
    monkeypatch.setattr(compiled_producer, "_found_librdkafka", found_older)
    backend, why = backends._compiled_if_it_runs()
    assert backend is ConfluentBackend
    assert why.startswith("cannot bind librdkafka: ")
    assert f"librdkafka {version_text(older)} ({LIBRARY}" in why
    assert f"librdkafka {version_text(built_against)}, whose header" in why


@compiled
def test_the_start_binds_an_equal_librdkafka(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydory import _cproducer

    equal: Any = lambda module: (_cproducer.HEADER_VERSION, LIBRARY)  # noqa: E731
    monkeypatch.setattr(compiled_producer, "_found_librdkafka", equal)
    backend, why = backends._compiled_if_it_runs()
    assert backend is CompiledBackend
    assert why.startswith("pydory._cproducer on librdkafka ")
