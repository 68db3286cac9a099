"""librdkafka's mock Kafka cluster, driven through ctypes.

The confluent-kafka wheel bundles librdkafka, and librdkafka contains a mock
cluster: real TCP listeners on 127.0.0.1 speaking enough of the Kafka protocol
for producers and consumers, with hooks to move partition leaders, take brokers
down and inject error codes. It is the backbone of pydory's fault tests.

Quirk worth knowing: the mock's partitions drop old log segments past a few MB,
so count delivered messages by high watermark, or read them back promptly.

Run it as a process for demos and manual testing::

    python -m pydory_tools.testing.mock_cluster --brokers 3 --topic events:4

The first line of output is the bootstrap string; the process serves until
SIGTERM or SIGINT and then exits 0.
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import confluent_kafka

from pydory.errors import PydoryError
from pydory_tools.testing.lifecycle import StopsOnExit

__all__ = [
    "ApiKey",
    "ErrorCode",
    "MockCluster",
    "MockClusterError",
    "main",
]


class ApiKey:
    """Kafka protocol request types (ApiKey) that tests inject errors into."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    API_VERSIONS = 18
    INIT_PRODUCER_ID = 22


class ErrorCode:
    """Kafka protocol error codes (rd_kafka_resp_err_t values) that tests use.

    Negative values are librdkafka-internal; ``TRANSPORT`` makes the mock broker
    drop the client's connection instead of answering.
    """

    TRANSPORT = -195
    NO_ERROR = 0
    UNKNOWN_TOPIC_OR_PART = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_FOR_PARTITION = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    NOT_ENOUGH_REPLICAS = 19
    TOPIC_AUTHORIZATION_FAILED = 29


class MockClusterError(PydoryError):
    """A mock-cluster call failed: the test set up something the mock rejects.

    ``call`` names the librdkafka function, ``code`` is its rd_kafka_resp_err_t.
    Fix the test's arguments (unknown broker id, topic, partition).
    """

    def __init__(self, call: str, code: int, reason: str) -> None:
        super().__init__(f"{call} failed: {reason} (error code {code})")
        self.call = call
        self.code = code
        self.reason = reason


_RD_KAFKA_PRODUCER = 0
_ERRSTR_SIZE = 512

_c_void_p = ctypes.c_void_p
_c_char_p = ctypes.c_char_p
_c_int = ctypes.c_int
_c_int16 = ctypes.c_int16
_c_int32 = ctypes.c_int32
_c_size_t = ctypes.c_size_t

# name -> (restype, argtypes). Pointers are c_void_p so 64-bit addresses survive.
_SIGNATURES: dict[str, tuple[type | None, list[type]]] = {
    "rd_kafka_conf_new": (_c_void_p, []),
    "rd_kafka_conf_destroy": (None, [_c_void_p]),
    "rd_kafka_conf_set": (_c_int, [_c_void_p, _c_char_p, _c_char_p, _c_char_p, _c_size_t]),
    "rd_kafka_new": (_c_void_p, [_c_int, _c_void_p, _c_char_p, _c_size_t]),
    "rd_kafka_destroy": (None, [_c_void_p]),
    "rd_kafka_err2str": (_c_char_p, [_c_int]),
    "rd_kafka_mock_cluster_new": (_c_void_p, [_c_void_p, _c_int]),
    "rd_kafka_mock_cluster_destroy": (None, [_c_void_p]),
    "rd_kafka_mock_cluster_bootstraps": (_c_char_p, [_c_void_p]),
    "rd_kafka_mock_topic_create": (_c_int, [_c_void_p, _c_char_p, _c_int, _c_int]),
    "rd_kafka_mock_partition_set_leader": (_c_int, [_c_void_p, _c_char_p, _c_int32, _c_int32]),
    "rd_kafka_mock_broker_set_down": (_c_int, [_c_void_p, _c_int32]),
    "rd_kafka_mock_broker_set_up": (_c_int, [_c_void_p, _c_int32]),
    "rd_kafka_mock_broker_set_rtt": (_c_int, [_c_void_p, _c_int32, _c_int]),
    "rd_kafka_mock_clear_request_errors": (None, [_c_void_p, _c_int16]),
    "rd_kafka_mock_push_request_errors_array": (
        None,
        [_c_void_p, _c_int16, _c_size_t, ctypes.POINTER(_c_int)],
    ),
}
# Varargs: no argtypes; each call passes explicitly typed ctypes values.
_VARARGS_PUSH = "rd_kafka_mock_push_request_errors"
_VARARGS_BROKER_PUSH = "rd_kafka_mock_broker_push_request_error_rtts"
_OPTIONAL = {"rd_kafka_mock_push_request_errors_array"}


