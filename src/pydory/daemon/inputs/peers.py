"""Who is on an input socket, as the kernel knows it: the client's uid, for the quotas.

A client is a uid on every transport, so that opening more connections (or switching
transport within a listener) does not buy a program more than its quota:

- **UNIX stream**: the peer's credentials, ``SO_PEERCRED``, fixed at connect.
- **UNIX datagram**: each datagram's ``SCM_CREDENTIALS`` (the socket sets
  ``SO_PASSCRED`` always, and every reader asks for them: ``recvmmsg`` compiled,
  ``recvmsg_into`` on the pure path). The kernel fills them in; an unprivileged sender
  cannot forge them. A datagram queued before ``SO_PASSCRED`` was set reads as the
  kernel's overflow uid (65534) with pid 0.
- **Loopback TCP**: the uid owning the client's socket. The client's socket is the one
  whose local address is our peer's and whose remote address is ours; the kernel's
  ``sock_diag`` netlink interface (``INET_DIAG``, one exact lookup, no privilege needed)
  says who owns it, and ``/proc/net/tcp`` (and ``tcp6``) where netlink is not offered
  (some sandboxes). Both are read on the loop: one netlink round trip is a few
  microseconds; ``/proc/net/tcp`` is read whole, so it costs in proportion to the
  host's TCP sockets, once per connection.

The uid is what the kernel reports, root and the daemon's own uid included: every program
running as one user is one client. The parsers raise :class:`PeerLookupError` on anything
they cannot read (a property test holds them to it); the callers then treat the
connection as a client of its own, as before uids were looked up.

Rule: a client's identity comes from the kernel alone (credentials, socket ownership),
read only here; a kernel reply or a ``/proc/net/tcp`` line it cannot read is a
:class:`PeerLookupError`, nothing else.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from collections.abc import Iterator
from typing import NamedTuple

from pydory.errors import PydoryError

__all__ = [
    "PeerLookupError",
    "TcpSocketEntry",
    "credentials_uid",
    "diag_reply_uid",
    "diag_request",
    "loopback_tcp_owner",
    "parse_proc_net_tcp",
    "peer_uid",
    "uid_client",
]

#: struct ucred (SO_PEERCRED, SCM_CREDENTIALS): pid, uid, gid.
UCRED = struct.Struct("=iII")
#: The ancillary buffer one SCM_CREDENTIALS message needs.
CREDENTIALS_SPACE = socket.CMSG_SPACE(UCRED.size)

# sock_diag (linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h).
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
#: inet_diag_req_v2 without its id: family, protocol, ext, pad, states.
_DIAG_REQ = struct.Struct("=BBBxI")
#: inet_diag_sockid: sport, dport (big-endian), src[16], dst[16], interface, cookie[2].
_SOCKID = struct.Struct("!HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
_NO_COOKIE = 0xFFFFFFFF
#: inet_diag_msg: family, state, timer, retrans, id (48 bytes), expires, rqueue, wqueue,
#: uid, inode.
_DIAG_MSG_HEAD = struct.Struct("=BBBB")
_DIAG_MSG_TAIL = struct.Struct("=IIIII")
_DIAG_MSG_SIZE = _DIAG_MSG_HEAD.size + _SOCKID.size + _SOCKID_TAIL.size + _DIAG_MSG_TAIL.size
_ALL_STATES = 0xFFFFFFFF
_DIAG_TIMEOUT_S = 1.0

PROC_NET_TCP = {socket.AF_INET: "/proc/net/tcp", socket.AF_INET6: "/proc/net/tcp6"}

Address = tuple[str, int]


class PeerLookupError(PydoryError):
    """What the kernel said about a peer could not be read (or it said nothing)."""


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a UNIX stream socket (SO_PEERCRED);
    None if the kernel does not say."""
    try:
        cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
    except OSError:
        return None
    uid: int = UCRED.unpack(cred)[1]
    return uid


def uid_client(uid: int) -> tuple[str, int]:
    """The key naming a uid's client, on every transport: of its rate quota on a listener
    and of its share of the memory pool (pydory.daemon.books.shares), so that a uid's
    stream and datagram messages are charged to one share."""
    return ("uid", uid)


