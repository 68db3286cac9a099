"""The instructions the spool adds to a burst on the loop thread: what the intake does with
and without the write-ahead for ``BURSTS`` bursts of ``SIZE`` 100-byte messages, each
burst opened as one token and settled eight bursts later (as the burst path and the
ledger do). Run under
callgrind at two sizes (and at 0 bursts for the fixed part); the per-burst and
per-message parts are the solution of the two equations. Not a test.

    for size in 16 512; do for variant in off spool; do
      valgrind --tool=callgrind --callgrind-out-file=/tmp/s-$variant-$size \\
          .venv/bin/python benchmarks/instructions_spool.py src 2000 $size $variant
    done; done

``off``: no spool (the unspooled identity run and the commit point's token); ``spool``: a
real spool in a temporary directory (fsync every 1000 ms, the daemon's disk worker, 4 MiB
segments as the benchmark's), ``WriteAhead.begin_burst``/``open``/``end_burst``/``close``.
Kernel work (the write's copy into the page cache, the fsync) is not in callgrind's count:
``strace -c`` and ``perf stat`` (benchmarks/spool_per_read.py) count those.
"""

import collections
import sys
import tempfile

source, bursts, size, variant = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, source)

from pydory.daemon.books.commit_point import CommitPoint  # noqa: E402
from pydory.daemon.books.counters import Counters  # noqa: E402
from pydory.daemon.spool.disk_worker import DiskWorker  # noqa: E402
from pydory.daemon.spool.identity import MessageIds  # noqa: E402
from pydory.daemon.spool.segments import Spool  # noqa: E402
from pydory.daemon.spool.write_ahead import WriteAhead  # noqa: E402
from pydory.wire import encode_any_partition  # noqa: E402

message = encode_any_partition("bench.load", bytes(100 - 28 - len("bench.load")))
burst = [bytes(message) for _ in range(size)]
commit_point = CommitPoint(schedule=lambda delay, callback: True)
ids = MessageIds("bench-host", 1)
#: Bursts settled this many bursts after they were written (as acknowledgements come back
#: a few milliseconds later): the current segment is never empty, as under load.
LAG = 8
held: collections.deque[int] = collections.deque()

with tempfile.TemporaryDirectory(prefix="pydory-instructions-spool-") as directory:
    if variant == "off":
        for _ in range(bursts):
            headers = ids.unspooled_run(len(burst))
            held.append(commit_point.open(len(burst)))
            if len(held) > LAG:
                commit_point.close(held.popleft(), len(burst))
    else:
        worker = DiskWorker()
        spool = Spool(
            directory, segment_bytes=4 << 20, max_bytes=1 << 30, fsync_interval_ms=1000,
            disk_worker=worker,
        )  # fmt: skip
        spool.open()
        write_ahead = WriteAhead(commit_point, spool, Counters(), ids=ids)
        for _ in range(bursts):
            headers = write_ahead.begin_burst(burst)
            held.append(write_ahead.open(len(burst)))
            write_ahead.end_burst()
            if len(held) > LAG:
                write_ahead.close(held.popleft(), len(burst))
        spool.close()
