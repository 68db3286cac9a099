"""Inputs: a message arrives.

The three transports (UNIX datagram, UNIX stream, loopback TCP) as thin adapters on the
event loop: they read bytes, cut stream bytes into frames, apply a listener's quotas, and
hand whole bursts to admission.

Seed 004's model: no thread per connection; readiness callbacks on one event loop.
Framing and decoding live in ``pydory.wire``, every decision about a message in the
``Intake`` the inputs hand their bytes to. The daemon never writes to a client socket.

- ``datagram``: the UNIX datagram input; ``datagram_drain``: whether a thread of its own
  drains its socket (on by default where compiled), and that thread as the loop sees it;
- ``stream``: a UNIX stream or TCP listener; ``stream_connection``: one of its connections;
  ``stream_drain``: whether a thread of its own reads the UNIX stream connections (off by
  default), and that thread as the loop sees it;
- ``acceptor``: accepting stream connections, and the process's file descriptor limit;
- ``quotas``: the inputs' connection and rate quotas (pure logic);
- ``peers``: who is on a socket (the client's uid, for the quotas);
- ``sockets``: the kernel's side (socket files, limits, what a socket holds unread);
- ``addresses``, ``handover``: the sockets bound before the daemon is loaded (by
  ``pydory serve``, with the standard library alone) or passed by systemd, handed to
  the inputs by kind and address;
- ``marks``: the commit point's input marks;
- ``intake_port``: what the inputs hand their bytes to;
- ``turns``: the loop's read turns, shared by the busy clients of every stream input;
- ``input_set``: the inputs a server runs, through start-up, reloads and shutdown.

Rule: no module here decodes a message or books its outcome: every message an input reads,
whole or cut short (a broken stream, an unclean disconnect, a datagram too large or over its
sender's quota), is handed to admission through ``intake_port``, which decides.
"""
