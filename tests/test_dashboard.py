"""The live dashboard at ``/``: served from the package, and alive in a real browser.

The browser test drives Debian's Chromium through Playwright against a real daemon on the
mock cluster while messages flow, clicks "Update metadata", and saves a screenshot to
test-artifacts/dashboard.png for a person to look at.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pydory.client import DatagramSender
from pydory.daemon.books.events import DiscardReason
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.mock_cluster import MockCluster
from test_status import fetch, port_of, wait_until
from test_status_schemas import validator

ARTIFACTS = Path(__file__).parents[1] / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: How long the browser waits for something the page shows within a few refreshes.
PAGE_TIMEOUT_MS = 60_000


@pytest.fixture
def topics(mock_cluster: MockCluster, unique_topic: Callable[[str], str]) -> list[str]:
    names = [unique_topic("clicks"), unique_topic("orders")]
    for name in names:
        mock_cluster.create_topic(name, 3)
    return names


@pytest.fixture
def daemon(
    mock_cluster: MockCluster, tmp_path_factory: pytest.TempPathFactory, topics: list[str]
) -> Iterator[RunningDaemon]:
    socket_dir = str(tmp_path_factory.mktemp("s", numbered=True))
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        message_max_bytes=2000,
        msg_debug_path=str(tmp_path_factory.mktemp("msg-debug")),
        spool_path=str(tmp_path_factory.mktemp("spool") / "spool"),
    )
    with running_daemon(config) as running:
        yield running


# --- served from the package, nothing from elsewhere ---------------------------------------

_REFERENCE = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")


def test_the_page_and_its_assets_are_served_locally(daemon: RunningDaemon) -> None:
    port = port_of(daemon)
    page = fetch(port, "/")
    assert (page.status, page.content_type) == (200, "text/html; charset=utf-8")
    references = _REFERENCE.findall(page.body)
    assert "/dashboard/app.js" in references
    assert "/dashboard/style.css" in references
    for url in references:
        assert url.startswith("/"), f"{url}: the dashboard must not load anything from elsewhere"
        assert fetch(port, url).status == 200, url
    script = fetch(port, "/dashboard/app.js")
    assert script.content_type == "text/javascript; charset=utf-8"
    assert fetch(port, "/dashboard/style.css").content_type == "text/css; charset=utf-8"
    # The only absolute URL in the script is the SVG namespace, which is never fetched.
    assert re.findall(r"https?://[^\s\"'`]+", script.body) == ["http://www.w3.org/2000/svg"]


def test_the_feed_has_what_the_page_draws(daemon: RunningDaemon, topics: list[str]) -> None:
    with DatagramSender(daemon.daemon_config.datagram_path) as sender:
        for i in range(10):
            sender.send(topics[0], b"m-%d" % i)
    port = port_of(daemon)

    def delivered() -> int:
        rows = fetch(port, "/dashboard/json").json()["topics"]
        return sum(row["delivered"] for row in rows if row["topic"] == topics[0])

    wait_until(lambda: delivered() == 10, what="10 deliveries in /dashboard/json")
    feed = fetch(port, "/dashboard/json").json()
    (row,) = [row for row in feed["topics"] if row["topic"] == topics[0]]
    assert row["accepted"] == 10
    assert sorted(row["leaders"]) == ["0", "1", "2"]
    assert feed["received"]["unix_dgram"] == 10
    assert {b["node_id"] for b in feed["brokers"]} == {1, 2, 3}
    assert feed["pool"]["budget"] == 64 * 1024 * 1024
    assert feed["metadata"]["last_updated"] > 0
    validator("dashboard").validate(feed)  # with a spool: what the schema promises
    spool = feed["spool"]
    assert spool["appended"] == 10
    assert spool["outstanding"] == 0
    assert spool["segments"] >= 1
    assert (spool["replayed"], spool["unprotected"], spool["errors"]) == (0, 0, 0)
    assert feed["overload"] == {
        "policy": "discard",
        "paused": False,
        "paused_seconds": 0,
        "pauses": 0,
    }


# --- in a browser --------------------------------------------------------------------------


class Traffic:
    """Background senders: steady messages on two topics, and now and then a bad one."""

    def __init__(self, path: str, topics: list[str], limit_s: float = 60.0) -> None:
        self._path = path
        self._topics = topics
        self._limit_s = limit_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard-traffic")

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        deadline = time.monotonic() + self._limit_s
        tick = 0
        with (
            DatagramSender(self._path) as sender,
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as raw,
        ):
            tick_s = 0.05  # not a deadline: the interval between two bursts
            while not self._stop.wait(tick_s) and time.monotonic() < deadline:
                tick += 1
                burst = 40 + 30 * (tick % 20 > 10)  # a rate that changes, for the charts
                sender.send_many(
                    encode_any_partition(self._topics[0], b"click %d" % i) for i in range(burst)
                )
                sender.send_many(
                    encode_any_partition(self._topics[1], b"order %d" % i) for i in range(8)
                )
                if tick % 7 == 0:
                    good = encode_any_partition(self._topics[0], b"bad")
                    raw.sendto(struct.pack(">i", len(good) + 1) + good[4:], self._path)
                if tick % 11 == 0:
                    sender.send(self._topics[1], b"x" * 3000)  # too long for Kafka


#: The dashboard's values (headline numbers, facts, table cells, legend counts) that do
#: not fit their cell, as "name: text (why)": wider than the cell (scrollWidth over
#: clientWidth), or wrapped: its text on more than one line (text boxes that do not
#: overlap vertically; a smaller unit beside a number shares its line).
VALUES_THAT_DO_NOT_FIT = """() => {
  const values = document.querySelectorAll(
    ".kpi .value, .kpi .sub, .facts dt, .facts dd, table.data td, .legend li");
  const textLines = (element) => {
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    const boxes = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const range = document.createRange();
      range.selectNodeContents(node);
      boxes.push(...[...range.getClientRects()].filter((r) => r.width > 0));
    }
    boxes.sort((a, b) => a.top - b.top);
    let lines = 0;
    let bottom = -Infinity;
    for (const box of boxes) {
      if (box.top >= bottom - 1) lines += 1;
      bottom = Math.max(bottom, box.bottom);
    }
    return lines;
  };
  const problems = [];
  for (const element of values) {
    if (!element.textContent.trim() || element.getClientRects().length === 0) continue;
    const name = element.dataset.fact || element.className || element.tagName;
    const lines = textLines(element);
    if (element.scrollWidth > element.clientWidth + 1) {
      problems.push(`${name}: ${element.textContent} (overflows its cell)`);
    } else if (lines > 1) {
      problems.push(`${name}: ${element.textContent} (wraps onto ${lines} lines)`);
    }
  }
  return problems;
}"""


@pytest.mark.slow
def test_the_dashboard_is_live_in_chromium(daemon: RunningDaemon, topics: list[str]) -> None:
    # A missing browser fails the test rather than skipping it: `./dev test` installs it.
    assert CHROMIUM.exists(), "Debian's chromium is missing: `./dev test` installs it"
    from playwright.sync_api import expect, sync_playwright

    port = port_of(daemon)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.set_default_timeout(PAGE_TIMEOUT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on(
                "console",
                lambda message: errors.append(message.text) if message.type == "error" else None,
            )
            page.goto(f"http://127.0.0.1:{port}/")
            expect(page.locator("#live")).to_have_attribute("data-state", "live")

            with Traffic(daemon.daemon_config.datagram_path, topics):
                # Numbers that move while messages flow.
                expect(page.locator(f'tr[data-topic="{topics[0]}"]')).to_be_visible()
                first = page.locator("#received-total").inner_text()
                expect(page.locator("#received-total")).not_to_have_text(first)
                expect(page.locator("#received-rate")).not_to_have_text(re.compile(r"^(–|0)$"))

                # The button asks for a metadata refresh, and the refresh happens.
                before = daemon.call(lambda: daemon.server.metadata.last_updated_ms)
                page.click("#update-metadata")
                expect(page.locator("#metadata-note")).to_contain_text(
                    "Metadata update initiated at"
                )
                wait_until(
                    lambda: daemon.call(lambda: daemon.server.metadata.last_updated_ms) > before,
                    what="the metadata refresh the button asked for",
                )
                requests = page.locator('#metadata-facts dd[data-fact="update requests"]')
                expect(requests).to_have_text("1")

                # Message debugging: the card shows the traced topic; its button stops it.
                assert fetch(port, f"/msg_debug/add_topic/{topics[0]}").status == 200
                traced = page.locator('#msg-debug-facts dd[data-fact="traced topics"]')
                expect(traced).to_have_text(topics[0])
                page.click("#msg-debug-stop")
                expect(page.locator("#msg-debug-note")).to_have_text(
                    "All message debug topics disabled"
                )
                expect(traced).to_have_text("none")
                expect(page.locator("#msg-debug-stop")).to_be_disabled()
                assert fetch(port, "/msg_debug/get_topics").body == (
                    "No message debug topics are currently enabled\n"
                )

                # The spool card: the policy, and every message written ahead.
                policy = page.locator('#spool-facts dd[data-fact="policy"]')
                expect(policy).to_have_text("discard")
                expect(page.locator('#spool-facts dd[data-fact="unsettled"]')).to_be_visible()

                # A few more seconds of history, so that the charts have a shape.
                page.wait_for_function(
                    "document.querySelectorAll('#discard-chart rect').length >= 3"
                )
                page.wait_for_timeout(4000)
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
                # Every value fits its cell: none cut off, none wrapped onto a second line.
                for width in (1440, 1280, 1100, 900):  # both sides of the layout's break
                    page.set_viewport_size({"width": width, "height": 900})
                    crowded = page.evaluate(VALUES_THAT_DO_NOT_FIT)
                    assert crowded == [], f"at {width} px:\n" + "\n".join(crowded)
            assert errors == []
        finally:
            browser.close()


@pytest.mark.slow
def test_before_any_metadata_the_dashboard_says_so_and_counts_what_waits(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    assert CHROMIUM.exists(), "Debian's chromium is missing: `./dev test` installs it"
    from playwright.sync_api import expect, sync_playwright

    with socket.socket() as closed:  # a port nothing listens on: no broker answers
        closed.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{closed.getsockname()[1]}"
    config = DaemonConfig(nowhere, str(tmp_path_factory.mktemp("s", numbered=True)))
    daemon = RunningDaemon(config).start(wait_for_metadata=False)
    try:
        with DatagramSender(config.datagram_path) as sender:
            for i in range(3):
                sender.send("anywhere", b"waits %d" % i)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.set_default_timeout(PAGE_TIMEOUT_MS)
                page.goto(f"http://127.0.0.1:{port_of(daemon)}/")
                updated = page.locator('#metadata-facts dd[data-fact="last updated"]')
                expect(updated).to_have_text("no metadata yet (3 messages waiting)")
                expect(updated).to_have_class("warn")
            finally:
                browser.close()
    finally:
        daemon.stop()
    # Stopped before any metadata: what waited was settled (no spool: shutdown_delay).
    totals = daemon.server.books.per_topic()["anywhere"]
    assert totals.discarded_by_reason == {DiscardReason.SHUTDOWN_DELAY: 3}
    assert totals.in_flight == 0
