"""The input agents a server runs: opened from the config, changed by a reload, closed
at shutdown.

One datagram socket and up to two stream listeners (UNIX stream, TCP), as the config's
``<inputSources>`` asks, plus the stream listeners a reload retired: those no longer
accept, but read the connections open on them until their clients close them (closing a
TCP connection would lose what its client writes meanwhile, unknown to it). Rule:
everything that pauses, marks or closes "the inputs" goes through :class:`InputSet`, so a retired
listener is never forgotten by the overload policy, the commit point or the shutdown.

A reload changes the inputs in two steps, so that a failure changes nothing:
:meth:`InputSet.open_changed` opens each input the new config adds or moves beside the
running ones (:meth:`InputSwap.close_opened` undoes it), and :meth:`InputSet.swap` puts
them in place and retires what they replace.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable

from pydory.config import Config
from pydory.config.model import QuotasConfig
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.events import Transport
from pydory.daemon.books.pool import MemoryPool
from pydory.daemon.inputs.acceptor import FdLimit
from pydory.daemon.inputs.datagram import DatagramInput
from pydory.daemon.inputs.handover import DATAGRAM, STREAM, TCP, Handover
from pydory.daemon.inputs.intake_port import Intake
from pydory.daemon.inputs.marks import InputMark, mark_inputs
from pydory.daemon.inputs.stream import StreamInput

log = logging.getLogger(__name__)

__all__ = ["InputSet", "InputSwap"]

STREAM_KINDS = (Transport.UNIX_STREAM, Transport.TCP)
_HANDOVER_KIND = {Transport.UNIX_STREAM: STREAM, Transport.TCP: TCP}


class InputSwap:
    """The inputs a reload opened, and which running ones they replace (an entry of None:
    the new config turns that input off)."""

    def __init__(self) -> None:
        self.datagram_changed = False
        self.datagram: DatagramInput | None = None
        self.streams: dict[Transport, StreamInput | None] = {}

    @property
    def opened(self) -> bool:
        return self.datagram is not None or any(self.streams.values())

    async def close_opened(self) -> None:
        """The reload failed: close what it opened (reading what clients already sent)."""
        if self.datagram is not None:
            self.datagram.close()
        for stream_input in self.streams.values():
            if stream_input is not None:
                await stream_input.close()


class InputSet:
    """The server's input agents (on the event loop only)."""

    def __init__(self, intake: Intake, counters: Counters, pool: MemoryPool) -> None:
        """``pool``: the memory pool the stream connections charge partial frames to."""
        self._intake = intake
        self._counters = counters
        self._pool = pool
        #: The process's descriptor limit, as every stream listener meets it.
        self._fd_limit = FdLimit(counters)
        self.datagram: DatagramInput | None = None
        self.streams: list[StreamInput] = []
        #: Stream listeners a reload moved or removed: no longer accepting, still reading
        #: the connections open on them until their clients close them.
        self.retired_streams: list[StreamInput] = []

    # -- views -------------------------------------------------------------------------------

    def all(self) -> list[DatagramInput | StreamInput]:
        """Every input with something to read (the overload policy pauses and resumes them)."""
        datagram = [] if self.datagram is None else [self.datagram]
        return [*datagram, *self.all_streams()]

    @property
    def unix_stream(self) -> StreamInput | None:
        """The configured UNIX stream listener, if any."""
        return next((s for s in self.streams if s.kind is Transport.UNIX_STREAM), None)

    def all_streams(self) -> list[StreamInput]:
        """The stream listeners configured now and those a reload retired."""
        return [*self.streams, *self.retired_streams]

    def mark(self) -> InputMark:
        """What every input socket holds now (the commit point's mark)."""
        return mark_inputs(self.datagram, self.all_streams())

    def _inherited_paths(self) -> set[str]:
        """The socket files of the inputs on sockets systemd passed."""
        inputs: list[DatagramInput | StreamInput] = [*self.streams]
        if self.datagram is not None:
            inputs.append(self.datagram)
        return {s.path for s in inputs if s.inherited and s.path is not None}

    def tcp_port(self) -> int | None:
        """The TCP input's port (the one bound, when the config said 0)."""
        return next((s.port for s in self.streams if s.kind is Transport.TCP), None)

    # -- start-up and shutdown ----------------------------------------------------------

    async def open(
        self, config: Config, loop: asyncio.AbstractEventLoop, handover: Handover | None = None
    ) -> None:
        """Open every input ``config`` asks for, each on its socket in ``handover`` if it
        holds one (bound before: daemon/inputs/handover.py)."""
        handover = Handover() if handover is None else handover
        self.datagram = self._open_datagram(config, loop, handover)
        for kind in STREAM_KINDS:
            stream_input = self._new_stream(config, kind)
            if stream_input is not None:
                self.streams.append(stream_input)
                address = stream_input.path if kind is Transport.UNIX_STREAM else stream_input.port
                assert address is not None
                await stream_input.start(loop, handover.take(_HANDOVER_KIND[kind], address))

    def pause(self) -> None:
        """Stop reading every input (a shutdown was requested)."""
        for source in self.all():
            source.pause()

    async def close(self) -> None:
        """Shutdown: each input reads what its clients already sent, then closes."""
        if self.datagram is not None:
            self.datagram.close()
        for stream_input in self.all_streams():
            await stream_input.close()

    # -- a reload ------------------------------------------------------------------------

    async def open_changed(
        self, running: Config, new: Config, loop: asyncio.AbstractEventLoop
    ) -> InputSwap:
        """Open each input ``new`` adds or moves, beside the running ones."""
        swap = InputSwap()
        try:
            if running.inputs.unix_datagram.path != new.inputs.unix_datagram.path:
                swap.datagram_changed = True
                swap.datagram = self._open_datagram(new, loop)
            for kind in STREAM_KINDS:
                if _stream_address(running, kind) != _stream_address(new, kind):
                    stream_input = swap.streams[kind] = self._new_stream(new, kind)
                    if stream_input is not None:
                        await stream_input.start(loop)
        except BaseException:
            await swap.close_opened()
            raise
        return swap

    async def swap(
        self,
        swap: InputSwap,
        running: Config,
        new: Config,
        on_idle: Callable[[StreamInput], None],
    ) -> None:
        """Put the inputs a reload opened in place, then retire those they replace.

        A datagram socket replaced is closed: the datagrams queued are read first, and a
        client sending to the old path from then on gets an error (nothing silently
        lost). A stream listener replaced stops accepting but keeps reading its open
        connections; ``on_idle(listener)`` is called once none is left.
        """
        replaced_datagram = None
        if swap.datagram_changed:
            replaced_datagram, self.datagram = self.datagram, swap.datagram
        replaced_streams: list[StreamInput] = []
        for kind, stream_input in swap.streams.items():
            replaced_streams += [s for s in self.streams if s.kind is kind]
            self.streams = [s for s in self.streams if s.kind is not kind]
            if stream_input is not None:
                self.streams.append(stream_input)
        _apply_modes(running, new, self._inherited_paths())
        if replaced_datagram is not None:
            log.info("config reload: closing the input %s", describe(replaced_datagram))
            replaced_datagram.close()
        loop = asyncio.get_running_loop()
        for stream_input in replaced_streams:
            log.info(
                "config reload: %s no longer accepts connections; its %d open ones are "
                "served until their clients close them",
                describe(stream_input),
                stream_input.connection_count,
            )
            self.retired_streams.append(stream_input)
            await stream_input.stop_accepting(loop, functools.partial(on_idle, stream_input))
            if stream_input.idle:
                on_idle(stream_input)

    def let_go(self, stream_input: StreamInput) -> bool:
        """Forget a retired listener whose last connection closed; False if it is not
        (or no longer) a retired one. The caller closes it."""
        if stream_input not in self.retired_streams:
            return False
        self.retired_streams.remove(stream_input)
        return True

    def apply_limits(self, new: Config) -> None:
        """<inputConfig>: the datagram size from the next read, the stream size for
        connections made from now on."""
        limits = new.input_config
        if self.datagram is not None:
            self.datagram.set_max_msg_size(limits.max_datagram_msg_size)
        for stream_input in self.streams:
            stream_input.set_max_msg_size(limits.max_stream_msg_size)

    def set_quotas(self, quotas: QuotasConfig) -> None:
        """<quotas>: for the configured inputs (a retired listener keeps its own)."""
        for stream_input in self.streams:
            stream_input.set_quotas(quotas)
        if self.datagram is not None:
            self.datagram.set_quota(quotas.unix_datagram)

    # -- building -----------------------------------------------------------------------

    def _open_datagram(
        self, config: Config, loop: asyncio.AbstractEventLoop, handover: Handover | None = None
    ) -> DatagramInput | None:
        """The UNIX datagram input ``config`` asks for, listening; None if it is off."""
        source = config.inputs.unix_datagram
        if source.path is None:
            return None
        limits = config.input_config
        datagram_input = DatagramInput(
            source.path,
            source.mode,
            limits.max_datagram_msg_size,
            limits.allow_large_unix_datagrams,
            self._intake,
            quota=config.quotas.unix_datagram,
        )
        held = handover.take(DATAGRAM, source.path) if handover is not None else []
        datagram_input.start(loop, held[0] if held else None)
        return datagram_input

    def _new_stream(self, config: Config, kind: Transport) -> StreamInput | None:
        """The UNIX stream or TCP input ``config`` asks for (not started); None if off."""
        limits = config.input_config
        if kind is Transport.UNIX_STREAM:
            source = config.inputs.unix_stream
            if source.path is None:
                return None
            return StreamInput(
                kind,
                limits.max_stream_msg_size,
                self._intake,
                path=source.path,
                mode=source.mode,
                quotas=config.quotas,
                counters=self._counters,
                pool=self._pool,
                fd_limit=self._fd_limit,
            )
        if config.inputs.tcp.port is None:
            return None
        return StreamInput(
            kind,
            limits.max_stream_msg_size,
            self._intake,
            port=config.inputs.tcp.port,
            quotas=config.quotas,
            counters=self._counters,
            pool=self._pool,
            fd_limit=self._fd_limit,
        )


