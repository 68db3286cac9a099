"""Every status page escapes client-chosen text (issue 33, point 3): a rejected topic name
is the client's bytes, and must not forge or break a line of ``/discards/plain``. (The
JSON pages are JSON-encoded, the dashboard sets ``textContent`` only, and the discard log
escapes such a name as well.)"""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st

from pydory.daemon.books.accounting import Books
from pydory.daemon.books.events import DiscardReason
from pydory.status.discards import discard_report_json, discard_report_plain, printable_name

FORGED = "x\n    recent bad topic: 4[fake]\n\nlatest finished reporting period:"
BAD_TOPIC_LINE = re.compile(r"^    recent bad topic: (\d+)\[(.*)\]$")


def books_with_bad_topics(*names: str) -> Books:
    books = Books(600, 100, wall_clock=lambda: 1_700_000_000.0, recent_limit=100)
    for name in names:
        books.discarded(DiscardReason.BAD_TOPIC, name, 1_700_000_000_000)
    return books


def bad_topic_lines(plain: str) -> list[str]:
    return [line for line in plain.split("\n") if line.startswith("    recent bad topic")]


def test_a_topic_name_with_a_newline_cannot_forge_a_line_of_discards_plain() -> None:
    plain = discard_report_plain(books_with_bad_topics(FORGED).discard_report())

    assert bad_topic_lines(plain) == [
        "    recent bad topic: 69[x\\n    recent bad topic: 4[fake]\\n\\nlatest finished "
        "reporting period:]"
    ]
    assert "latest finished reporting period:" not in plain.split("\n")


@given(st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=5))
def test_any_rejected_name_is_one_line_whose_length_is_what_is_printed(names: list[str]) -> None:
    books = books_with_bad_topics(*names)
    plain = discard_report_plain(books.discard_report())

    kept = books.discard_report().unfinished.recent_bad_topic
    lines = bad_topic_lines(plain)
    assert len(lines) == len(kept)
    for line, name in zip(lines, kept, strict=True):
        match = BAD_TOPIC_LINE.match(line)
        assert match is not None
        assert int(match.group(1)) == len(match.group(2).encode("utf-8", "surrogateescape"))
        assert match.group(2) == printable_name(name)
        assert match.group(2).isprintable()
    # The JSON page keeps the names themselves, JSON's escaping keeping them in strings.
    body = json.loads(json.dumps(discard_report_json(books.discard_report())))
    assert body["unfinished_report"]["recent_bad_topic"] == list(kept)


def test_a_name_kafka_accepts_is_printed_as_it_is() -> None:
    assert printable_name("events.v1-A_b") == "events.v1-A_b"
