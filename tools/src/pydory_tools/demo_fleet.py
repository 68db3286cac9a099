"""``pydory demo --fleet``: a fleet off one machine's parts, crashed on purpose, audited from
the books topic and a lake on HDFS.

What it runs, in order, each stage timed on one line (:mod:`pydory_tools.demo` has the
progress lines, :mod:`pydory_tools.testing.kill_loop` the clients, kills and landing job):

1. Apache Kafka, three KRaft nodes, the events topic and the books topic (compacted);
2. HDFS (Hadoop's MiniDFSCluster, its own JVM): the lake, the checkpoint, the audit state;
3. a Spark standalone cluster: a master and two workers, each a process of its own;
   (these three need nothing of each other: they start at once, each in a thread of its
   own, and each stage's line comes when its part is ready;)
4. three daemons (``pydory serve``), each with its own host id (``fleet-a``, ...), config,
   sockets and spool, publishing each run's books to the books topic, started at once;
5. the landing job (``pydory pipeline land --trigger-interval 1``) on the Spark cluster,
   into the lake on HDFS (started before the daemons, which it does not need: its JVM
   starts while they do);
6. clients on all three transports to every daemon, while every daemon is SIGKILLed at
   random moments (``kills`` each) and restarted on its spool, except the last daemon's
   last kill: that host never comes back. Meanwhile the landing job (driver and JVM) is
   SIGKILLed while a batch after its first is planned and not committed;
7. the daemons that are still up settle every message and stop cleanly;
8. the landing job restarted on its checkpoint (Trigger.AvailableNow) to the end: it runs
   the killed batch again first, and once a Spark worker runs the job's executor, while
   that batch is planned and not committed, the worker is SIGKILLed: its tasks run again
   on the other worker.
   (In this order each kill falls in a batch whatever the machine's speed: the restart
   always has the killed batch to run, however long ago the clients finished.)
9. the fleet audit (:func:`pydory_tools.demo_kills.fleet_audit`): the books topic against
   the lake on HDFS, on the Spark cluster.

Its last lines name the host that did not come back and how the audit accounted its last
run, then what ran where (``hdfs://…``, ``spark://…``); it returns 0 only if the fleet
audit balances. Everything it started is stopped by its PID on the way out.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydory.errors import PydoryError
from pydory.wording import counted
from pydory_tools.demo import (
    CLIENT_TIMEOUT_S,
    DAEMON_START_TIMEOUT_S,
    SETTLE_TIMEOUT_S,
    DemoFailed,
    DemoPaths,
    DemoTopics,
    Progress,
    demo_daemon_config,
    embedded_kafka,
    landing_connector,
    prepare_workdir,
    require_clean_exit,
    stderr_to,
    verdict,
)
from pydory_tools.demo_kills import fleet_audit, what_became_of_them
from pydory_tools.testing.daemon_process import DaemonDidNotStart
from pydory_tools.testing.hdfs_cluster import HdfsCluster, HdfsError
from pydory_tools.testing.kafka_util import admin_create_topic
from pydory_tools.testing.kill_loop import (
    KilledDaemon,
    KillLoopError,
    LandingJob,
    SurvivingClient,
    endpoints,
    kill_thresholds,
)
from pydory_tools.testing.lifecycle import SHORT_LIVED_EXECUTOR_CONF, StopsOnExit
from pydory_tools.testing.spark_cluster import SparkCluster, SparkClusterError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pydory.pipeline.audits.fleet_reconcile import FleetReport

STAGES = 9
BROKERS = 3
HOSTS = ("fleet-a", "fleet-b", "fleet-c")
#: The host whose last SIGKILL is for good: a machine that crashed and never came back.
GONE = HOSTS[-1]
DATANODES = 2
WORKERS = 2
#: The worker SIGKILLed while a batch is planned and not committed.
KILLED_WORKER = 1
#: Messages a second each client sends while its daemon is up: the sending lasts long
#: enough (count / rate seconds) for the landing job to plan batches while it goes on.
CLIENT_RATE = 200
LANDING_TIMEOUT_S = 600.0
#: Small executors and shuffles: two 1-core workers on a machine that also runs the rest.
SPARK_CONF = {
    "spark.executor.memory": "512m",
    "spark.sql.shuffle.partitions": "2",
    **SHORT_LIVED_EXECUTOR_CONF,
}
_Part = TypeVar("_Part")
_Launched = TypeVar("_Launched", bound=StopsOnExit)
#: The landing job's last line (``pipeline/land.py``'s summary).
_LANDING_SUMMARY = re.compile(r"landing (finished|stopped|FAILED)")


@dataclass(frozen=True)
class HdfsPaths:
    """The demo's directories on HDFS."""

    root: str

    @property
    def lake(self) -> str:
        return f"{self.root}/lake"

    @property
    def checkpoint(self) -> str:
        return f"{self.root}/checkpoint"

    @property
    def audit_state(self) -> str:
        return f"{self.root}/audit-state"


