"""Stand-ins for the daemon's sockets: read and decode what a client sent."""

from __future__ import annotations

import socket

from pydory.wire import NEED_DATA, Message, StreamFramer, decode

# Generous bounds so that a broken sender fails the test instead of hanging it.
RECEIVE_TIMEOUT_S = 60
MAX_DATAGRAM = 4 << 20


def receive_datagram(receiver: socket.socket) -> Message:
    return decode(receiver.recv(MAX_DATAGRAM))


def read_stream(listener: socket.socket) -> list[Message]:
    """Accept one connection and decode everything it carries until the sender closes."""
    connection, _ = listener.accept()
    connection.settimeout(RECEIVE_TIMEOUT_S)
    framer = StreamFramer(max_message_size=1 << 30)
    messages = []
    with connection:
        while chunk := connection.recv(1 << 16):
            framer.feed(chunk)
            while (frame := framer.next_frame()) is not NEED_DATA:
                messages.append(decode(frame))
    assert framer.buffered == 0, "the stream ended in the middle of a message"
    return messages
