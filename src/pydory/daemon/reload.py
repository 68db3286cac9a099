"""What a config reload (SIGHUP, ``pydory reload``) changes: a pure plan, no I/O.

A reload never half-applies a file. ``daemon/reloading.py`` reads and validates the new file;
this module compares it with the running config and answers two questions:

- which sections change and can change while messages flow (batching, compression,
  topic configs, rate limits, inputs and their limits, the memory pool's size, delivery
  settings, the brokers and librdkafka's properties, logging, the discard log, quotas):
  ``daemon/reloading.py`` applies those;
- which changed settings only a restart can apply (the status port, the spool, message
  debugging): those keep their running values, and the reload says so, naming each
  element.

The result is the *effective* config: the file's values where a reload applies them, the
running ones elsewhere. Everything the daemon derives after a reload derives from it, so
what runs is always one consistent ``Config``, never a mix of two files.

Rule: which config sections a reload applies and which wait for a restart is decided by
:func:`plan_reload` alone; ``daemon/reloading.py`` only carries the plan out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pydory.config import Config

__all__ = ["RELOADED_SECTIONS", "ReloadPlan", "plan_reload"]

#: Config fields a reload applies, and the XML element each comes from.
RELOADED_SECTIONS: dict[str, str] = {
    "batching": "batching",
    "compression": "compression",
    "rate_limiting": "topicRateLimiting",
    "inputs": "inputSources",
    "input_config": "inputConfig",
    "delivery": "msgDelivery",
    "kafka": "kafkaConfig",
    "logging": "logging",
    "discard_logging": "discardLogging",
    "quotas": "quotas",
    "initial_brokers": "initialBrokers",
    "librdkafka": "librdkafka",
}

#: Config fields only a restart applies (their resources are made once, at start-up).
RESTART_SECTIONS: dict[str, str] = {
    "http": "httpInterface",
    "msg_debug": "msgDebug",
    "spool": "spool",
    "message_identity": "messageIdentity",
}


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    """What a reload does: run ``effective``; ``changed`` names the sections it changes
    (XML element names), ``restart_needed`` the elements whose new values wait for a
    restart (the running values stay)."""

    effective: Config
    changed: tuple[str, ...]
    restart_needed: tuple[str, ...]
    #: The ``Config`` fields whose effective value differs from the running one.
    changed_fields: frozenset[str] = frozenset()

    def changes(self, field_name: str) -> bool:
        """Whether the reload changes the Config field ``field_name``."""
        return field_name in self.changed_fields


def plan_reload(running: Config, loaded: Config) -> ReloadPlan:
    """Compare the running config with a freshly loaded one (both valid)."""
    changes: dict[str, object] = {}
    changed: list[str] = []
    restart_needed: list[str] = []
    for spec in dataclasses.fields(Config):
        if not spec.compare:
            continue  # not a setting (Config.warnings: what the new file says is ignored)
        name = spec.name
        old, new = getattr(running, name), getattr(loaded, name)
        if old == new:
            continue
        if name in RELOADED_SECTIONS:
            changes[name] = new
            changed.append(RELOADED_SECTIONS[name])
        else:
            # Unknown sections too: a section nobody taught the reload waits for a restart.
            restart_needed.append(RESTART_SECTIONS.get(name, name))
    return ReloadPlan(
        effective=dataclasses.replace(
            running,
            **changes,  # type: ignore[arg-type]
            warnings=loaded.warnings,
        ),
        changed=tuple(changed),
        restart_needed=tuple(restart_needed),
        changed_fields=frozenset(changes),
    )


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """How one reload went: ``ok`` and what it changed, or the errors that refused it
    (the daemon then runs on exactly as before)."""

    attempt: int
    ok: bool
    at: float  # epoch seconds
    errors: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    restart_needed: tuple[str, ...] = ()

    def as_json(self) -> dict[str, object]:
        return {
            "attempt": self.attempt,
            "ok": self.ok,
            "at": round(self.at, 3),
            "errors": list(self.errors),
            "changed": list(self.changed),
            "restart_needed": list(self.restart_needed),
        }


class ReloadHistory:
    """The running config's story: the file, when it was loaded, every reload's outcome
    (the latest kept), for ``/config/json`` and ``pydory reload``."""

    def __init__(self, path: str | None, loaded_at: float) -> None:
        self.path = path
        self.loaded_at = loaded_at
        self.attempts = 0
        self.succeeded = 0
        self.failed = 0
        self.last: ReloadOutcome | None = None

    @property
    def last_ok(self) -> bool:
        """Whether the last reload succeeded (True before the first)."""
        return self.last is None or self.last.ok

    def next_attempt(self) -> int:
        self.attempts += 1
        return self.attempts

    def record(self, outcome: ReloadOutcome) -> None:
        self.last = outcome
        if outcome.ok:
            self.succeeded += 1
            self.loaded_at = outcome.at
        else:
            self.failed += 1

    def as_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "loaded_at": round(self.loaded_at, 3),
            "reloads": {
                "attempted": self.attempts,
                "succeeded": self.succeeded,
                "failed": self.failed,
            },
            "last_reload": None if self.last is None else self.last.as_json(),
        }
