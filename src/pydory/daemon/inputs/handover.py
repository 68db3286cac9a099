"""Input sockets the inputs did not open themselves: bound early by ``pydory serve``, or
passed by systemd (socket activation).

Why: from a daemon's exec until its inputs are open, a client finds no socket ("No such
file or directory", or a refused connection) and its message is gone. On a host whose
CPUs are busy, importing the daemon (uvloop, aiohttp, confluent_kafka, prometheus_client,
the config loader) took seconds. So ``pydory serve`` (and ``dory``) binds the configured
sockets first, before its command line is even parsed, with the standard library alone
(:func:`open_first`, the addresses read by ``daemon/inputs/addresses.py``; the command
takes them with :func:`open_early`), and the kernel queues what clients send until the
daemon reads it. Under systemd a ``.socket`` unit holds the sockets across restarts
(docs/systemd/pydory.socket) and passes them as sd_listen_fds(3) does: ``LISTEN_PID``
(this process), ``LISTEN_FDS`` (how many, from fd 3), ``LISTEN_FDNAMES`` (their names,
colon-separated), the variables unset once read.

Each socket is known by its kind and address as the kernel reports them, never by its
position or name: the inputs take theirs with :meth:`Handover.take`. A socket systemd
passed that no input of the config takes refuses the start (:meth:`Handover.check`,
naming the element), since a client sending to it would wait forever. One bound early
that no input takes is closed and its file removed (:meth:`Handover.close_rest`).

A socket systemd passed is systemd's too: the daemon never removes its file nor shuts it
for reading, and at shutdown leaves the connections waiting in its backlog (and what its
queue holds beyond the final read) to the next daemon.

Rule: an input uses a socket it did not bind itself only through :class:`Handover`,
matched by kind and address (``Handover.take``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat

from pydory.daemon.inputs.addresses import InputAddresses, UnixAddress, read_input_addresses
from pydory.daemon.inputs.sockets import (
    TCP_PORT_ELEMENT,
    bind_unix_datagram,
    listen_tcp,
    listen_unix_stream,
    prepare_socket_path,
    remove_socket_file,
)
from pydory.errors import ConfigError

# No typing, dataclasses or logging imported here: this runs before the sockets are bound
# (see the docstring), where each of those costs as much start-up time as all the rest.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, MutableMapping

    from pydory.config.model import InputSourcesConfig

__all__ = [
    "DATAGRAM",
    "STREAM",
    "TCP",
    "Handover",
    "HeldSocket",
    "close_first",
    "inherit_from_systemd",
    "open_early",
    "open_first",
    "set_socket_mode",
]

#: The kinds of input socket, as :meth:`Handover.take` names them.
DATAGRAM, STREAM, TCP = "unix datagram", "unix stream", "tcp"
#: sd_listen_fds(3): the first descriptor passed.
SD_LISTEN_FDS_START = 3
#: The loopback addresses the TCP input listens on (never a wildcard).
LOOPBACK_HOSTS = ("127.0.0.1", "::1")
INPUTS_ELEMENT = "/doryConfig/inputSources"
_ELEMENT = {
    DATAGRAM: "/doryConfig/inputSources/unixDatagram/path",
    STREAM: "/doryConfig/inputSources/unixStream/path",
    TCP: TCP_PORT_ELEMENT,
}
_UNIT_KEY = {DATAGRAM: "ListenDatagram=", STREAM: "ListenStream=", TCP: "ListenStream="}


class HeldSocket:
    """A socket bound before its input opened."""

    __slots__ = ("address", "inherited", "kind", "origin", "sock")

    def __init__(
        self,
        sock: socket.socket,
        kind: str,
        address: str | tuple[str, int],
        inherited: bool,
        origin: str,
    ) -> None:
        self.sock = sock
        self.kind = kind
        #: A UNIX socket's path, or a TCP socket's (host, port).
        self.address = address
        #: systemd holds it too: never removed, shut or drained by the daemon.
        self.inherited = inherited
        #: Where it came from, for messages ("systemd's fd 3 'stream'", "bound at start").
        self.origin = origin

    def describe(self) -> str:
        if isinstance(self.address, tuple):
            host, port = self.address
            return f"TCP socket on {host} port {port} ({self.origin})"
        return f"{self.kind} socket {self.address} ({self.origin})"


class Handover:
    """The sockets bound before the inputs opened, until each input takes its own."""

    def __init__(self, held: Iterable[HeldSocket] = ()) -> None:
        self._held = list(held)

    @property
    def held(self) -> list[HeldSocket]:
        """The sockets no input has taken yet."""
        return list(self._held)

    def take(self, kind: str, address: str | int) -> list[HeldSocket]:
        """The sockets of ``kind`` at ``address`` (a path; for TCP a port, 0 matching any
        loopback port), no longer held here: the input that takes them owns them."""
        taken = [each for each in self._held if _matches(each, kind, address)]
        self._held = [each for each in self._held if each not in taken]
        return taken

    def check(self, inputs: InputSourcesConfig) -> None:
        """Refuse (ConfigError, naming the element) a socket systemd passed that no input
        of ``inputs`` would take."""
        configured: dict[str, str | int | None] = {
            DATAGRAM: inputs.unix_datagram.path,
            STREAM: inputs.unix_stream.path,
            TCP: inputs.tcp.port,
        }
        for each in self._held:
            address = configured[each.kind]
            if each.inherited and (address is None or not _matches(each, each.kind, address)):
                raise ConfigError(_mismatch(each, address), path=_ELEMENT[each.kind])

    def bind_missing(self, addresses: InputAddresses) -> None:
        """Bind each of ``addresses`` no socket here serves yet; one that cannot be bound
        now is left out (the input binds it as it opens, and says why if it cannot)."""
        unix: list[tuple[str, UnixAddress | None, int]] = [
            (DATAGRAM, addresses.unix_datagram, socket.SOCK_DGRAM),
            (STREAM, addresses.unix_stream, socket.SOCK_STREAM),
        ]
        for kind, address, sock_type in unix:
            if address is not None and not self._serves(kind, address.path):
                with contextlib.suppress(OSError, ConfigError):
                    self._held.append(_bind_unix(kind, address, sock_type))
        port = addresses.tcp_port
        if port is not None and not self._serves(TCP, port):
            with contextlib.suppress(OSError):
                self._held += _bind_tcp(port)

    def _serves(self, kind: str, address: str | int) -> bool:
        return any(_matches(each, kind, address) for each in self._held)

    def close_rest(self, *, keep_inherited: bool = False) -> None:
        """Close what no input took; remove the files of those bound here (a socket
        systemd passed keeps its file: systemd's). ``keep_inherited``: systemd's stay."""
        rest = [each for each in self._held if not (keep_inherited and each.inherited)]
        self._held = [each for each in self._held if each not in rest]
        for each in rest:
            each.sock.close()
            if not each.inherited and isinstance(each.address, str):
                remove_socket_file(each.address)

    def forget(self) -> None:
        """Close every socket held, leaving the files (``--daemon``'s parent: the child
        serves them)."""
        rest, self._held = self._held, []
        for each in rest:
            each.sock.close()


def open_early(config_path: str, environ: MutableMapping[str, str] | None = None) -> Handover:
    """What ``pydory serve`` does before it imports the daemon: take the sockets systemd
    passed, then bind the config's other inputs. Raises ConfigError when systemd passed a
    descriptor that cannot be an input. The handover the CLI opened as its first step
    (:func:`open_first`) is returned if there is one."""
    global _first
    first, _first = _first, None
    if first is not None:
        opened_for, handover, error = first
        if error is not None:
            raise error
        assert handover is not None
        if opened_for != config_path:  # the CLI read its arguments otherwise: bind again
            handover.close_rest(keep_inherited=True)
            handover.bind_missing(read_input_addresses(config_path))
        return handover
    handover = Handover(inherit_from_systemd(os.environ if environ is None else environ))
    handover.bind_missing(read_input_addresses(config_path))
    return handover


#: What :func:`open_first` opened, for :func:`open_early` to take: the config path it read,
#: and the handover or the error that refused systemd's sockets.
_first: tuple[str, Handover | None, ConfigError | None] | None = None


def open_first(argv: list[str]) -> None:
    """The very first step of ``pydory serve`` and ``dory``, before their command lines
    are parsed (argparse alone costs as much as the binding): when ``argv`` names a
    config file (``--config-path P``, ``--config-path=P``, or a prefix of it, as argparse
    takes them; the last one wins), open the handover for it and keep it for the command,
    which takes it through :func:`open_early`."""
    global _first
    config_path = _config_path_in(argv)
    if config_path is None:
        return
    try:
        _first = (config_path, open_early(config_path), None)
    except ConfigError as error:
        _first = (config_path, None, error)


def close_first() -> None:
    """Close what :func:`open_first` opened if the command never took it (its command
    line was refused, or it ended before): the files of the sockets bound go too."""
    global _first
    first, _first = _first, None
    if first is not None and first[1] is not None:
        first[1].close_rest()


def _config_path_in(argv: list[str]) -> str | None:
    found = None
    words = iter(argv)
    for word in words:
        if word == "--":
            break
        option, equals, value = word.partition("=")
        if len(option) < 3 or not "--config-path".startswith(option):
            continue
        found = value if equals else next(words, None)
    return found


def inherit_from_systemd(environ: MutableMapping[str, str]) -> list[HeldSocket]:
    """The sockets systemd passed this process (sd_listen_fds(3) with unset_environment:
    none when ``LISTEN_PID`` names another process), close-on-exec from now on."""
    pid = environ.pop("LISTEN_PID", None)
    count = environ.pop("LISTEN_FDS", None)
    names = environ.pop("LISTEN_FDNAMES", None)
    if pid is None or count is None:
        return []
    try:
        for_pid, fds = int(pid), int(count)
    except ValueError:
        raise ConfigError(
            f"LISTEN_PID={pid!r}, LISTEN_FDS={count!r}: not numbers (socket activation's "
            "variables, set by systemd)",
            path=INPUTS_ELEMENT,
        ) from None
    if for_pid != os.getpid():
        return []
    fd_names = names.split(":") if names else []
    held: list[HeldSocket] = []
    try:
        for index in range(fds):
            name = fd_names[index] if index < len(fd_names) else ""
            held.append(_adopt(SD_LISTEN_FDS_START + index, name))
    except BaseException:
        for each in held:
            each.sock.close()
        raise
    return held


def _adopt(fd: int, name: str) -> HeldSocket:
    origin = f"systemd's fd {fd}" + (f" {name!r}" if name else "")
    try:
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
    except OSError as error:
        raise ConfigError(
            f"{origin} cannot be an input: {error.strerror or error}", path=INPUTS_ELEMENT
        ) from None
    try:
        kind, address = _kind_and_address(sock, origin)
    except BaseException:
        sock.detach()  # the descriptor stays systemd's to close
        raise
    return HeldSocket(sock, kind, address, inherited=True, origin=origin)


def _kind_and_address(sock: socket.socket, origin: str) -> tuple[str, str | tuple[str, int]]:
    listening = sock.type != socket.SOCK_STREAM or bool(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    )
    if not listening:
        raise ConfigError(
            f"{origin} is a connection, not a listening socket (the socket unit needs "
            "Accept=no, its default)",
            path=INPUTS_ELEMENT,
        )
    name = sock.getsockname()
    if sock.family == socket.AF_UNIX and sock.type in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        if not isinstance(name, str) or not name.startswith("/"):
            raise ConfigError(
                f"{origin} is a UNIX socket without a file ({name!r}): pydory's UNIX inputs "
                "are files the config names",
                path=INPUTS_ELEMENT,
            )
        return (DATAGRAM if sock.type == socket.SOCK_DGRAM else STREAM), name
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
        return TCP, (name[0], name[1])
    raise ConfigError(
        f"{origin} is neither a UNIX datagram, a UNIX stream nor a TCP socket "
        f"(family {sock.family!r}, type {sock.type!r})",
        path=INPUTS_ELEMENT,
    )


def _matches(held: HeldSocket, kind: str, address: str | int) -> bool:
    if held.kind != kind:
        return False
    if isinstance(held.address, tuple):
        host, port = held.address
        return host in LOOPBACK_HOSTS and address in (0, port)
    return held.address == address


def _mismatch(held: HeldSocket, configured: str | int | None) -> str:
    """Why ``held`` is not the config's input, and what to change."""
    if configured is None:
        wanted = "the config has no such input"
    elif isinstance(held.address, tuple) and held.address[0] not in LOOPBACK_HOSTS:
        wanted = "pydory listens on loopback only (127.0.0.1, ::1)"
    else:
        wanted = f"the config's is {configured}"
    return (
        f"the {held.describe()} is not an input of this config: {wanted}; make the socket "
        f"unit's {_UNIT_KEY[held.kind]} and the config name the same address"
    )


def _bind_unix(kind: str, address: UnixAddress, sock_type: int) -> HeldSocket:
    prepare_socket_path(address.path, sock_type)
    if sock_type == socket.SOCK_DGRAM:
        sock = bind_unix_datagram(address.path)
    else:
        sock = listen_unix_stream(address.path)
    try:
        if address.mode is not None:
            os.chmod(address.path, address.mode)
    except BaseException:
        sock.close()
        remove_socket_file(address.path)
        raise
    return _bound_at_start(sock, kind, address.path)


def _bind_tcp(port: int) -> list[HeldSocket]:
    """127.0.0.1 and, where the host has IPv6, ::1 on the same port (as the input does)."""
    v4 = listen_tcp(LOOPBACK_HOSTS[0], port)
    bound: int = v4.getsockname()[1]
    held = [_bound_at_start(v4, TCP, (LOOPBACK_HOSTS[0], bound))]
    try:
        v6 = listen_tcp(LOOPBACK_HOSTS[1], bound)
    except OSError as error:
        if error.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            v4.close()
            raise
    else:
        held.append(_bound_at_start(v6, TCP, (LOOPBACK_HOSTS[1], bound)))
    return held


def _bound_at_start(sock: socket.socket, kind: str, address: str | tuple[str, int]) -> HeldSocket:
    return HeldSocket(sock, kind, address, inherited=False, origin="bound at start")


def set_socket_mode(path: str, mode: int, held: HeldSocket | None) -> None:
    """Give the socket file at ``path`` the config's ``mode``; one systemd passed keeps
    its socket unit's ``SocketMode=`` (its file may not be the daemon's to change): a
    difference is logged."""
    if held is None or not held.inherited:
        os.chmod(path, mode)
        return
    import logging  # only here: see the imports above

    log = logging.getLogger(__name__)
    try:
        actual = stat.S_IMODE(os.stat(path).st_mode)
    except OSError as error:
        log.warning("%s: cannot read its mode: %s", held.describe(), error)
        return
    if actual != mode:
        log.warning(
            "%s has mode %04o, the config says %04o: the socket unit's SocketMode= decides "
            "(make them the same)",
            held.describe(),
            actual,
            mode,
        )
