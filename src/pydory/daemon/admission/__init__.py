"""Admission: a message is judged.

Decode, size, memory pool, rate limit, known topic, in that order; a message that passes is
accepted and handed to delivery, one that fails is discarded with its reason. Rule: the
moment of acceptance, and every discard before it, is decided here alone.
"""