@dataclass
class Fleet:
    """What the demo started and did, for its last lines."""

    paths: DemoPaths
    kafka: str = ""
    hdfs: HdfsCluster | None = None
    on_hdfs: HdfsPaths | None = None
    spark: SparkCluster | None = None
    daemons: dict[str, KilledDaemon] | None = None
    worker_killed_in: int = -1
    landing_killed_in: int = -1
    sent: int = 0
    dropped: str = ""


def run_fleet_demo(
    kills: int = 2,
    count: int = 2000,
    workdir: str | None = None,
    seed: int | None = None,
) -> int:
    """Run the fleet demo with ``kills`` SIGKILLs per daemon; 0 when the fleet audit balances."""
    if kills < 1:
        raise ValueError("the fleet demo kills every daemon at least once")
    progress = Progress(STAGES)
    try:
        paths = prepare_workdir(workdir)
        print(f"pydory demo --fleet: work directory {paths.workdir} (kept)", flush=True)
        fleet = Fleet(paths)
        report = _run_stages(progress, fleet, kills, count, seed)
    except DemoFailed as error:
        print(f"demo: FAILED: {error}", flush=True)
        return 1
    print()
    print(report.render().rstrip("\n"))
    print()
    print(the_host_that_did_not_come_back(report.as_dict(), GONE))
    print(what_became_of_them(fleet.sent, report.as_dict(), "the daemons"))
    status = verdict(
        progress,
        report.balanced,
        "the fleet audit balanced: every accepted message is in the lake exactly once",
        "the fleet audit does not balance",
    )
    print()
    for line in what_ran_where(fleet):
        print(line)
    return status


def the_host_that_did_not_come_back(report: dict[str, Any], host: str) -> str:
    """The line naming the host that never came back and how its last run was accounted."""
    found = next((h for h in report["hosts"] if h["host"] == host), None)
    if found is None or not found["runs"]:
        return f"demo: host {host} did not come back, and the books topic has no run of it"
    last = max(found["runs"], key=lambda run: run["started_ms"])
    final = "final" if last["final"] else "not final (its last periodic record)"
    topics = found["topics"]
    outstanding = sum(topic["outstanding"] for topic in topics)
    in_flight = sum(topic["in_flight"] for topic in topics)
    verdict_text = "balanced" if found["balanced"] else "NOT balanced"
    line = (
        f"demo: host {host} did not come back (SIGKILLed, never restarted): its last run "
        f"{last['incarnation']} ended {last['ended']!r}, books {final}, accounted as "
        f"{last['accepted']:,} accepted ({last['new']:,} new), "
        f"{last['landed_under_its_identity']:,} landed under its identity; over the host's "
        f"{counted(len(found['runs']), 'run')}: {outstanding:,} outstanding, "
        f"{in_flight:,} in flight when its books were last published; {verdict_text}"
    )
    problems = found.get("problems") or []
    return line + "".join(f"\n  problem: {problem}" for problem in problems)


