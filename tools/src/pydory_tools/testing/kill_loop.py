"""The kill loop: daemons SIGKILLed at random moments while clients send, restarted on the
same config and spool, and a landing job SIGKILLed in the middle of a batch.

Shared by ``pydory demo --sigkill``, ``pydory demo --fleet`` and
``tests/test_fleet_exactly_once.py``:

- :class:`SurvivingClient`: a thread sending unique, recognisable values
  (``<label>/<n>``) over one transport at a bounded rate, through the daemon's restarts.
  A UNIX stream or TCP client reconnects when its connection dies; the chunk a dead
  connection was writing is given up, never resent, because the daemon may have read
  part of it, and a resend would be a second *message* (a new identity), not a second
  copy. A datagram the kernel refused (``ECONNREFUSED``, ``ENOENT``: no daemon holds the
  socket) was not taken, so it is sent again, for at most ``retry_s`` in a row.
- :class:`KilledDaemon`: ``pydory serve`` (:class:`DaemonProcess`) SIGKILLed once its
  ``/counters`` show it accepted ``k`` more messages since it started, then started again
  on the same config and spool (or, for a host that never comes back, not); it counts its
  kills and what each start replayed.
- :class:`LandingJob`: ``pydory pipeline land`` as a process; :meth:`LandingJob.kill_mid_batch`
  SIGKILLs the driver and its Spark JVM once the checkpoint shows a batch planned and not
  committed (:meth:`LandingJob.batch_in_flight`, which also tells the fleet demo when to
  kill a Spark worker: the checkpoint read through a ``list_names`` of any file system).

Every moment is chosen by a condition (counters, files), never by a sleep; the clients'
pacing is their only wait.
"""

from __future__ import annotations

import errno
import functools
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from pydory.client.messages import encode_message
from pydory.daemon.books.counters import ACCEPTED, SPOOL_REPLAYED
from pydory.errors import PydoryError
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.daemon_process import START_TIMEOUT_S, DaemonProcess

__all__ = [
    "Endpoint",
    "KillLoopError",
    "KilledDaemon",
    "LandingJob",
    "ListNames",
    "SurvivingClient",
    "Transport",
    "endpoints",
    "jvm_child_of",
    "kill_thresholds",
]

#: How long a client waits in a row for a daemon to come back before it gives up.
RETRY_S = 60.0
#: How long a condition the loop waits for (k more accepted, a batch in flight) may take: a
#: hang's safety net only. Seconds on a quiet machine; at a 1-minute load of 20-30 a landing
#: job's first batch took over 120 s, and the fleet demo failed waiting for the next one.
CONDITION_TIMEOUT_S = 600.0
_POLL_S = 0.02  # between two looks at a condition: counters, files, a refused socket
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)
# A sendto blocked on a full queue wakes at the latest after this, and tries again.
_DATAGRAM_TIMEOUT_S = 5.0  # not a deadline: a blocked sendto wakes and retries
#: The errors that mean "no daemon is there right now": nothing was taken.
_NOBODY_THERE = (errno.ECONNREFUSED, errno.ENOENT)

Transport = Literal["datagram", "stream", "tcp"]
#: The names in a directory of a checkpoint (``[]`` when it does not exist yet).
ListNames = Callable[[str], Sequence[str]]
_T = TypeVar("_T")


class KillLoopError(PydoryError):
    """A client, daemon or landing job of the kill loop did not do what it must."""


class _Stopped(Exception):
    """A client was stopped while it waited for a daemon (one that will not come back)."""


@dataclass(frozen=True)
class Endpoint:
    """Where a client sends: a transport and its address (a socket path or a TCP port)."""

    transport: Transport
    address: str | int


def endpoints(config: DaemonConfig) -> dict[Transport, Endpoint]:
    """The daemon's three inputs, by transport."""
    found: dict[Transport, Endpoint] = {
        "datagram": Endpoint("datagram", config.datagram_path),
        "stream": Endpoint("stream", config.stream_path),
    }
    if config.tcp_port is not None:
        found["tcp"] = Endpoint("tcp", config.tcp_port)
    return found


def kill_thresholds(rng: random.Random, kills: int, low: int, high: int) -> list[int]:
    """``kills`` random moments, each "k more messages accepted", ``low`` <= k <= ``high``."""
    return [rng.randint(low, high) for _ in range(kills)]


