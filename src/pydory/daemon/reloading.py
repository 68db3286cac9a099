"""A config reload applied to the running daemon, and undone if one of its steps fails.

``daemon/reload.py`` decides, without touching anything, what a new config changes
(:class:`~pydory.daemon.reload.ReloadPlan`). This module carries the plan out on the
components :func:`~pydory.daemon.assembly.assemble` built, in two phases: first each step
that can fail (the datagram size checked, the inputs added or moved opened beside the
running ones, the new log handlers installed, a new metadata client and the new producers
made), each undone in reverse order if a later one fails; then the steps that cannot fail
(the limiter, the metadata timings, the pool's size and the inputs' limits, the intake's
limits, the discard log, the inputs swapped, the quotas). Messages already taken in settle
on the producers that took them; every message read after the reload meets the new config.

Rule: a reload changes the running daemon only through :func:`reload_config`, which
leaves it as it was when the new config is refused.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from confluent_kafka import KafkaException

from pydory.config import Config, load_config
from pydory.daemon.assembly import (
    Components,
    autocreate_of,
    configured_topics,
    metadata_timings,
)
from pydory.daemon.delivery.librdkafka_settings import delivery_settings, producer_profile
from pydory.daemon.delivery.metadata import MetadataClient, MetadataService
from pydory.daemon.inputs.datagram import DatagramInput
from pydory.daemon.inputs.input_set import InputSwap
from pydory.daemon.inputs.stream import StreamInput
from pydory.daemon.logsetup import LogFiles
from pydory.daemon.reload import ReloadOutcome, ReloadPlan, plan_reload
from pydory.errors import ConfigError, ConfigErrors

log = logging.getLogger(__name__)

#: The Config fields that make the producers' settings (delivery_settings, producer_profile).
PRODUCER_SECTIONS = (
    "input_config",  # librdkafka's queue limit follows maxBuffer
    "batching",
    "compression",
    "kafka",
    "delivery",
    "initial_brokers",
    "librdkafka",
)


@dataclass(frozen=True, eq=False)
class RunningDaemon:
    """What a reload changes, and how it tells the server: ``adopt`` takes the new
    config as the running one; ``on_input_idle`` is called when a stream listener the
    reload retired has no connection left; ``create_topic`` starts an auto-creation."""

    parts: Components
    log_files: LogFiles | None
    adopt: Callable[[Config], None]
    on_input_idle: Callable[[StreamInput], None]
    create_topic: Callable[[str], None]


async def reload_config(
    attempt: int,
    running: Config,
    loaded: Config | None,
    config_path: str | None,
    daemon: RunningDaemon,
) -> ReloadOutcome:
    """Read ``config_path`` again (or take ``loaded``) and apply it to ``daemon``. An
    invalid file changes nothing: the daemon runs on, every error is logged."""
    if loaded is None and config_path is None:
        return refused(attempt, ["no config file to reload (the daemon was given a Config)"])
    try:
        if loaded is None:
            assert config_path is not None
            try:
                loaded = load_config(config_path)
            except OSError as error:
                raise ConfigError(
                    f"cannot read config file {config_path}: {error.strerror}"
                ) from None
        plan = plan_reload(running, loaded)
        await _apply(plan, running, daemon)
    except ConfigErrors as errors:
        return refused(attempt, [str(error) for error in errors.errors])
    except ConfigError as error:
        return refused(attempt, [str(error)])
    except OSError as error:  # a new socket or log file could not be opened
        return refused(attempt, [str(error)])
    for element in plan.restart_needed:
        log.warning("config reload: <%s> changed; it takes effect at the next restart", element)
    for warning in loaded.warnings:
        log.warning("config reload: %s", warning)
    log.log(
        25,
        "config reloaded from %s: changed %s",
        config_path or "<given config>",
        ", ".join(plan.changed) or "nothing",
    )
    return ReloadOutcome(
        attempt, True, time.time(), changed=plan.changed, restart_needed=plan.restart_needed
    )


def refused(attempt: int, errors: list[str]) -> ReloadOutcome:
    """A reload that changed nothing, its errors logged."""
    for error in errors:
        log.error("config reload refused, running on as before: %s", error)
    return ReloadOutcome(attempt, False, time.time(), errors=tuple(errors))


async def _apply(plan: ReloadPlan, running: Config, daemon: RunningDaemon) -> None:
    """Apply a reload plan: first each step that can fail, undone if a later one does
    (:func:`_prepare`); then the steps that cannot fail."""
    new, parts = plan.effective, daemon.parts
    inputs, metadata_client = await _prepare(plan, running, daemon)
    if metadata_client is not None:
        parts.metadata.use_client(metadata_client)
    if plan.changes("rate_limiting"):
        parts.limiter.reconfigure(new.rate_limit_for)
    if plan.changes("delivery"):
        parts.metadata.reconfigure(**metadata_timings(new))
    if plan.changes("input_config"):
        parts.pool.resize(new.input_config.max_buffer)
        parts.pool.shares.admit_frames_up_to(new.input_config.max_stream_msg_size)
        parts.inputs.apply_limits(new)
    parts.intake.reconfigure(
        new.batching.message_max_bytes, autocreate_of(new, daemon.create_topic)
    )
    if plan.changes("discard_logging") or plan.changes("logging"):
        await _swap_discard_log(parts, running, new)
    daemon.adopt(new)
    await parts.inputs.swap(inputs, running, new, on_idle=daemon.on_input_idle)
    if inputs.opened:
        parts.overload.inputs_opened()  # memory short right now: they start paused too
    if plan.changes("quotas"):
        parts.inputs.set_quotas(new.quotas)  # a new input already has them


async def _prepare(
    plan: ReloadPlan, running: Config, daemon: RunningDaemon
) -> tuple[InputSwap, MetadataClient | None]:
    """The steps of a reload that can fail: check the datagram size, open the inputs
    added or moved, install the new log handlers, create a new metadata client and
    the new producers. If one fails, those done are undone and the error raised."""
    new, parts = plan.effective, daemon.parts
    undo: list[Callable[[], Awaitable[None]]] = []
    try:
        if new.inputs.unix_datagram.enabled:
            limits = new.input_config
            DatagramInput.check_limits(
                limits.max_datagram_msg_size, limits.allow_large_unix_datagrams
            )
        inputs = await parts.inputs.open_changed(running, new, asyncio.get_running_loop())
        undo.append(inputs.close_opened)
        log_files = daemon.log_files
        if plan.changes("logging") and log_files is not None:
            log_files.apply(new.logging)

            async def restore_logging() -> None:
                log_files.apply(running.logging)

            undo.append(restore_logging)
        metadata_client = _new_metadata_client(plan)
        if any(plan.changes(f) for f in PRODUCER_SECTIONS):
            parts.dispatcher.reconfigure(
                delivery_settings(new),
                functools.partial(producer_profile, new),
                configured_topics(new),
            )
    except BaseException:
        for step in reversed(undo):
            await step()
        raise
    return inputs, metadata_client


def _new_metadata_client(plan: ReloadPlan) -> MetadataClient | None:
    """A metadata client for new brokers, librdkafka properties or client id (None:
    none of them changed)."""
    if not any(plan.changes(f) for f in ("initial_brokers", "librdkafka", "kafka")):
        return None
    try:
        return MetadataService.new_client(delivery_settings(plan.effective).properties())
    except KafkaException as exc:
        raise ConfigError(
            f"librdkafka refuses the new settings: {exc.args[0].str()}",
            "/doryConfig/librdkafka",
        ) from None


async def _swap_discard_log(parts: Components, running: Config, new: Config) -> None:
    """Hand the books the discard outputs of the new config before closing the old
    ones that are not reused, so that no discard falls between the two."""
    old = parts.discard_log
    parts.discard_log = old.reconfigured(running, new, parts.counters)
    parts.books.set_discard_sink(parts.discard_log.sink)
    await asyncio.to_thread(old.close_replaced, parts.discard_log)
