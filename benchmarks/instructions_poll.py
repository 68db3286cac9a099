"""One tree's compiled producer summing N acknowledgements through ``poll()``, against
librdkafka's mock cluster (8 partitions, linger 100 ms): the cost per acknowledgement of
``Producer_poll`` under callgrind, a count the machine's load does not move. Not a test.

    valgrind --tool=callgrind --toggle-collect=Producer_poll --callgrind-out-file=OUT \
        .venv/bin/python benchmarks/instructions_poll.py /tmp/pydory-base/src 100000

"Collected" / N = instructions per acknowledgement (issue 30: aa48e33 640-643, 549f3cf
675-684, with the per-event topic handle 638-642).
"""

import sys

source, count = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, source)

from pydory import _cproducer  # noqa: E402
from pydory.daemon.delivery import compiled_producer  # noqa: E402
from pydory_tools.testing.mock_cluster import MockCluster  # noqa: E402

if hasattr(compiled_producer, "bind"):  # after issue 30
    compiled_producer.bind()
else:  # aa48e33
    _cproducer.bind(str(compiled_producer.loaded_librdkafka()))

with MockCluster(3) as cluster:
    cluster.create_topic("t", 8)
    producer = _cproducer.Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": "100"}
    )
    value = b"v" * 100
    for i in range(count):
        while producer.produce("t", -1, value, None, 0, None, 1, i // 1000, False, None) != 0:
            producer.poll(0.01, False)  # queue full: serve reports first
    acknowledged = 0
    while acknowledged < count:
        polled = producer.poll(0.05, False)
        if polled is not None:
            acknowledged += sum(each[2] for each in polled[0])  # (token, topic, count, bytes)
    producer.close()
print("acknowledged", acknowledged)
