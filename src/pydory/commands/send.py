"""`pydory send`: send one message (or N copies) to the daemon, like Dory's `to_dory`."""

from __future__ import annotations

import argparse
import sys
from itertools import repeat
from typing import TypeAlias

from pydory import wire
from pydory.client import DatagramSender, TcpSender, UnixStreamSender, encode_message
from pydory.client.senders import check_unix_path
from pydory.errors import BadTopic, ClientError

# --count on a stream writes copies in batches of about this many bytes: one large write
# is far faster than many small ones, and the batch is built in memory.
_BATCH_BYTES = 1 << 20

# What the wire format carries in PartitionKey: Dory's C client takes an int32_t,
# the daemon reads the same 32 bits unsigned (pydory.wire.encode_partition_key).
_PARTITION_KEY_MIN = -(2**31)
_PARTITION_KEY_MAX = 2**32 - 1

Sender: TypeAlias = DatagramSender | UnixStreamSender | TcpSender


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `send` subcommand."""
    parser = subparsers.add_parser(
        "send",
        help="send a message to a running pydory daemon (like Dory's to_dory)",
        description=(
            "Send one message to a running pydory daemon. Choose exactly one transport. "
            "The value comes from --value, or from standard input with --stdin (all of "
            "it, as one value, byte for byte); with neither, it is empty."
        ),
    )
    transport = parser.add_mutually_exclusive_group(required=True)
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
    parser.add_argument("--topic", required=True, type=_topic, help="the Kafka topic")
    parser.add_argument("--key", default="", help="the message key (UTF-8); default empty")
    value = parser.add_mutually_exclusive_group()
    value.add_argument("--value", default="", help="the message value (UTF-8)")
    value.add_argument(
        "--stdin", action="store_true", help="read the value from standard input, until EOF"
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
        type=_positive_int,
        default=1,
        metavar="N",
        help="send the message N times (on a stream: one connection, batched writes)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Send the message; exit status 0, or 1 with a one-line error if the daemon cannot take it."""
    value = sys.stdin.buffer.read() if args.stdin else args.value.encode("utf-8")
    try:
        message = encode_message(
            args.topic, value, args.key.encode("utf-8"), partition_key=args.partition_key
        )
        with _open_sender(args) as sender:
            _send_copies(sender, message, args.count)
    except ClientError as error:
        print(f"pydory send: error: {error}", file=sys.stderr)
        return 1
    return 0


def _open_sender(args: argparse.Namespace) -> Sender:
    if args.socket_path is not None:
        return DatagramSender(args.socket_path)
    if args.stream_socket_path is not None:
        return UnixStreamSender(args.stream_socket_path)
    return TcpSender(args.port)


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


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _positive_int(text: str) -> int:
    number = _integer(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def _port(text: str) -> int:
    number = _integer(text)
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{number} is not a TCP port (1-65535)")
    return number


def _partition_key(text: str) -> int:
    number = _integer(text)
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
