"""Inputs: a message arrives.

The three transports (UNIX datagram, UNIX stream, loopback TCP) as thin adapters on the
event loop: they read bytes, cut stream bytes into frames, apply a listener's quotas, and
hand whole bursts to admission. Rule: nothing here decodes a message or decides its fate;
an input only reads, frames, and reports what its socket still holds.
"""
