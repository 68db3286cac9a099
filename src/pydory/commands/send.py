"""`pydory send`: send one message (or N copies, or one per input line) to the daemon, like
Dory's `to_dory` (and, with ``--lines``, like kafka-console-producer).

Where the daemon is: a transport option (``--socket-path``, ``--stream-socket-path``,
``--port``), else the daemon's config file (``--config-path``: its datagram socket, else
its stream socket, else its TCP port), else ``$PYDORY_SOCKET_PATH`` (a datagram socket).
This module imports nothing of the daemon: `pydory send` must start fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from itertools import repeat
from typing import TypeAlias

from pydory import wire
from pydory.client.messages import encode_message
from pydory.client.senders import DatagramSender, TcpSender, UnixStreamSender, check_unix_path
from pydory.commands import Subparsers, add_command
from pydory.commands.arguments import integer, positive_int
from pydory.commands.lines import LongLine, line_batches, read_fd
from pydory.errors import BadTopic, ClientError, ConfigError, MessageTooLarge

#: The environment variable naming the daemon's UNIX datagram socket, used when no
#: transport option and no --config-path is given.
SOCKET_ENV = "PYDORY_SOCKET_PATH"

# --count on a stream writes copies in batches of about this many bytes: one large write
# is far faster than many small ones, and the batch is built in memory.
_BATCH_BYTES = 1 << 20

#: --lines: the longest line sent by default (Kafka's own default message.max.bytes is
#: about this); a longer line is skipped and named on stderr.
DEFAULT_MAX_LINE_BYTES = 1 << 20

# What the wire format carries in PartitionKey: Dory's C client takes an int32_t,
# the daemon reads the same 32 bits unsigned (pydory.wire.encode_partition_key).
_PARTITION_KEY_MIN = -(2**31)
_PARTITION_KEY_MAX = 2**32 - 1

Sender: TypeAlias = DatagramSender | UnixStreamSender | TcpSender


class NoTransport(ClientError):
    """The daemon's config file, or $PYDORY_SOCKET_PATH, names no input a client can use."""


def register(subparsers: Subparsers) -> None:
    """Add the `send` subcommand."""
    parser = add_command(
        subparsers,
        "send",
        "Send messages to a running pydory daemon. The value comes from --value, from "
        "standard input with --stdin (all of it, as one value, byte for byte), or one "
        "message per line of standard input with --lines; with none, it is empty. "
        "Where the daemon is: one transport option, or --config-path (the daemon's "
        f"config: its datagram socket, else its stream socket, else its TCP port), or "
        f"${SOCKET_ENV} (its datagram socket).",
        run,
    )
    parser.set_defaults(parser=parser)  # run() reports usage errors through it
    transport = parser.add_mutually_exclusive_group()
    transport.add_argument(
        "--socket-path", type=_unix_path, metavar="PATH", help="the daemon's UNIX datagram socket"
    )
    transport.add_argument(
        "--stream-socket-path",
        type=_unix_path,
        metavar="PATH",
        help="the daemon's UNIX stream socket",
    )
    transport.add_argument("--port", type=_port, help="the daemon's TCP port (on 127.0.0.1)")
    transport.add_argument(
        "--config-path",
        metavar="FILE",
        help="the daemon's config file: send to the input it enables (datagram socket, else "
        "stream socket, else TCP port)",
    )
    parser.add_argument("--topic", required=True, type=_topic, help="the Kafka topic")
    parser.add_argument("--key", default="", help="the message key (UTF-8); default empty")
    value = parser.add_mutually_exclusive_group()
    value.add_argument("--value", default="", help="the message value (UTF-8)")
    value.add_argument(
        "--stdin", action="store_true", help="read the value from standard input, until EOF"
    )
    value.add_argument(
        "--lines",
        action="store_true",
        help="send each line of standard input as one message, without its line ending "
        "(an empty line is an empty message), as kafka-console-producer does",
    )
    parser.add_argument(
        "--max-line-bytes",
        type=positive_int,
        default=DEFAULT_MAX_LINE_BYTES,
        metavar="N",
        help="--lines: a longer line is not sent; its number goes to stderr, the other "
        f"lines are sent, and the exit status is 1 (default {DEFAULT_MAX_LINE_BYTES})",
    )
    parser.add_argument(
        "--partition-key",
        type=_partition_key,
        metavar="N",
        help="send a PartitionKey message, for the partition at index N modulo the "
        "topic's partition count; without it, AnyPartition (the daemon chooses)",
    )
    parser.add_argument(
        "--count",
        type=positive_int,
        default=1,
        metavar="N",
        help="send the message N times (on a stream: one connection, batched writes); "
        "not with --lines",
    )