def what_ran_where(fleet: Fleet) -> list[str]:
    """The demo's last lines: each part, where it ran, where its files are."""
    paths = fleet.paths
    lines = [f"kafka:   {fleet.kafka}; data and logs in {paths.workdir / 'kafka'}"]
    if fleet.hdfs is not None and fleet.on_hdfs is not None:
        lines.append(
            f"hdfs:    {fleet.hdfs.uri} ({DATANODES} datanodes): lake {fleet.on_hdfs.lake}, "
            f"checkpoint {fleet.on_hdfs.checkpoint}, audit state {fleet.on_hdfs.audit_state}; "
            f"log {fleet.hdfs.log_path}"
        )
    if fleet.spark is not None:
        lines.append(
            f"spark:   {fleet.spark.master_url} (a master and {WORKERS} workers; worker "
            f"{KILLED_WORKER} SIGKILLed in batch {fleet.worker_killed_in}); the landing job "
            f"SIGKILLed in batch {fleet.landing_killed_in} and restarted on its checkpoint; "
            f"logs in {fleet.spark.base_dir}, {paths.workdir / 'landing.log'}, "
            f"{paths.spark_log}"
        )
    for host, daemon in (fleet.daemons or {}).items():
        fate = "never restarted" if daemon.gone else "restarted each time, stopped cleanly"
        lines.append(
            f"daemon:  {host}: {counted(daemon.kills, 'SIGKILL')}, {fate}; "
            f"{paths.workdir / host} (config, log, spool)"
        )
    lines.append(f"reports: {paths.report_text}, {paths.report_json}")
    lines.append("every process the demo started is stopped")
    return lines


# --- the stages -------------------------------------------------------------------------------


