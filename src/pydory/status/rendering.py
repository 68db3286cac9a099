"""Rendering a page in slices, so that a large page never holds the event loop for long.

The status pages share the daemon's one event loop with ingestion. A page is read in two
steps: the *snapshot* (the page's document, or ``/metrics``' families, read from the books
on the loop in one go, so it is consistent; its size is bounded, since the books keep
records for at most ``<maxUnknownTopics>`` names Kafka does not have) and the *encoding*
(JSON text, Prometheus text: most of the work). The encoding runs here in slices of about
:data:`SLICE_S`, giving the loop back between two (``await asyncio.sleep(0)``), so a
datagram that arrives during a scrape waits for one slice at most, not for the page.

:class:`ReusedPage` serves a page rendered less than ``PAGE_REUSE_S`` ago again, and lets
requests that arrive while it renders share that one rendering.

Rule: a page is encoded here in slices of at most about ``SLICE_S`` of loop time; nothing else
in ``status/`` encodes a page whose size grows with the number of topics.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = ["SAMPLES_PER_SLICE", "SLICE_S", "ReusedPage", "json_in_slices", "metrics_in_slices"]

#: The loop time one slice of encoding may take before the loop gets a turn.
SLICE_S = 0.001
#: Prometheus samples formatted at once (about 0.3 ms on this hardware).
SAMPLES_PER_SLICE = 200
#: JSON pieces (a key, a value, a separator) encoded between two looks at the clock.
_PIECES_PER_LOOK = 256


class _Slices:
    """Gives the loop a turn whenever SLICE_S of work has passed since the last one."""

    def __init__(self) -> None:
        self._since = time.perf_counter()

    async def turn(self) -> None:
        if time.perf_counter() - self._since >= SLICE_S:
            await asyncio.sleep(0)  # every ready callback (the inputs' reads) runs now
            self._since = time.perf_counter()


async def json_in_slices(document: Any) -> bytes:
    """``json.dumps(document, indent=4) + "\\n"``, encoded a slice at a time.

    ``document`` must not change meanwhile: pass a snapshot (a freshly built page).
    """
    slices = _Slices()
    parts: list[str] = []
    pieces = json.JSONEncoder(indent=4).iterencode(document)
    while True:
        chunk = [piece for _, piece in zip(range(_PIECES_PER_LOOK), pieces, strict=False)]
        if not chunk:
            break
        parts.extend(chunk)
        await slices.turn()
    parts.append("\n")
    return "".join(parts).encode("utf-8")


class _Families(Collector):
    """A collector of given families: prometheus-client formats them."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


async def metrics_in_slices(registry: Collector) -> bytes:
    """``generate_latest(registry)``, a slice at a time.

    The registry's collectors are generators: each family is read when it is reached (a
    family's samples come from one reading of the books; two families may be read a few
    ms apart, as two scrapes would be). A large family is formatted SAMPLES_PER_SLICE
    samples at a time, its HELP and TYPE lines once.
    """
    slices = _Slices()
    parts: list[bytes] = []
    for family in registry.collect():
        for index, part in enumerate(_in_parts(family)):
            text = generate_latest(_Families([part]))
            if index > 0:
                text = text.split(b"\n", 2)[2]  # the family's HELP and TYPE are out already
            parts.append(text)
            await slices.turn()
    return b"".join(parts)


def _in_parts(family: Metric) -> Iterator[Metric]:
    samples = family.samples
    if len(samples) <= SAMPLES_PER_SLICE:
        yield family
        return
    for start in range(0, len(samples), SAMPLES_PER_SLICE):
        part = Metric(family.name, family.documentation, family.type, family.unit)
        part.samples = samples[start : start + SAMPLES_PER_SLICE]
        yield part


AsyncRender = Callable[[], Awaitable[bytes]]


class ReusedPage:
    """A page rendered at most once per ``reuse_s``: a request within that time gets the
    same bytes, and requests arriving while it renders wait for that rendering."""

    def __init__(
        self, render: AsyncRender, reuse_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._render = render
        self._reuse_s = reuse_s
        self._clock = clock
        self._body = b""
        self._rendered_at = -float("inf")
        self._rendering: asyncio.Future[bytes] | None = None

    async def __call__(self) -> bytes:
        if self._clock() - self._rendered_at < self._reuse_s:
            return self._body
        if self._rendering is None:
            self._rendering = asyncio.ensure_future(self._render_once())
        # Shielded: one client hanging up must not cancel the others' rendering.
        return await asyncio.shield(self._rendering)

    async def _render_once(self) -> bytes:
        try:
            body = await self._render()
        finally:
            self._rendering = None
        self._body, self._rendered_at = body, self._clock()
        return body
