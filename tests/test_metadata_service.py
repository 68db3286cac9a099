"""The metadata service's first fetch: retried in the background, and hurried on demand.

The daemon serves while the first fetch is retried (what it reads waits for it), so an
operator's ``POST /metadata_update`` (or librdkafka seeing a broker come up) must not
wait out a pause that has doubled up to minutes.
"""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import KafkaError, KafkaException

from pydory.daemon.delivery.metadata import MetadataService
from pydory.daemon.delivery.router import MetadataSnapshot, Router

CLUSTER = MetadataSnapshot.build({1: "127.0.0.1:9092"}, {"events": {0: 1}})


class FirstFetchFails:
    """``fetch`` for the service: no broker answers the first time, then one does."""

    def __init__(self) -> None:
        self.calls = 0
        self.failed = asyncio.Event()

    async def __call__(self, topic: str | None = None) -> MetadataSnapshot:
        self.calls += 1
        if self.calls == 1:
            self.failed.set()
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return CLUSTER


@pytest.fixture
def router() -> Router:
    return Router()


def test_a_requested_refresh_cuts_the_pause_after_a_failed_first_fetch_short(
    router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(requested_refresh_cuts_the_pause_short(router, monkeypatch))


async def requested_refresh_cuts_the_pause_short(
    router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = MetadataService(
        {"bootstrap.servers": "127.0.0.1:9"},
        router,
        refresh_interval_s=600,
        min_pause_delay_s=0.0,
        pause_initial_s=600.0,  # a pause nobody waits out in a test
    )
    fetch = FirstFetchFails()
    monkeypatch.setattr(service, "fetch", fetch)
    try:
        first = asyncio.ensure_future(service.initial(asyncio.Event()))
        await asyncio.wait_for(fetch.failed.wait(), 60)
        assert not router.has_metadata  # no metadata yet: nothing known, nothing bad
        service.request_refresh()  # POST /metadata_update
        assert await asyncio.wait_for(first, 60) is True
    finally:
        service.close()
    assert fetch.calls == 2
    assert service.fetch_failures == 1
    assert router.has_metadata
    assert router.knows("events")
    assert service.last_updated_ms is not None


def test_a_stop_ends_the_wait_for_the_first_metadata(
    router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(stop_ends_the_wait(router, monkeypatch))


async def stop_ends_the_wait(router: Router, monkeypatch: pytest.MonkeyPatch) -> None:
    service = MetadataService(
        {"bootstrap.servers": "127.0.0.1:9"},
        router,
        refresh_interval_s=600,
        pause_initial_s=600.0,
    )
    fetch = FirstFetchFails()
    monkeypatch.setattr(service, "fetch", fetch)
    stop = asyncio.Event()
    try:
        first = asyncio.ensure_future(service.initial(stop))
        await asyncio.wait_for(fetch.failed.wait(), 60)
        stop.set()
        assert await asyncio.wait_for(first, 60) is False
    finally:
        service.close()
    assert not router.has_metadata
