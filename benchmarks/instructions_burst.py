"""One tree's compiled burst path, frame to acknowledgement, without the daemon around it:
N messages of 100 bytes framed (``StreamFramer.drain``), parsed (``hotpath.parse_burst``),
counted per topic (``burst_topics``), sent (``produce_burst``, an identity run's headers)
and acknowledged (``poll``, as the dispatcher polls after each burst), in bursts of B,
against librdkafka's mock cluster. Under callgrind, a count the machine's load does not
move; start-up (imports, the cluster) is the same at every N, so the figure is the slope.
Not a test.

    for n in 20000 100000; do valgrind --tool=callgrind --separate-threads=yes \
        --callgrind-out-file=/tmp/burst-$n.%p .venv/bin/python \
        benchmarks/instructions_burst.py /tmp/pydory-head/src $n 64; done

(Ir(N2) - Ir(N1)) / (N2 - N1): per message, the calling thread's file (``-01``) for the
loop thread's share, all files for the process.
"""

import gc
import sys

source, count, burst_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, source)

from pydory import _cproducer, hotpath, wire  # noqa: E402
from pydory.daemon.delivery import compiled_producer  # noqa: E402
from pydory_tools.testing.mock_cluster import MockCluster  # noqa: E402

compiled_producer.bind()
# The collector as `pydory serve` sets it (commands/serve.py): start-up frozen, the young
# generation's threshold at 50,000.
gc.freeze()
gc.set_threshold(50_000, *gc.get_threshold()[1:])
TOPIC, PARTITIONS, MAX_DATA = "t", 8, 1 << 20
wire.validate_topic(TOPIC.encode())  # a legal topic: the parse finds it in the cache

with MockCluster(3) as cluster:
    cluster.create_topic(TOPIC, PARTITIONS)
    producer = _cproducer.Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "linger.ms": "100",
            "queue.buffering.max.messages": str(2 * count),
        }
    )
    framer = hotpath.StreamFramer(1 << 20)
    frame = wire.encode_any_partition(TOPIC, b"v" * 100, b"", 1_700_000_000_000)
    read = frame * burst_size
    acknowledged = sent = 0
    for burst in range(count // burst_size):
        framer.feed(read)
        frames = framer.drain()
        parsed = hotpath.parse_burst(frames)
        counts = _cproducer.burst_topics(parsed, MAX_DATA)
        assert counts == {TOPIC: (burst_size, 100 * burst_size)}, counts
        headers = ("pydory-id", b"host/0123456789abcdef/1/", sent)
        runs = [(burst % PARTITIONS, burst_size)]
        assert producer.produce_burst(parsed, headers, TOPIC, MAX_DATA, runs, burst) == []
        sent += burst_size
        del frames, parsed
        polled = producer.poll(0, False)
        if polled is not None:
            acknowledged += sum(each[2] for each in polled[0])
    while acknowledged < sent:
        polled = producer.poll(0.05, False)
        if polled is not None:
            acknowledged += sum(each[2] for each in polled[0])
    producer.close()
print("sent", sent, "acknowledged", acknowledged)