def credentials_uid(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The sender's uid in a datagram's ancillary data (SCM_CREDENTIALS); None without."""
    for level, kind, data in ancdata:
        if (
            level == socket.SOL_SOCKET
            and kind == socket.SCM_CREDENTIALS
            and len(data) >= UCRED.size
        ):
            uid: int = UCRED.unpack_from(data)[1]
            return uid
    return None


# -- loopback TCP: the owner of the client's socket ------------------------------------------


def loopback_tcp_owner(sock: socket.socket) -> int | None:
    """The uid owning the other end of an accepted loopback TCP connection ``sock``;
    None if neither sock_diag nor /proc/net/tcp names it (the client has gone, or the
    kernel offers neither)."""
    try:
        ours: Address = sock.getsockname()[:2]
        theirs: Address = sock.getpeername()[:2]
    except OSError:
        return None
    try:
        return _diag_owner(sock.family, theirs, ours)
    except (OSError, PeerLookupError):
        # No sock_diag here, or it does not know the socket (ENOENT also means that
        # inet_diag is not loaded): /proc/net/tcp tells both apart.
        pass
    try:
        with open(PROC_NET_TCP[sock.family]) as table:
            text = table.read()
        for entry in parse_proc_net_tcp(text):
            if entry.local == theirs and entry.remote == ours:
                return entry.uid
    except (OSError, KeyError, PeerLookupError):
        return None
    return None


def _diag_owner(family: int, local: Address, remote: Address) -> int:
    """One sock_diag lookup of the TCP socket bound to ``local`` and connected to
    ``remote``: its owner's uid. OSError: no sock_diag; PeerLookupError: no such socket."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as netlink:
        netlink.settimeout(_DIAG_TIMEOUT_S)
        netlink.send(diag_request(family, local, remote))
        return diag_reply_uid(netlink.recv(8192))


def diag_request(family: int, local: Address, remote: Address, seq: int = 1) -> bytes:
    """The netlink message asking sock_diag for the one TCP socket ``local`` -> ``remote``
    (an exact lookup: no dump flag)."""
    sockid = _SOCKID.pack(
        local[1], remote[1], _packed_address(family, local[0]), _packed_address(family, remote[0])
    ) + _SOCKID_TAIL.pack(0, _NO_COOKIE, _NO_COOKIE)
    body = _DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, _ALL_STATES) + sockid
    header = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, seq, 0)
    return header + body


def _packed_address(family: int, host: str) -> bytes:
    """An address as inet_diag_sockid holds it: 16 bytes, an IPv4 one in the first 4."""
    return socket.inet_pton(family, host).ljust(16, b"\0")


def diag_reply_uid(reply: bytes) -> int:
    """The owner's uid in sock_diag's answer to :func:`diag_request`; PeerLookupError if
    the answer is an error (ENOENT: no such socket) or cannot be read."""
    if len(reply) < _NLMSGHDR.size:
        raise PeerLookupError(f"a sock_diag reply of {len(reply)} bytes")
    length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(reply)
    if length < _NLMSGHDR.size or length > len(reply):
        raise PeerLookupError(f"a sock_diag reply claiming {length} bytes in {len(reply)}")
    if kind == NLMSG_ERROR:
        code = struct.unpack_from("=i", reply, _NLMSGHDR.size)[0] if length >= 20 else 0
        name = errno.errorcode.get(-code, str(-code))
        raise PeerLookupError(f"sock_diag answered error {name}")
    if kind != SOCK_DIAG_BY_FAMILY or length < _NLMSGHDR.size + _DIAG_MSG_SIZE:
        raise PeerLookupError(f"a sock_diag reply of type {kind} and {length} bytes")
    offset = _NLMSGHDR.size + _DIAG_MSG_HEAD.size + _SOCKID.size + _SOCKID_TAIL.size
    uid: int = _DIAG_MSG_TAIL.unpack_from(reply, offset)[3]
    return uid


# -- /proc/net/tcp and /proc/net/tcp6 ----------------------------------------------------------


class TcpSocketEntry(NamedTuple):
    """One line of /proc/net/tcp: a socket's local and remote address and its owner."""

    local: Address
    remote: Address
    uid: int


def parse_proc_net_tcp(text: str) -> Iterator[TcpSocketEntry]:
    """The sockets in /proc/net/tcp or /proc/net/tcp6 (after its header line);
    PeerLookupError on a line that is not one of the kernel's."""
    lines = text.splitlines()
    if not lines:
        return
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 8:
            raise PeerLookupError(f"line {number}: {len(fields)} fields, expected at least 8")
        try:
            local = _proc_address(fields[1])
            remote = _proc_address(fields[2])
            uid = int(fields[7], 10)
        except ValueError as error:
            raise PeerLookupError(f"line {number}: {error}") from None
        if uid < 0 or uid > 0xFFFFFFFF:
            raise PeerLookupError(f"line {number}: uid {uid} out of range")
        yield TcpSocketEntry(local, remote, uid)


def _proc_address(field: str) -> Address:
    """``0100007F:1F90`` -> ("127.0.0.1", 8080): the kernel prints each 32-bit word of
    the (network order) address as a native integer in hex, the port as a number."""
    host, sep, port = field.partition(":")
    if not sep or len(port) != 4 or len(host) not in (8, 32) or not _is_hex(host + port):
        raise ValueError(f"not an address: {field[:60]!r}")
    words = [int(host[i : i + 8], 16) for i in range(0, len(host), 8)]
    packed = b"".join(struct.pack("=I", word) for word in words)
    address = ipaddress.ip_address(packed)
    return str(address), int(port, 16)


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)