# --- the clients -----------------------------------------------------------------------------


class SurvivingClient(threading.Thread):
    """Sends ``<label>/0``, ``<label>/1``, ... to ``topic`` until ``limit`` or :meth:`stop`,
    at most ``rate`` messages a second, in chunks of ``chunk``; survives daemon restarts.

    ``sent``: how many values were used (0 to ``sent - 1``): every value the daemon can
    have accepted is one of them. ``given_up``: of those, the ones in a stream write that
    failed (the daemon died under it). Errors are kept in ``error`` and raised by
    :meth:`finish`.
    """

    def __init__(
        self,
        label: str,
        endpoint: Endpoint,
        topic: str,
        *,
        limit: int,
        rate: float,
        partition_key: int | None = None,
        chunk: int = 20,
        retry_s: float = RETRY_S,
    ) -> None:
        super().__init__(name=f"client {label}", daemon=True)
        self.label, self.endpoint, self.topic = label, endpoint, topic
        self.limit, self.rate, self.partition_key = limit, rate, partition_key
        self.chunk, self.retry_s = chunk, retry_s
        self.sent = 0
        self.given_up = 0
        self.reconnects = 0
        self.error: BaseException | None = None
        self._stopped = threading.Event()
        self._connection: socket.socket | None = None

    def value(self, number: int) -> bytes:
        return f"{self.label}/{number}".encode()

    def stop(self) -> None:
        """Send no more (the chunk being sent is finished; a wait for a daemon that is
        gone ends, its chunk counted as used)."""
        self._stopped.set()

    def finish(self, timeout_s: float) -> None:
        """Wait until the client has sent its last chunk; raise what went wrong."""
        self.join(timeout_s)
        if self.is_alive():
            raise KillLoopError(f"client {self.label} did not finish in {timeout_s:g} s")
        if self.error is not None:
            raise KillLoopError(f"client {self.label} failed: {self.error}") from self.error

    def run(self) -> None:
        try:
            self._send_until_done()
        except BaseException as error:  # noqa: BLE001 -- handed to finish(), in the caller's thread
            self.error = error
        finally:
            if self._connection is not None:
                self._connection.close()

    def _send_until_done(self) -> None:
        next_at = time.monotonic()
        while self.sent < self.limit and not self._stopped.is_set():
            count = min(self.chunk, self.limit - self.sent)
            messages = [
                encode_message(self.topic, self.value(n), partition_key=self.partition_key)
                for n in range(self.sent, self.sent + count)
            ]
            try:
                if self.endpoint.transport == "datagram":
                    self._send_datagrams(messages)
                else:
                    self._send_on_stream(b"".join(messages), count)
            except _Stopped:
                # Some of a datagram chunk may have been taken before the daemon went.
                self.sent += count
                return
            self.sent += count
            # Paced from the later of the plan and now: after a daemon's restart the
            # client goes on at its rate instead of catching up in one burst.
            next_at = max(next_at, time.monotonic()) + count / self.rate
            self._stopped.wait(max(0.0, next_at - time.monotonic()))

    def _send_datagrams(self, messages: Sequence[bytes]) -> None:
        if self._connection is None:
            self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._connection.settimeout(_DATAGRAM_TIMEOUT_S)
        connection, path = self._connection, str(self.endpoint.address)
        for message in messages:
            self._while_nobody_there(functools.partial(connection.sendto, message, path))

    def _send_on_stream(self, data: bytes, count: int) -> None:
        if self._connection is None:
            self._connection = self._while_nobody_there(self._connect)
        try:
            self._connection.sendall(data, _SEND_FLAGS)
        except OSError:
            # The daemon died under the write: some of the chunk may be in it. Not resent.
            self._connection.close()
            self._connection = None
            self.given_up += count
            self.reconnects += 1

    def _connect(self) -> socket.socket:
        if self.endpoint.transport == "tcp":
            connection = socket.create_connection(("127.0.0.1", int(self.endpoint.address)))
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return connection
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(str(self.endpoint.address))
        except OSError:
            connection.close()
            raise
        return connection

    def _while_nobody_there(self, attempt: Callable[[], _T]) -> _T:
        """``attempt()``, again while no daemon holds the socket, for ``retry_s`` at most.

        A send that timed out (a full datagram queue that did not drain) took nothing
        either: it is tried again too. A client stopped meanwhile gives up (``_Stopped``).
        """
        deadline = time.monotonic() + self.retry_s
        while True:
            if self._stopped.is_set():
                raise _Stopped
            try:
                return attempt()
            except OSError as error:
                if not isinstance(error, TimeoutError) and error.errno not in _NOBODY_THERE:
                    raise
                if time.monotonic() > deadline:
                    raise KillLoopError(
                        f"client {self.label}: no daemon at {self.endpoint.address} "
                        f"for {self.retry_s:g} s ({error})"
                    ) from error
            time.sleep(_POLL_S)