def _run_stages(
    progress: Progress, fleet: Fleet, kills: int, count: int, seed: int | None
) -> FleetReport:
    paths = fleet.paths
    with contextlib.ExitStack() as running:
        # Kafka, HDFS and the Spark cluster need nothing of each other: all three start at
        # once, each stage below waits for its own (stopped in the reverse order).
        kafka = _start_beside(running, "kafka", lambda own: _kafka(own, paths))
        hdfs = _start_beside(running, "hdfs", lambda own: _hdfs(own, paths))
        spark = _start_beside(running, "spark", lambda own: _spark(own, paths))
        with progress.stage("kafka") as result:
            bootstrap, described, topics = kafka.result()
            fleet.kafka = f"{described} at {bootstrap}"
            result.append(f"{fleet.kafka}; topics {topics.listed()}; books {topics.books}")
        with progress.stage("hdfs") as result:
            fleet.hdfs = hdfs.result()
            fleet.on_hdfs = HdfsPaths(f"{fleet.hdfs.uri}/pydory-demo")
            result.append(
                f"{fleet.hdfs.describe()} (pid {fleet.hdfs.pid}), started beside the others "
                f"in {fleet.hdfs.startup_s:.1f} s"
            )
        with progress.stage("spark") as result:
            fleet.spark = spark.result()
            pids = ", ".join(str(fleet.spark.worker_pid(n)) for n in range(1, WORKERS + 1))
            result.append(
                f"{fleet.spark.describe()} (worker pids {pids}), started beside the others "
                f"in {fleet.spark.startup_s:.1f} s"
            )
        land_args = _land_args(bootstrap, topics.events, fleet.on_hdfs, fleet.spark.master_url)
        # The landing job needs Kafka, HDFS and Spark, not the daemons: its JVM starts
        # while they do.
        job = LandingJob([*land_args, "--trigger-interval", "1"], paths.workdir / "landing.log")
        running.callback(_kill_if_running, job)
        with progress.stage("daemons") as result:
            fleet.daemons = _start_daemons(running, bootstrap, paths.workdir, topics.books)
            result.append(
                ", ".join(
                    f"{host} (pid {d.process.process.pid}, status "
                    f"http://127.0.0.1:{d.config.http_port})"
                    for host, d in fleet.daemons.items()
                )
                + ": spools on, each its own host id"
            )
        with progress.stage("landing") as result:
            job.wait_for_line("landing query started", LANDING_TIMEOUT_S)
            result.append(
                f"pydory pipeline land (pid {job.process.pid}) on {fleet.spark.master_url}, "
                f"into {fleet.on_hdfs.lake}, a batch a second"
            )
        with progress.stage("clients") as result:
            clients = {
                host: [
                    SurvivingClient(
                        f"{host}/{transport}",
                        endpoint,
                        topics.events,
                        limit=count,
                        rate=CLIENT_RATE,
                    )
                    for transport, endpoint in endpoints(daemon.config).items()
                ]
                for host, daemon in fleet.daemons.items()
            }
            try:
                _send_while_killing(fleet, clients, job, kills, seed)
            except (KillLoopError, DaemonDidNotStart) as error:
                raise DemoFailed(f"{error}; see the logs under {paths.workdir}") from None
            fleet.sent = sum(c.sent for host_clients in clients.values() for c in host_clients)
            result.append(
                f"{counted(sum(map(len, clients.values())), 'client thread')} sent "
                f"{counted(fleet.sent, 'message')} over unix datagram, unix stream and tcp to "
                f"{len(HOSTS)} daemons; each SIGKILLed {counted(kills, 'time')} at random "
                f"moments and restarted on its spool, {GONE}'s last kill for good; the "
                f"landing job SIGKILLed in batch {fleet.landing_killed_in}"
            )
        with progress.stage("settle") as result:
            alive = {host: d for host, d in fleet.daemons.items() if not d.gone}
            try:
                for daemon in alive.values():
                    daemon.settle(SETTLE_TIMEOUT_S)
            except KillLoopError as error:
                raise DemoFailed(str(error)) from None
            for host, daemon in alive.items():
                require_clean_exit(daemon.stop(), DemoPaths(paths.workdir / host))
            replayed = sum(d.replayed for d in fleet.daemons.values())
            result.append(
                f"{', '.join(alive)} settled every message and stopped cleanly (exit 0); "
                f"{counted(replayed, 'message')} replayed from the spools in all; {GONE} is gone"
            )
        # Spark's log lines (the audit's JVM inherits stderr) go to the file, not the terminal.
        with stderr_to(paths.spark_log):
            with progress.stage("land") as result:
                again = LandingJob([*land_args, "--available-now"], paths.workdir / "landing.log")
                running.callback(_kill_if_running, again)
                try:
                    fleet.worker_killed_in = _kill_a_worker_mid_batch(fleet, again)
                except KillLoopError as error:
                    raise DemoFailed(f"{error}; see {paths.workdir / 'landing.log'}") from None
                # The audit's session (its JVM, its app registered) starts while the job
                # lands: the master gives it the cores the job leaves when it ends. Only
                # now, the job's executors placed: an app registered before the job's
                # would be given them first.
                audit_session = _start_beside(
                    running, "audit session", lambda own: _audit_session(own, fleet)
                )
                status = again.wait(LANDING_TIMEOUT_S)
                summary = next(
                    (line for line in again.lines if _LANDING_SUMMARY.match(line)), again.output
                ).strip()
                if status != 0:
                    raise DemoFailed(
                        f"the restarted landing job exited with status {status}: {summary}; "
                        f"see {paths.workdir / 'landing.log'}"
                    )
                result.append(
                    f"restarted on its checkpoint, Spark worker {KILLED_WORKER} SIGKILLed in "
                    f"batch {fleet.worker_killed_in}: {summary}"
                )
            with progress.stage("audit") as result:
                session = audit_session.result()  # fleet_audit reuses the one running
                report = fleet_audit(
                    bootstrap,
                    topics,
                    paths,
                    fleet.spark.master_url,
                    "kafka",
                    lake=fleet.on_hdfs.lake,
                    state_dir=fleet.on_hdfs.audit_state,
                    conf=SPARK_CONF,
                )
                session.stop()  # its executors leave the cluster, its JVM exits
                balanced = "balanced" if report.balanced else "DOES NOT BALANCE"
                result.append(
                    f"books topic {topics.books} against {fleet.on_hdfs.lake} on "
                    f"{fleet.spark.master_url}: {balanced}"
                )
    return report


def _kafka(own: contextlib.ExitStack, paths: DemoPaths) -> tuple[str, str, DemoTopics]:
    """The 3-node Apache Kafka with the demo's topics and its books topic (compacted)."""
    bootstrap, described, topics = own.enter_context(
        embedded_kafka("kafka", BROKERS, paths.workdir)
    )
    admin_create_topic(
        bootstrap,
        topics.books,
        1,
        replication_factor=BROKERS,
        config={"cleanup.policy": "compact"},
    )
    return bootstrap, described, topics


