"""Message identity (issue 24, item 1): its config, its host id, its rendering, and the
``pydory-id`` header on the records a daemon produces (librdkafka's mock cluster; the
spool and SIGKILL on Apache Kafka are in ``test_spool_acks_kafka.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import settled, wait_until
from pydory.client import UnixStreamSender
from pydory.config.loader import parse_config
from pydory.daemon.spool import identity as identity_module
from pydory.daemon.spool.identity import HEADER_NAME, MessageIds, resolve_host_id
from pydory.errors import ConfigError
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon import running_daemon
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import ApiKey, ErrorCode, MockCluster
from test_spool_acks_kafka import read_topic


def config_xml(**identity: object) -> str:
    return DaemonConfig("127.0.0.1:9092", "/tmp/pydory-identity", **identity).render()  # type: ignore[arg-type]


def test_message_identity_is_on_by_default_with_the_machines_host_id() -> None:
    config = parse_config(config_xml())
    assert config.message_identity.host_id is None
    assert config.message_identity.headers is True


def test_message_identity_reads_a_host_id_and_turns_headers_off() -> None:
    config = parse_config(config_xml(host_id="web-17.a_b", identity_headers=False))
    assert config.message_identity.host_id == "web-17.a_b"
    assert config.message_identity.headers is False


@pytest.mark.parametrize("host", ["", "a/b", "a b", "x" * 65, "é"])
def test_a_host_id_that_cannot_be_rendered_is_refused(host: str) -> None:
    with pytest.raises(ConfigError, match="host id"):
        parse_config(config_xml(host_id=host))


def test_the_host_id_falls_back_to_one_kept_in_the_spool_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_host_id("configured", str(tmp_path)) == "configured"
    machine_id = tmp_path / "machine-id"
    machine_id.write_text("0123456789abcdef0123456789abcdef\n")
    monkeypatch.setattr(identity_module, "MACHINE_ID_PATH", str(machine_id))
    assert resolve_host_id(None, str(tmp_path)) == "0123456789abcdef0123456789abcdef"
    monkeypatch.setattr(identity_module, "MACHINE_ID_PATH", str(tmp_path / "none"))
    spool = tmp_path / "spool"
    kept = resolve_host_id(None, str(spool))
    assert (spool / "host-id").read_text().strip() == kept
    assert resolve_host_id(None, str(spool)) == kept  # stable across restarts


def test_identities_are_rendered_compactly_and_never_repeat() -> None:
    ids = MessageIds("web-17", 0x9B2D4C0E7A1F3355)
    (spooled,) = ids.spooled(4, 81234, 1)
    assert spooled == [(HEADER_NAME, b"web-17/9b2d4c0e7a1f3355/4/81234")]
    unspooled = ids.unspooled(3) + ids.unspooled(2)
    values = {h[0][1] for h in unspooled if h is not None}
    assert len(values) == 5
    assert all(v.startswith(b"web-17/9b2d4c0e7a1f3355/0/") for v in values)
    assert MessageIds("web-17", 1, headers=False).spooled(1, 0, 2) == [None, None]


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("s", numbered=True))  # UNIX paths: keep them short


@pytest.mark.parametrize("headers", [True, False])
@pytest.mark.parametrize("spool", [True, False])
def test_every_record_carries_its_identity_unless_headers_are_off(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    tmp_path: Path,
    headers: bool,
    spool: bool,
) -> None:
    topic = unique_topic("identity")
    mock_cluster.create_topic(topic, 4)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        host_id="host-a",
        identity_headers=headers,
        spool_path=str(tmp_path / "spool") if spool else None,
    )
    count = 500
    with running_daemon(config), UnixStreamSender(config.stream_path) as sender:
        sender.send_many(encode_any_partition(topic, b"v%04d" % n) for n in range(count))
    # The stop delivered what it had read (shutdownMaxDelay: 10 s).
    records = read_topic(mock_cluster.bootstrap_servers, topic)
    assert sorted(v for v, _ in records) == [b"v%04d" % n for n in range(count)]
    identities = [identity for _, identity in records]
    if not headers:
        assert identities == [None] * count
        return
    assert len(set(identities)) == count
    for identity in identities:
        assert identity is not None
        host, incarnation, stream, sequence = identity.split(b"/")
        assert host == b"host-a"
        assert len(incarnation) == 16
        assert (int(stream) > 0) == spool  # stream 0: no spool frame holds it
        assert int(sequence) >= 0


@pytest.mark.parametrize("spool", [False, True])
def test_a_message_resent_after_a_failed_attempt_keeps_its_identity(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    tmp_path: Path,
    spool: bool,
) -> None:
    # librdkafka retries NOT_ENOUGH_REPLICAS itself (retries = maxFailedDeliveryAttempts);
    # four in a row hand the message back to the daemon, which sends it again: that
    # second copy must carry the identity the first attempt had (a delivery report gives
    # no headers back), or a landing job could not tell it from the first.
    topic = unique_topic("resent")
    mock_cluster.create_topic(topic, 4)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        host_id="host-a",
        max_failed_delivery_attempts=3,
        spool_path=str(tmp_path / "spool") if spool else None,
    )
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as sender:
        sender.send(topic, b"warm-up")
        wait_until(settled(daemon, topic, 1))
        for number, partition_key in enumerate((None, 7), start=2):
            mock_cluster.push_request_errors(ApiKey.PRODUCE, [ErrorCode.NOT_ENOUGH_REPLICAS] * 4)
            sender.send(
                topic, b"resent-%s" % str(partition_key).encode(), partition_key=partition_key
            )
            wait_until(settled(daemon, topic, number), timeout_s=60, what="the resend to settle")
        snapshot = daemon.snapshot()
    assert snapshot["rerouted"] == 2
    assert snapshot["topics"][topic]["delivered"] == 3
    identities = dict(read_topic(mock_cluster.bootstrap_servers, topic))
    warm_up = identities[b"warm-up"]
    assert warm_up is not None
    host, incarnation, _, first = warm_up.split(b"/")
    for value, given_after in ((b"resent-None", 1), (b"resent-7", 2)):
        identity = identities[value]
        assert identity is not None, f"{value!r} was resent without its identity"
        assert identity.split(b"/")[:2] == [host, incarnation]
        stream, sequence = (int(part) for part in identity.split(b"/")[2:])
        if not spool:  # stream 0: the run's counter, one per message read
            assert (stream, sequence) == (0, int(first) + given_after)
        else:  # where the write-ahead put it (a settled segment starts a new stream)
            assert stream > 0
    assert len(set(identities.values())) == 3


def test_the_books_topic_is_pydory_books_unless_configured_or_emptied() -> None:
    assert parse_config(config_xml()).message_identity.books_topic == "pydory.books"
    configured = parse_config(config_xml(books_topic="fleet.books"))
    assert configured.message_identity.books_topic == "fleet.books"
    assert parse_config(config_xml(books_topic="")).message_identity.books_topic is None
    with pytest.raises(ConfigError, match="books topic"):
        parse_config(config_xml(books_topic="no spaces"))