def describe(source: DatagramInput | StreamInput) -> str:
    """An input for the log: its transport and address."""
    if isinstance(source, DatagramInput):
        return f"unix datagram {source.path}"
    return f"{source.kind} {source.path or source.port}"


def _stream_address(config: Config, kind: Transport) -> str | int | None:
    """Where a stream input listens: its socket path, or its TCP port (0: any)."""
    sources = config.inputs
    return sources.unix_stream.path if kind is Transport.UNIX_STREAM else sources.tcp.port


def _apply_modes(running: Config, new: Config, systemds: set[str]) -> None:
    """A socket file kept by a reload takes its new mode in place (None: as the umask
    made it); one systemd made (in ``systemds``) keeps the socket unit's mode, the
    difference logged."""
    for old_source, new_source in (
        (running.inputs.unix_datagram, new.inputs.unix_datagram),
        (running.inputs.unix_stream, new.inputs.unix_stream),
    ):
        path, mode = new_source.path, new_source.mode
        if (
            path is not None
            and mode is not None
            and (path, mode)
            != (
                old_source.path,
                old_source.mode,
            )
        ):
            if path in systemds:
                log.warning(
                    "config reload: the mode of %s stays as systemd's socket unit set it "
                    "(SocketMode=), not %04o",
                    path,
                    mode,
                )
                continue
            os.chmod(path, mode)