def _hdfs(own: contextlib.ExitStack, paths: DemoPaths) -> HdfsCluster:
    """HDFS with its datanodes, its data and log in the work directory."""
    return own.enter_context(
        _launched(
            lambda: HdfsCluster(DATANODES, base_dir=paths.workdir / "hdfs"), HdfsError, "HDFS"
        )
    )


def _spark(own: contextlib.ExitStack, paths: DemoPaths) -> SparkCluster:
    """The Spark standalone cluster, its logs and work directories in the work directory."""
    return own.enter_context(
        _launched(
            lambda: SparkCluster(WORKERS, base_dir=paths.workdir / "spark"),
            SparkClusterError,
            "the Spark cluster",
        )
    )


class _Beside(Generic[_Part]):
    """A part of the fleet started in a thread of its own, beside the others.

    The launchers tie each process they start to the thread that started it
    (``PR_SET_PDEATHSIG``, :func:`pydory_tools.testing.lifecycle.die_with_parent`), so
    that thread lives as long as the part: it enters the part's context, hands the part
    over (:meth:`result`), waits to be told to stop, and leaves the context itself.
    """

    def __init__(self, name: str, enter: Callable[[contextlib.ExitStack], _Part]) -> None:
        self._enter = enter
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._part: _Part | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"demo {name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.ExitStack() as own:
            try:
                self._part = self._enter(own)
            except BaseException as error:  # noqa: BLE001 -- raised in the caller by result()
                self._error = error
                return  # what it started is stopped on the way out
            finally:
                self._ready.set()
            self._stop.wait()

    def result(self) -> _Part:
        """The part, once started; what its start raised, raised here."""
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return _started(self._part)

    def stop(self) -> None:
        """Stop the part (in its thread) and wait until it is stopped."""
        self._stop.set()
        self._thread.join()


def _start_beside(
    running: contextlib.ExitStack, name: str, enter: Callable[[contextlib.ExitStack], _Part]
) -> _Beside[_Part]:
    """Start a part in a thread of its own (:class:`_Beside`), stopped with ``running``."""
    part = _Beside(name, enter)
    running.callback(part.stop)
    return part


def _start_daemons(
    running: contextlib.ExitStack, bootstrap: str, workdir: Path, books_topic: str
) -> dict[str, KilledDaemon]:
    """The fleet's daemons, started at once (none needs another); every one that started
    is stopped with ``running``, also when another did not start."""
    with ThreadPoolExecutor(len(HOSTS)) as pool:
        starting = {
            host: pool.submit(_start_daemon, bootstrap, workdir / host, host, books_topic)
            for host in HOSTS
        }
        concurrent.futures.wait(starting.values())
    daemons: dict[str, KilledDaemon] = {}
    for host, future in starting.items():
        if future.exception() is None:
            daemons[host] = future.result()
            running.callback(daemons[host].stop)
    for future in starting.values():
        future.result()  # the first daemon that did not start fails the demo
    return daemons


def _send_while_killing(
    fleet: Fleet,
    clients: dict[str, list[SurvivingClient]],
    job: LandingJob,
    kills: int,
    seed: int | None,
) -> None:
    """Start the clients; kill every daemon ``kills`` times (the last host's last kill for
    good) and the landing job mid-batch; wait for the clients."""
    daemons = _started(fleet.daemons)
    rng = random.Random(seed)
    every = [client for host_clients in clients.values() for client in host_clients]
    try:
        for client in every:
            client.start()
        with ThreadPoolExecutor(len(HOSTS)) as pool:
            loops = []
            for host, daemon in daemons.items():
                total = sum(client.limit for client in clients[host])
                # Within the first half of the host's traffic, as demo --sigkill draws them.
                low, high = total // (3 * (kills + 1)), total // (2 * (kills + 1))
                moments = kill_thresholds(rng, kills, max(1, low), max(1, high))
                loops.append(pool.submit(_kill_loop, daemon, moments, host, clients[host]))
            # A batch after the first: the job has landed something before it dies.
            fleet.landing_killed_in = job.batch_in_flight(_checkpoint_names(fleet), 0)
            job.kill()
            for loop in loops:
                loop.result()
        for client in every:
            client.finish(CLIENT_TIMEOUT_S + client.limit / client.rate)
    finally:  # after a failure, no client outlives the demo
        for client in every:
            client.stop()


