"""The input addresses a config file names, read with the standard library alone.

``pydory serve`` binds the input sockets before it imports the config loader and the
daemon (``daemon/inputs/handover.py`` says why); this is what tells it where. It reads
``<inputSources>`` only: each UNIX socket's path and mode, the TCP port. It is a hint,
never a decision: whatever it cannot read (a value it does not understand, a file with a
DTD, one too large, or no file) is left out, and the daemon binds that input itself once
the loader has read the file (and reports what is wrong with it); an address read here
that the loader does not accept is bound for nothing, and the handover closes it (the
inputs take their sockets by kind and address, as the loader read them).

The file is parsed with expat directly, every DTD refused (so no entity is ever
expanded), within the loader's size limit.

Rule: nothing here refuses a config: :func:`read_input_addresses` returns what it could
read, or nothing.
"""

from __future__ import annotations

from xml.parsers import expat

__all__ = ["InputAddresses", "UnixAddress", "read_input_addresses"]

#: The loader's limit on a config file (``pydory.config.xmltree.MAX_CONFIG_BYTES``; a test
#: holds them equal: that module cannot be imported here without the whole loader).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: A socket file's mode when the config gives none (``config.model.DEFAULT_SOCKET_MODE``).
DEFAULT_SOCKET_MODE = 0o222
#: Bits a mode may have (``config.values.MAX_MODE``).
MAX_MODE = 0o777

# Plain classes, not dataclasses, and no ``re``: this runs before the sockets are bound,
# where every module imported costs start-up time on a saturated host (dataclasses, re
# and typing each cost as much as everything else here).


class UnixAddress:
    """A UNIX socket's path and the mode its file takes (None: as the umask makes it)."""

    __slots__ = ("mode", "path")

    def __init__(self, path: str, mode: int | None) -> None:
        self.path = path
        self.mode = mode

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnixAddress) and (self.path, self.mode) == (
            other.path,
            other.mode,
        )

    def __hash__(self) -> int:
        return hash((self.path, self.mode))

    def __repr__(self) -> str:
        return f"UnixAddress({self.path!r}, {self.mode!r})"


class InputAddresses:
    """What :func:`read_input_addresses` could read: None for an input that is off or
    that it could not read."""

    __slots__ = ("tcp_port", "unix_datagram", "unix_stream")

    def __init__(
        self,
        unix_datagram: UnixAddress | None = None,
        unix_stream: UnixAddress | None = None,
        tcp_port: int | None = None,
    ) -> None:
        self.unix_datagram = unix_datagram
        self.unix_stream = unix_stream
        self.tcp_port = tcp_port

    def _key(self) -> tuple[UnixAddress | None, UnixAddress | None, int | None]:
        return (self.unix_datagram, self.unix_stream, self.tcp_port)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InputAddresses) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "InputAddresses(%r, %r, %r)" % self._key()  # noqa: UP031


class _Unreadable(Exception):
    """The file holds something this reader leaves to the loader."""


def read_input_addresses(config_path: str) -> InputAddresses:
    """The input addresses ``config_path`` names, as far as they can be read simply."""
    try:
        with open(config_path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError:
        return InputAddresses()
    if len(data) > MAX_CONFIG_BYTES:
        return InputAddresses()
    reader = _InputSourcesReader()
    parser = expat.ParserCreate()
    parser.StartDoctypeDeclHandler = _refuse_dtd
    parser.EntityDeclHandler = _refuse_dtd
    parser.StartElementHandler = reader.start
    parser.EndElementHandler = reader.end
    try:
        parser.Parse(data, True)
    except (expat.ExpatError, _Unreadable, ValueError):
        return InputAddresses()
    return reader.addresses()


def _refuse_dtd(*_: object) -> None:
    raise _Unreadable("a DTD")


class _InputSourcesReader:
    """Collects ``/doryConfig/inputSources/<input>[@enable]`` and its children's values."""

    def __init__(self) -> None:
        self._stack: list[str] = []
        #: input element -> its attributes, and its children's ``value`` attributes.
        self._inputs: dict[str, dict[str, str]] = {}
        self._children: dict[str, dict[str, str]] = {}
        self._seen: set[str] = set()

    def start(self, name: str, attributes: dict[str, str]) -> None:
        self._stack.append(name)
        path = tuple(self._stack)
        if path[:2] != ("doryConfig", "inputSources"):
            return
        if len(path) == 3:
            self._once(name)
            self._inputs[name] = dict(attributes)
            self._children[name] = {}
        elif len(path) == 4:
            self._once(f"{path[2]}/{name}")
            self._children[path[2]][name] = attributes.get("value", "")

    def _once(self, key: str) -> None:
        if key in self._seen:  # the loader refuses a repeated element: leave it all to it
            raise _Unreadable(key)
        self._seen.add(key)

    def end(self, _: str) -> None:
        self._stack.pop()

    def addresses(self) -> InputAddresses:
        return InputAddresses(
            unix_datagram=self._unix("unixDatagram"),
            unix_stream=self._unix("unixStream"),
            tcp_port=self._tcp(),
        )

    def _enabled(self, name: str) -> bool:
        return self._inputs.get(name, {}).get("enable", "").strip().lower() == "true"

    def _unix(self, name: str) -> UnixAddress | None:
        if not self._enabled(name):
            return None
        children = self._children[name]
        path = children.get("path", "").strip()
        if not path.startswith("/"):
            return None
        mode = _mode(children.get("mode"))
        return None if mode is False else UnixAddress(path, mode)

    def _tcp(self) -> int | None:
        if not self._enabled("tcp"):
            return None
        port = self._children["tcp"].get("port", "").strip()
        if not (0 < len(port) <= 5 and _digits(port, "0123456789")) or int(port) > 65535:
            return None
        return int(port)


def _mode(text: str | None) -> int | bool | None:
    """A <mode> value as the loader reads it; False if this reader cannot."""
    if text is None:
        return DEFAULT_SOCKET_MODE
    value = text.strip()
    if value.lower() == "unspecified":
        return None
    if value.startswith("0") and len(value) <= 4 and _digits(value, "01234567"):
        mode = int(value, 8)
    elif value[:2] in ("0b", "0B") and 2 < len(value) <= 11 and _digits(value[2:], "01"):
        mode = int(value[2:], 2)
    else:
        return False
    return mode if mode <= MAX_MODE else False


def _digits(text: str, allowed: str) -> bool:
    """Whether every character of ``text`` is one of ``allowed`` (ASCII digits only:
    ``str.isdigit`` takes other scripts' digits too)."""
    return all(c in allowed for c in text)
