"""The books topic: each run's durable books (:mod:`pydory.daemon.books.durable`)
published to Kafka, so that they leave the host with the data and a fleet audit can read
every host's books without reaching any daemon's status port.

One record per run, keyed ``<host id>/<incarnation>``, its value the record's JSON: a
compacted topic keeps the latest of each run (``final: true`` once the run stopped
cleanly, or once the next start rebuilt it after a crash). The topic is named by
``<messageIdentity><booksTopic>`` (default ``pydory.books``, empty: not published). At
start (on a thread of its own: Kafka may not answer yet) the daemon looks for it and,
with ``topicAutocreate`` on, creates it when missing (one partition,
``cleanup.policy=compact``, through Kafka's admin API); otherwise a missing books topic
is logged once and nothing is published (create it by hand: docs/operations.md). A
record is re-sent at every write of the books (every ``BOOKS_PUBLISH_INTERVAL_S``, at a
rebuild, at the stop), the latest per run held until the topic is found; one that fails
is logged and replaced by the next: the books file in the spool directory stays the
daemon's own copy.

Its own librdkafka producer (the cluster's properties, idempotent, no identity header):
the books are never in the data path's books, nor in its pool.

Rule: :class:`BooksPublisher` is the only code that writes to the books topic.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # confluent_kafka.admin does not declare it

from pydory.daemon.books.durable import RunBooks
from pydory.daemon.delivery.librdkafka_settings import (
    books_admin_properties,
    books_producer_properties,
)

log = logging.getLogger(__name__)

#: How often a running daemon writes and publishes its books.
BOOKS_PUBLISH_INTERVAL_S = 5.0
#: At the stop, how long the final record may take to reach Kafka (the next start
#: publishes it again: a Kafka down at the stop must not hold the stop long).
BOOKS_FLUSH_S = 2.0
_CREATE_TIMEOUT_S = 15.0


def books_value(books: RunBooks) -> bytes:
    return json.dumps(books.record(), separators=(",", ":"), sort_keys=True).encode()


class BooksPublisher:
    """Publishes run records to the books topic; ``poll`` serves its reports."""

    def __init__(self, properties: dict[str, Any], topic: str, *, create: bool) -> None:
        """``properties``: the cluster's (bootstrap, TLS, SASL...); ``create``: create the
        topic if missing. Raises KafkaException if librdkafka refuses the properties."""
        self.topic = topic
        self._create = create
        self._properties = properties
        #: None until the topic is found (or not): records wait in ``_held`` meanwhile.
        self.enabled: bool | None = None
        self._held: dict[str, RunBooks] = {}
        self._looked = threading.Event()  # the lookup's answer is in ``_lookup_found``
        self._lookup_found = False
        self._producer: Producer | None = Producer(books_producer_properties(properties))
        self.published = 0  # records Kafka acknowledged
        self.failed = 0
        self._failing = False

    def start(self, call_on_loop: Callable[[Callable[[], None]], object]) -> None:
        """Look for (or create) the topic on a thread of its own, never waited for: a
        Kafka that does not answer must hold neither the start nor the stop."""

        def look() -> None:
            self._lookup_found = found = self._find_or_create()
            self._looked.set()
            with contextlib.suppress(RuntimeError):  # the loop is closed: the daemon stopped
                call_on_loop(lambda: self._found(found))

        threading.Thread(target=look, name="pydory-books-topic", daemon=True).start()

    def _find_or_create(self) -> bool:
        # Never created by looking (a producer's metadata request may ask the broker to
        # auto-create it, uncompacted): created below, compacted, or not at all.
        admin = AdminClient(books_admin_properties(self._properties))
        try:
            topics = admin.list_topics(self.topic, timeout=_CREATE_TIMEOUT_S).topics
        except KafkaException as exc:
            log.warning("books topic %s: cannot look for it: %s", self.topic, exc.args[0].str())
            return False
        found = topics.get(self.topic)
        if found is not None and found.error is None:
            return True
        if not self._create:
            log.log(
                25,
                "books topic %s does not exist and topicAutocreate is off: books not "
                "published (create it, compacted: docs/operations.md)",
                self.topic,
            )
            return False
        topic = NewTopic(self.topic, 1, config={"cleanup.policy": "compact"})
        try:
            admin.create_topics([topic], request_timeout=_CREATE_TIMEOUT_S)[self.topic].result(
                timeout=_CREATE_TIMEOUT_S
            )
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                log.warning("books topic %s: cannot create it: %s", self.topic, error.str())
                return False
        log.info("books topic %s created (compacted)", self.topic)
        return True

    def _found(self, found: bool) -> None:
        if self.enabled is not None:
            return  # the stop's flush took the answer first
        self.enabled = found
        held, self._held = self._held, {}
        if found:
            for books in held.values():
                self.publish(books)

    def publish(self, books: RunBooks) -> None:
        """Hand ``books``' record to librdkafka (never blocks; a full queue is logged)."""
        if not self.enabled:
            if self.enabled is None:
                self._held[books.key] = books
            return
        assert self._producer is not None, "enabled after close()"
        try:
            self._producer.produce(
                self.topic, books_value(books), books.key, on_delivery=self._delivered
            )
        except (BufferError, KafkaException) as exc:
            self._report_failure(f"not queued: {exc}")
        self._producer.poll(0)

    def poll(self) -> None:
        if self._producer is not None:
            self._producer.poll(0)

    def flush(self, timeout_s: float = BOOKS_FLUSH_S) -> int:
        """Blocking: wait for the records held to reach Kafka; how many did not. A stop
        soon after the start waits (within ``timeout_s``) for the topic's lookup too."""
        if self.enabled is None and self._looked.wait(timeout_s):
            self._found(self._lookup_found)  # the loop waits for this flush meanwhile
        if not self.enabled or self._producer is None:
            return len(self._held)
        return int(self._producer.flush(timeout_s))

    def close(self) -> None:
        """Blocking, after :meth:`flush`: destroy the producer now. Left to the garbage
        collector (the server holds reference cycles), it would go on reconnecting to the
        brokers after the daemon stopped, to whatever listens on their ports by then."""
        self.enabled = False
        producer, self._producer = self._producer, None
        del producer  # the last reference: librdkafka's handle is destroyed here

    def _delivered(self, error: Any, _message: Any) -> None:
        if error is None:
            self.published += 1
            if self._failing:
                log.info("books topic %s: publishing again", self.topic)
                self._failing = False
            return
        self._report_failure(error.str())

    def _report_failure(self, why: str) -> None:
        self.failed += 1
        if not self._failing:
            self._failing = True
            log.warning("books topic %s: a record was not published (%s)", self.topic, why)