def _kill_loop(
    daemon: KilledDaemon, moments: Sequence[int], host: str, clients: Sequence[SurvivingClient]
) -> None:
    """Kill ``daemon`` at ``moments``; the host that never comes back stops its clients
    at once (they would wait for it, and give up with an error after a minute)."""
    daemon.kill_at(moments, come_back=host != GONE)
    if daemon.gone:
        for client in clients:
            client.stop()


def _kill_a_worker_mid_batch(fleet: Fleet, job: LandingJob) -> int:
    """Once the restarted job's query runs and the worker runs its executor, SIGKILL the
    worker while a batch (the killed one, run again, or a later one) is planned and not
    committed; the batch's number."""
    spark = _started(fleet.spark)
    job.wait_for_line("landing query started", LANDING_TIMEOUT_S)
    deadline = time.monotonic() + LANDING_TIMEOUT_S
    while not spark.worker_executors(KILLED_WORKER):
        if job.process.poll() is not None or time.monotonic() > deadline:
            raise KillLoopError(f"Spark worker {KILLED_WORKER} never ran the job's executor")
        time.sleep(0.1)  # the worker's status page, looked at again
    batch = job.batch_in_flight(_checkpoint_names(fleet), fleet.landing_killed_in - 1)
    spark.kill_worker(KILLED_WORKER)
    return batch


def _checkpoint_names(fleet: Fleet) -> Callable[[str], Sequence[str]]:
    """The names in a directory of the landing job's checkpoint on HDFS."""
    hdfs, checkpoint = _started(fleet.hdfs), _started(fleet.on_hdfs).checkpoint
    return lambda name: hdfs.list_names(f"{checkpoint}/{name}")


def _started(part: _Part | None) -> _Part:
    """A part of the fleet the stages before started (the stages run in order)."""
    if part is None:
        raise AssertionError("a stage ran before the one that starts what it needs")
    return part


def _land_args(bootstrap: str, topic: str, on_hdfs: HdfsPaths, master: str) -> list[str]:
    args = ["--bootstrap", bootstrap, "--topics", topic]
    args += ["--lake", on_hdfs.lake, "--checkpoint", on_hdfs.checkpoint]
    args += ["--master", master, "--connector", landing_connector("kafka")]
    for key, value in SPARK_CONF.items():
        args += ["--conf", f"{key}={value}"]
    return args


@contextlib.contextmanager
def _launched(
    launch: Callable[[], _Launched], errors: type[PydoryError], what: str
) -> Iterator[_Launched]:
    """A part the demo starts (``launch()``), stopped by its PID on the way out; a part
    that does not start fails the demo with the launcher's reason."""
    try:
        part = launch()
    except errors as error:
        raise DemoFailed(f"cannot start {what}: {error}") from None
    with part:
        yield part


def _start_daemon(bootstrap: str, workdir: Path, host: str, books_topic: str) -> KilledDaemon:
    workdir.mkdir()
    paths = DemoPaths(workdir)
    config = demo_daemon_config(bootstrap, paths, host_id=host, books_topic=books_topic)
    try:
        return KilledDaemon(config, workdir, start_timeout_s=DAEMON_START_TIMEOUT_S)
    except DaemonDidNotStart:
        raise DemoFailed(f"daemon {host} did not start; see {paths.daemon_log}") from None


def _audit_session(own: contextlib.ExitStack, fleet: Fleet) -> SparkSession:
    """The fleet audit's session on the cluster, stopped with ``own`` (if the audit has
    not stopped it already)."""
    from pydory.pipeline.spark import spark_session

    session = spark_session(
        master=_started(fleet.spark).master_url, app_name="pydory-demo", conf=SPARK_CONF
    )
    own.callback(session.stop)
    return session


def _kill_if_running(job: LandingJob) -> None:
    if job.process.poll() is None:
        job.kill()