def find_librdkafka() -> Path:
    """Return the librdkafka shared library bundled in the confluent-kafka wheel."""
    package_dir = Path(confluent_kafka.__file__).resolve().parent
    libs_dir = package_dir.parent / "confluent_kafka.libs"
    candidates = sorted(libs_dir.glob("librdkafka*.so*"))
    if not candidates:
        raise FileNotFoundError(
            f"no librdkafka shared library in {libs_dir}: is confluent-kafka installed "
            "from its manylinux wheel (which bundles librdkafka)?"
        )
    return candidates[0]


def _load_library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(find_librdkafka()))
    for name, (restype, argtypes) in _SIGNATURES.items():
        if name in _OPTIONAL and not hasattr(lib, name):
            continue
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    getattr(lib, _VARARGS_PUSH).restype = None
    getattr(lib, _VARARGS_BROKER_PUSH).restype = _c_int
    return lib


_lib: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL:
    """Load librdkafka once per process (loading is cheap, but the handle is shared)."""
    global _lib
    if _lib is None:
        _lib = _load_library()
    return _lib


class MockCluster(StopsOnExit):
    """A running librdkafka mock cluster with ``brokers`` brokers, ids 1..n.

    The cluster starts in the constructor and serves until :meth:`stop` (or the
    end of a ``with`` block). Topics are auto-created on first use with the
    mock's defaults; call :meth:`create_topic` for an explicit partition count.
    """

    def __init__(self, brokers: int = 3) -> None:
        if brokers < 1:
            raise ValueError(f"a mock cluster needs at least one broker, got {brokers}")
        self._lib = _library()
        self._rk = self._new_handle()
        cluster = self._lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not cluster:
            self._lib.rd_kafka_destroy(self._rk)
            raise MockClusterError("rd_kafka_mock_cluster_new", -1, "returned NULL")
        self._cluster: int | None = cluster
        self._broker_count = brokers
        self._bootstrap_servers: str = self._lib.rd_kafka_mock_cluster_bootstraps(cluster).decode()

    def _new_handle(self) -> int:
        """Create the rd_kafka_t the mock API needs for its own book-keeping."""
        conf = self._lib.rd_kafka_conf_new()
        errstr = ctypes.create_string_buffer(_ERRSTR_SIZE)
        # The handle never talks to a cluster; keep it from logging about that.
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, _ERRSTR_SIZE)
        rk = self._lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, _ERRSTR_SIZE)
        if not rk:
            self._lib.rd_kafka_conf_destroy(conf)  # ownership passes only on success
            raise MockClusterError("rd_kafka_new", -1, errstr.value.decode(errors="replace"))
        return int(rk)

    @property
    def bootstrap_servers(self) -> str:
        """The ``bootstrap.servers`` string for clients, e.g. ``127.0.0.1:40001,...``."""
        return self._bootstrap_servers

    @property
    def broker_ids(self) -> range:
        """The ids of this cluster's brokers: 1..n."""
        return range(1, self._broker_count + 1)

    def create_topic(self, name: str, partitions: int, replication_factor: int = 1) -> None:
        """Create ``name`` with ``partitions`` partitions, leaders spread over the brokers."""
        self._check(
            "rd_kafka_mock_topic_create",
            self._lib.rd_kafka_mock_topic_create(
                self._handle(), name.encode(), partitions, replication_factor
            ),
        )

    def set_partition_leader(self, topic: str, partition: int, broker_id: int) -> None:
        """Move the leader of ``topic``/``partition`` to ``broker_id`` (-1: no leader)."""
        self._check(
            "rd_kafka_mock_partition_set_leader",
            self._lib.rd_kafka_mock_partition_set_leader(
                self._handle(), topic.encode(), partition, broker_id
            ),
        )

    def broker_down(self, broker_id: int) -> None:
        """Disconnect ``broker_id``'s clients and refuse new connections.

        Leaders do not move: partitions it leads are unavailable until :meth:`broker_up`.
        """
        self._check(
            "rd_kafka_mock_broker_set_down",
            self._lib.rd_kafka_mock_broker_set_down(self._handle(), broker_id),
        )

    def broker_up(self, broker_id: int) -> None:
        """Let ``broker_id`` accept connections again."""
        self._check(
            "rd_kafka_mock_broker_set_up",
            self._lib.rd_kafka_mock_broker_set_up(self._handle(), broker_id),
        )

    def set_rtt(self, broker_id: int, rtt_ms: int) -> None:
        """Delay every response from ``broker_id`` by ``rtt_ms`` milliseconds."""
        self._check(
            "rd_kafka_mock_broker_set_rtt",
            self._lib.rd_kafka_mock_broker_set_rtt(self._handle(), broker_id, rtt_ms),
        )

    def push_request_errors(self, api_key: int, errors: Sequence[int]) -> None:
        """Make the next ``len(errors)`` requests of type ``api_key`` fail, in order.

        ``api_key`` is an :class:`ApiKey`, each error an :class:`ErrorCode` (or any
        rd_kafka_resp_err_t value; 0 lets that request through).
        """
        cluster = self._handle()
        if hasattr(self._lib, "rd_kafka_mock_push_request_errors_array"):
            array = (_c_int * len(errors))(*errors)
            self._lib.rd_kafka_mock_push_request_errors_array(cluster, api_key, len(errors), array)
            return
        varargs = [_c_int(code) for code in errors]
        getattr(self._lib, _VARARGS_PUSH)(
            _c_void_p(cluster), _c_int16(api_key), _c_size_t(len(errors)), *varargs
        )

    def push_broker_request_errors(
        self, broker_id: int, api_key: int, errors_and_rtts: Sequence[tuple[int, int]]
    ) -> None:
        """Answer the next requests of type ``api_key`` that ``broker_id`` receives, in
        order, each with its (error, rtt_ms): the error (0: handled as usual, e.g. a
        produce written) and its response held back that long, as a busy network or
        host delays it (a client whose request times out meanwhile retries it)."""
        varargs = [_c_int(value) for pair in errors_and_rtts for value in pair]
        self._check(
            _VARARGS_BROKER_PUSH,
            getattr(self._lib, _VARARGS_BROKER_PUSH)(
                _c_void_p(self._handle()),
                _c_int32(broker_id),
                _c_int16(api_key),
                _c_size_t(len(errors_and_rtts)),
                *varargs,
            ),
        )

    def clear_request_errors(self, api_key: int) -> None:
        """Drop any errors still queued for ``api_key``."""
        self._lib.rd_kafka_mock_clear_request_errors(self._handle(), api_key)

    def stop(self) -> None:
        """Close the listeners and free the cluster. Calling it again does nothing."""
        if self._cluster is None:
            return
        cluster, self._cluster = self._cluster, None
        self._lib.rd_kafka_mock_cluster_destroy(cluster)
        self._lib.rd_kafka_destroy(self._rk)

    def _handle(self) -> int:
        if self._cluster is None:
            raise MockClusterError("MockCluster", -1, "the mock cluster has been stopped")
        return self._cluster

    def _check(self, call: str, code: int) -> None:
        if code != ErrorCode.NO_ERROR:
            reason = self._lib.rd_kafka_err2str(code).decode(errors="replace")
            raise MockClusterError(call, code, reason)


# --- the command-line process ---------------------------------------------------------------


def _topic_spec(text: str) -> tuple[str, int]:
    """Parse ``NAME:PARTITIONS`` for --topic."""
    name, sep, count = text.rpartition(":")
    if not sep or not name or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME:PARTITIONS, got {text!r}")
    return name, int(count)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pydory_tools.testing.mock_cluster",
        description="Serve a librdkafka mock Kafka cluster on 127.0.0.1 until SIGTERM/SIGINT. "
        "Prints the bootstrap servers on the first line.",
    )
    parser.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    parser.add_argument(
        "--topic",
        type=_topic_spec,
        action="append",
        default=[],
        metavar="NAME:PARTITIONS",
        help="create a topic (repeatable)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a mock cluster until SIGTERM or SIGINT; return the exit status."""
    args = _parse_args(argv)
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    # Block before the cluster starts its threads, so they inherit the mask and the
    # signal stays pending for sigwait below instead of landing in a worker thread.
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    with MockCluster(args.brokers) as cluster:
        for name, partitions in args.topic:
            cluster.create_topic(name, partitions)
        print(cluster.bootstrap_servers, flush=True)
        received = signal.sigwait(stop_signals)
        print(f"stopping on {signal.Signals(received).name}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
