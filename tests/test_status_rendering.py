"""Pages encoded in slices (issue 21): the same bytes as at once, with the loop given back
between slices, and one rendering shared by the requests that arrive while it runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from pydory.status.rendering import (
    SAMPLES_PER_SLICE,
    ReusedPage,
    json_in_slices,
    metrics_in_slices,
)

TOPICS = 20_000  # enough work that any machine needs many slices for it


def big_document() -> dict[str, Any]:
    return {
        "pid": 1,
        "topics": [
            {"topic": f"t.{i}", "accepted": i, "discarded": {"too_long": 1}} for i in range(TOPICS)
        ],
        "empty": [],
        "text": 'quote " and ünïcode',
    }


class Fixed(Collector):
    def collect(self) -> Iterable[Metric]:
        accepted = CounterMetricFamily("pydory_accepted_messages", "Accepted.", labels=["topic"])
        for i in range(TOPICS):
            accepted.add_metric([f"t.{i}"], i)
        yield accepted
        yield GaugeMetricFamily("pydory_small", "One sample.", value=3)
        labelled = GaugeMetricFamily("pydory_odd", 'Odd "labels".\nTwo lines.', labels=["x"])
        for i in range(SAMPLES_PER_SLICE + 1):
            labelled.add_metric([f'a "quoted"\n{i}'], i)
        yield labelled


async def turns_during(work: asyncio.Future[bytes]) -> tuple[bytes, int]:
    """``work``'s result, and how many times the loop ran another task meanwhile."""
    turns = 0
    while not work.done():
        await asyncio.sleep(0)
        turns += 1
    return work.result(), turns


def test_json_in_slices_is_json_dumps_and_gives_the_loop_turns() -> None:
    document = big_document()

    async def run() -> tuple[bytes, int]:
        return await turns_during(asyncio.ensure_future(json_in_slices(document)))

    body, turns = asyncio.run(run())
    assert body == (json.dumps(document, indent=4) + "\n").encode()
    assert turns > 5


def test_metrics_in_slices_is_generate_latest_and_gives_the_loop_turns() -> None:
    async def run() -> tuple[bytes, int]:
        return await turns_during(asyncio.ensure_future(metrics_in_slices(Fixed())))

    body, turns = asyncio.run(run())
    assert body == generate_latest(Fixed())
    assert turns > 5


def test_requests_during_a_rendering_share_it_and_reuse_it_briefly() -> None:
    now = [0.0]
    renders: list[int] = []

    async def render() -> bytes:
        renders.append(1)
        await asyncio.sleep(0)
        return b"page %d" % len(renders)

    async def run() -> list[bytes]:
        page = ReusedPage(render, reuse_s=0.1, clock=lambda: now[0])
        together = await asyncio.gather(page(), page(), page())
        now[0] = 0.05
        reused = await page()
        now[0] = 0.2
        return [*together, reused, await page()]

    assert asyncio.run(run()) == [b"page 1", b"page 1", b"page 1", b"page 1", b"page 2"]


def test_a_client_going_away_does_not_cancel_the_others_rendering() -> None:
    async def render() -> bytes:
        await asyncio.sleep(0.01)
        return b"done"

    async def run() -> bytes:
        page = ReusedPage(render, reuse_s=0.1)
        first = asyncio.ensure_future(page())
        second = asyncio.ensure_future(page())
        await asyncio.sleep(0)
        first.cancel()
        return await second

    assert asyncio.run(run()) == b"done"