# --- the daemons -----------------------------------------------------------------------------


class KilledDaemon:
    """``pydory serve`` on one config and spool, SIGKILLed and started again on demand.

    ``kills``: the SIGKILLs so far; ``replayed``: the messages every start replayed from
    the spool (its ``spool_replayed`` counter once it answers); ``gone``: killed for good
    (a host that crashed and never came back).
    """

    def __init__(
        self, config: DaemonConfig, workdir: Path, *, start_timeout_s: float = START_TIMEOUT_S
    ) -> None:
        self.config = config
        self.start_timeout_s = start_timeout_s
        self.config_path = workdir / "pydory.xml"
        self.log_path = workdir / "daemon.log"
        self.kills = 0
        self.replayed = 0
        self.accepted_at_start = 0
        self.gone = False
        self.process = self._start()

    def _start(self) -> DaemonProcess:
        process = DaemonProcess(self.config, self.config_path, self.log_path, wait_ready=False)
        process.wait_ready(self.start_timeout_s)
        counters = process.counters()
        self.replayed += counters.get(SPOOL_REPLAYED, 0)
        self.accepted_at_start = counters[ACCEPTED]
        return process

    def accepted_since_start(self) -> int:
        return self.process.counters()[ACCEPTED] - self.accepted_at_start

    def kill_after(
        self,
        more: int,
        timeout_s: float = CONDITION_TIMEOUT_S,
        *,
        come_back: bool = True,
        senders_done: Callable[[], bool] | None = None,
    ) -> None:
        """SIGKILL the daemon once it has accepted ``more`` messages since it started,
        then start it again on the same config and spool (returns once it answers);
        with ``come_back=False`` it stays dead, its spool as the kill left it.

        ``senders_done``: when it says the clients have sent their last, the kill comes
        at once instead. What a kill caught in the socket buffers is never sent again, and
        on a busy machine (a slow reader, full buffers) that can leave fewer messages for
        the next run than its threshold: waiting for them would wait for ever."""
        deadline = time.monotonic() + timeout_s
        while self.accepted_since_start() < more:
            if senders_done is not None and senders_done():
                break
            if self.process.process.poll() is not None:
                raise KillLoopError(f"the daemon exited by itself; see {self.log_path}")
            if time.monotonic() > deadline:
                raise KillLoopError(
                    f"the daemon accepted {self.accepted_since_start()} of {more} messages "
                    f"in {timeout_s:g} s; see {self.log_path}"
                )
            time.sleep(_POLL_S)
        self.process.kill()
        self.kills += 1
        if come_back:
            self.process = self._start()
        else:
            self.gone = True

    def kill_at(
        self,
        thresholds: Sequence[int],
        timeout_s: float = CONDITION_TIMEOUT_S,
        *,
        come_back: bool = True,
        senders_done: Callable[[], bool] | None = None,
    ) -> None:
        """:meth:`kill_after` each of ``thresholds`` in turn; with ``come_back=False`` the
        last kill is for good."""
        for number, more in enumerate(thresholds, start=1):
            again = come_back or number < len(thresholds)
            self.kill_after(more, timeout_s, come_back=again, senders_done=senders_done)

    def settle(self, timeout_s: float = 60.0) -> None:
        """Return once every message the daemon read is delivered or discarded (the
        commit point's long poll)."""
        page = f"commit_point/json?after=now&timeout={timeout_s:g}"
        if not self.process.page(page)["passed"]:
            raise KillLoopError(f"the daemon did not settle in {timeout_s:g} s")

    def stop(self) -> int:
        """SIGTERM (a clean stop: its final books written and published); the exit status
        (-9 for a daemon killed for good: nothing to stop)."""
        return self.process.stop()


