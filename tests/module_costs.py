"""What each test module costs, and so the order the suite's workers get the modules in.

``./dev test`` runs ``pytest -n 3 --dist loadfile``: pytest-xdist hands out whole modules, in
the order the tests were collected (``--no-loadscope-reorder`` in ``pyproject.toml``: by
default xdist reorders them by their number of tests, which says nothing of their time).
``tests/conftest.py`` orders the collected tests by their module's cost here, the costliest
module first (:func:`by_cost`): the long poles (a demo of a fleet, a kill loop) start at once
on every worker and the run ends on short modules on all, where alphabetical order left one
worker on a late long module while the others idled.

``COSTS`` is a module's seconds in a whole run (setup, call and teardown of its tests
summed, ``--durations=0``); only their ranking matters. A module not listed counts
as ``UNLISTED_S``, among the middling ones. After a change that moves a module far (a long
test added, split off or made short), refresh the table from a whole run::

    .venv/bin/pytest -n 3 --dist loadfile --durations=0 -q > /tmp/durations.log
    .venv/bin/python tests/module_costs.py /tmp/durations.log   # prints the new COSTS
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Seconds a module not in ``COSTS`` counts as (a new module is rarely a long pole).
UNLISTED_S = 5.0

#: Seconds per test module in a quiet whole run: ``--durations=0`` of a fresh clone on three
#: workers, 2026-11-28 18:25 UTC (638 s; the machine otherwise idle).
COSTS: dict[str, float] = {
    "test_pipeline_land.py": 184.8,
    "test_pipeline_faults.py": 154.0,
    "test_demo_fleet.py": 135.6,
    "test_fleet_exactly_once.py": 128.4,
    "test_daemon_kafka_faults.py": 116.1,
    "test_spool_daemon.py": 101.9,
    "test_daemon_faults.py": 69.8,
    "test_kafka_broker.py": 66.5,
    "test_pipeline_dedup.py": 58.5,
    "test_daemon_kafka_start.py": 54.2,
    "test_distributed.py": 51.7,
    "test_pipeline_fleet_audit.py": 47.8,
    "test_pipeline_connectors.py": 47.3,
    "test_demo.py": 42.8,
    "test_demo_sigkill.py": 32.4,
    "test_status.py": 28.1,
    "test_client_isolation.py": 28.0,
    "test_partial_frames.py": 27.1,
    "test_dory_dropin.py": 27.0,
    "test_pipeline_second_copies.py": 24.7,
    "test_dory_monitoring.py": 21.9,
    "test_overload.py": 21.5,
    "test_daemon_kafka.py": 20.8,
    "test_possibly_persisted.py": 20.0,
    "test_quotas_daemon.py": 17.9,
    "test_pipeline_audit.py": 17.4,
    "test_dashboard.py": 15.7,
    "test_install_steps.py": 15.5,
    "test_daemon.py": 11.5,
    "test_shutdown_outage.py": 10.8,
    "test_cwire.py": 10.7,
    "test_daemon_tansu.py": 10.6,
    "test_bench.py": 10.6,
    "test_message_identity.py": 9.7,
    "test_books_durable_kafka.py": 9.5,
    "test_restarts.py": 9.0,
    "test_wheel.py": 8.2,
    "test_datagram_drain.py": 8.2,
    "test_reload_daemon.py": 8.0,
    "test_quotas.py": 7.8,
    "test_status_limits.py": 7.8,
    "test_spool_acks_kafka.py": 7.0,
    "test_systemd_unit.py": 6.8,
    "test_msg_debug_daemon.py": 6.8,
    "test_spark_worker_python.py": 6.8,
    "test_wait_command.py": 6.6,
    "test_books_durable.py": 6.2,
    "test_reload_command.py": 6.1,
    "test_layout.py": 6.0,
    "test_spool_recovery.py": 5.7,
    "test_pipeline_source.py": 5.6,
    "test_spool.py": 5.3,
    "test_wire.py": 5.2,
    "test_mock_cluster.py": 5.0,
    "test_build.py": 4.3,
    "test_hotpath_daemon.py": 4.1,
    "test_daemon_teardown.py": 4.1,
    "test_serve_command.py": 4.1,
    "test_datagram_sizes.py": 3.9,
    "test_spool_replay.py": 3.8,
    "test_topic_cardinality.py": 3.8,
    "test_health.py": 3.5,
    "test_fd_limit.py": 3.4,
    "test_status_client.py": 3.1,
    "test_quota_clients.py": 3.1,
    "test_status_schemas.py": 2.4,
    "test_tcp_gathering.py": 2.4,
    "test_send_command.py": 2.2,
    "test_cli_startup.py": 2.1,
    "test_kafka_topics.py": 2.1,
    "test_client_shares.py": 1.8,
    "test_discard_log.py": 1.8,
    "test_metrics.py": 1.8,
    "test_commit_point.py": 1.7,
    "test_poll_faults.py": 1.6,
    "test_spool_acks.py": 1.5,
    "test_test_deadlines.py": 1.4,
    "test_pool.py": 1.3,
    "test_pipeline_fleet_reconcile.py": 1.2,
    "test_outcomes.py": 1.1,
    "test_status_rendering.py": 1.0,
    "test_metadata_failure_line.py": 1.0,
    "test_cproducer.py": 1.0,
    "test_config.py": 0.9,
    "test_systemd.py": 0.9,
    "test_inputs_fairness.py": 0.8,
    "test_inputs_shutdown.py": 0.8,
    "test_accounting.py": 0.8,
    "test_tansu.py": 0.7,
    "test_cli.py": 0.7,
    "test_framer.py": 0.7,
    "test_client.py": 0.7,
    "test_config_cli.py": 0.6,
    "test_router.py": 0.6,
    "test_reload_plan.py": 0.6,
    "test_config_values.py": 0.5,
    "test_datagram_shares.py": 0.5,
    "test_status_command.py": 0.5,
    "test_socket_handover.py": 0.4,
    "test_daemon_location.py": 0.4,
    "test_intake.py": 0.3,
    "test_status_escaping.py": 0.3,
    "test_pipeline_offsets.py": 0.3,
    "test_docs.py": 0.3,
    "test_client_charges.py": 0.2,
    "test_send_lines.py": 0.2,
    "test_msg_debug.py": 0.2,
    "test_spool_slow_disk.py": 0.1,
    "test_log_handler_daemon.py": 0.1,
    "test_pipeline_nothing_new.py": 0.1,
    "test_client_log_limits.py": 0.1,
    "test_dev_script.py": 0.1,
    "test_inputs_retire.py": 0.0,
}

#: A line of ``--durations=0``: seconds, phase, node id.
_DURATION = re.compile(r"^\s*(?P<s>\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(?P<id>\S+)")


def by_cost(modules: Sequence[str], costs: Mapping[str, float] = COSTS) -> list[int]:
    """The positions of ``modules`` (each collected test's module file name, in collection
    order) in the order to run them: the costliest module first, equal costs in collection
    order, each module's tests together and in their order."""
    first_seen: dict[str, int] = {}
    for name in modules:
        first_seen.setdefault(name, len(first_seen))
    return sorted(
        range(len(modules)),
        key=lambda i: (-costs.get(modules[i], UNLISTED_S), first_seen[modules[i]]),
    )


def costs_from_durations(lines: Sequence[str]) -> Counter[str]:
    """Seconds per module file name, summed from ``--durations=0`` output lines."""
    costs: Counter[str] = Counter()
    for line in lines:
        found = _DURATION.match(line)
        if found is not None:
            costs[Path(found["id"].split("::", 1)[0]).name] += float(found["s"])
    return costs


def render(costs: Mapping[str, float]) -> str:
    """``COSTS`` as Python source, the costliest first."""
    ranked = sorted(costs.items(), key=lambda item: (-item[1], item[0]))
    rows = "".join(f'    "{name}": {s:.1f},\n' for name, s in ranked)
    return "COSTS: dict[str, float] = {\n" + rows + "}"


if __name__ == "__main__":
    print(render(costs_from_durations(Path(sys.argv[1]).read_text().splitlines())))