def run(args: argparse.Namespace) -> int:
    """Send; exit status 0, 1 with a one-line error if the daemon cannot take it (or, with
    --lines, if a line was not sent), 2 for a usage error."""
    if args.lines and args.count != 1:
        args.parser.error("--count does not apply to --lines")
    if not _names_a_transport(args):
        args.parser.error(
            "where is the daemon? give --socket-path, --stream-socket-path, --port or "
            f"--config-path, or set {SOCKET_ENV} to its datagram socket"
        )
    try:
        with _open_sender(args) as sender:
            if args.lines:
                return _send_lines(sender, args)
            value = sys.stdin.buffer.read() if args.stdin else args.value.encode("utf-8")
            _send_copies(sender, _encode(args, value), args.count)
    except ClientError as error:
        print(f"pydory send: error: {error}", file=sys.stderr)
        return 1
    return 0


def _encode(args: argparse.Namespace, value: bytes) -> bytes:
    return encode_message(
        args.topic, value, args.key.encode("utf-8"), partition_key=args.partition_key
    )


def _open_sender(args: argparse.Namespace) -> Sender:
    if args.socket_path is not None:
        return DatagramSender(args.socket_path)
    if args.stream_socket_path is not None:
        return UnixStreamSender(args.stream_socket_path)
    if args.port is not None:
        return TcpSender(args.port)
    if args.config_path is not None:
        return _sender_from_config(args.config_path)
    path = os.environ[SOCKET_ENV]
    try:
        check_unix_path(path)
    except ValueError as error:
        raise NoTransport(f"${SOCKET_ENV}: {error}") from None
    return DatagramSender(path)


def _names_a_transport(args: argparse.Namespace) -> bool:
    options = (args.socket_path, args.stream_socket_path, args.port, args.config_path)
    return any(option is not None for option in options) or bool(os.environ.get(SOCKET_ENV))


def _sender_from_config(config_path: str) -> Sender:
    from pydory.commands.daemon_url import config_failure
    from pydory.config import load_config  # the XML parser: only when a file is named

    try:
        inputs = load_config(config_path).inputs
    except (ConfigError, OSError) as error:
        raise NoTransport(config_failure(error, config_path)) from None
    if inputs.unix_datagram.path is not None:
        return DatagramSender(inputs.unix_datagram.path)
    if inputs.unix_stream.path is not None:
        return UnixStreamSender(inputs.unix_stream.path)
    if inputs.tcp.port:  # 0 is a port the daemon's kernel chooses: not knowable here
        return TcpSender(inputs.tcp.port)
    raise NoTransport(
        f"the config file {config_path} enables no input a client can find "
        "(inputSources: unixDatagram, unixStream, or tcp with a fixed port)"
    )


def _send_copies(sender: Sender, message: bytes, count: int) -> None:
    if isinstance(sender, DatagramSender):
        sender.send_many(repeat(message, count))
        return
    per_batch = max(1, _BATCH_BYTES // len(message))
    remaining = count
    while remaining > 0:
        batch = min(per_batch, remaining)
        sender.send_many(repeat(message, batch))
        remaining -= batch


def _send_lines(sender: Sender, args: argparse.Namespace) -> int:
    """Each line of stdin one message; a line that cannot be sent is named on stderr and
    skipped; the daemon going away stops it all (ClientError)."""
    skipped = 0
    for batch in line_batches(read_fd(sys.stdin.fileno()), args.max_line_bytes):
        numbered: list[tuple[int, bytes]] = []
        for line in batch:
            if isinstance(line, LongLine):
                _line_not_sent(line.number, f"{line.length} bytes, over --max-line-bytes")
                skipped += 1
            else:
                numbered.append((line.number, _encode(args, line.value)))
        skipped += _send_batch(sender, numbered)
    return 1 if skipped else 0


def _send_batch(sender: Sender, numbered: list[tuple[int, bytes]]) -> int:
    """Send (line number, message) pairs; how many lines were too large to send."""
    if not isinstance(sender, DatagramSender):
        sender.send_many(message for _, message in numbered)  # one write
        return 0
    skipped = 0
    for number, message in numbered:
        try:
            sender.send_many((message,))
        except MessageTooLarge as error:  # a datagram has a size limit; the next line may fit
            _line_not_sent(number, str(error))
            skipped += 1
    return skipped


def _line_not_sent(number: int, why: str) -> None:
    print(f"pydory send: line {number} not sent: {why}", file=sys.stderr)


def _port(text: str) -> int:
    number = integer(text)
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{number} is not a TCP port (1-65535)")
    return number


def _partition_key(text: str) -> int:
    number = integer(text)
    if not _PARTITION_KEY_MIN <= number <= _PARTITION_KEY_MAX:
        raise argparse.ArgumentTypeError(
            f"{number} does not fit in 32 bits ({_PARTITION_KEY_MIN} to {_PARTITION_KEY_MAX})"
        )
    return number


def _topic(text: str) -> str:
    try:
        wire.validate_topic(text.encode("utf-8"))
    except BadTopic as error:
        raise argparse.ArgumentTypeError(error.detail) from None
    return text


def _unix_path(text: str) -> str:
    try:
        check_unix_path(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text