# --- the landing job -------------------------------------------------------------------------


class LandingJob:
    """``pydory pipeline land ARGS`` as a process of its own, its output lines kept."""

    def __init__(self, args: Sequence[str], stderr_path: Path) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        with stderr_path.open("ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pydory", "pipeline", "land", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self._reader = threading.Thread(target=self._read, name="landing output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def wait_for_line(self, prefix: str, timeout_s: float = CONDITION_TIMEOUT_S) -> str:
        """The first output line starting with ``prefix``, once it is printed."""
        with self._changed:
            found = self._changed.wait_for(
                lambda: (
                    any(line.startswith(prefix) for line in self.lines)
                    or self.process.poll() is not None
                ),
                timeout_s,
            )
            line = next((line for line in self.lines if line.startswith(prefix)), None)
        if not found or line is None:
            raise KillLoopError(f"the landing job printed no {prefix!r}:\n{self.output}")
        return line

    def kill_mid_batch(
        self, checkpoint: Path, after_batch: int = 0, timeout_s: float = CONDITION_TIMEOUT_S
    ) -> int:
        """SIGKILL the job (driver and Spark JVM) while a batch numbered above
        ``after_batch`` is planned in ``checkpoint`` (``offsets/N``) and not committed
        (no ``commits/N``); return N."""
        planned = self.batch_in_flight(
            lambda name: _local_names(checkpoint / name), after_batch, timeout_s
        )
        self.kill()
        return planned

    def batch_in_flight(
        self, list_names: ListNames, after_batch: int = 0, timeout_s: float = CONDITION_TIMEOUT_S
    ) -> int:
        """Wait until a batch N above ``after_batch`` is planned (``offsets/N`` in the
        checkpoint ``list_names`` reads: given ``"offsets"`` or ``"commits"``) and not
        committed (no ``commits/N``); return N."""
        deadline = time.monotonic() + timeout_s
        while True:
            planned = _last_batch(list_names("offsets"))
            if planned > after_batch and planned > _last_batch(list_names("commits")):
                return planned
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise KillLoopError(
                    f"no batch above {after_batch} was seen in flight:\n{self.output}"
                )
            time.sleep(_POLL_S)

    def kill(self) -> None:
        """SIGKILL the driver and its Spark JVM (by their pids) and wait until both are gone."""
        jvm = jvm_child_of(self.process.pid)
        self.process.kill()
        if jvm is not None:
            os.kill(jvm, signal.SIGKILL)
        self.process.wait(60)
        self._reader.join(60)
        if jvm is not None:
            _wait_gone(jvm)

    def wait(self, timeout_s: float) -> int:
        """The job's exit status, once it has exited (killed after ``timeout_s``)."""
        try:
            status = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise KillLoopError(
                f"the landing job ran over {timeout_s:g} s:\n{self.output}"
            ) from None
        self._reader.join(60)
        return status

    def stop(self, timeout_s: float = CONDITION_TIMEOUT_S) -> int:
        """SIGTERM (the job finishes its batch and exits 0); its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.wait(timeout_s)


def _local_names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def _last_batch(names: Sequence[str]) -> int:
    """The highest batch number among a Spark checkpoint log's names (``offsets/``,
    ``commits/``); -1."""
    return max((int(name) for name in names if name.isdigit()), default=-1)


def jvm_child_of(pid: int) -> int | None:
    """The pid of a ``java`` process whose parent is ``pid``, if there is one yet."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended while we looked
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        parent = int(text[text.rindex(")") + 2 :].split()[1])
        if parent == pid and name == "java":
            return int(stat.parent.name)
    return None


def _wait_gone(pid: int, timeout_s: float = 60.0) -> None:
    """Until ``pid`` (not our child: reaped by whoever adopted it) has exited."""
    deadline = time.monotonic() + timeout_s
    stat = Path(f"/proc/{pid}/stat")
    while time.monotonic() < deadline:
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(_POLL_S)
    raise KillLoopError(f"process {pid} was SIGKILLed and still runs after {timeout_s:g} s")
