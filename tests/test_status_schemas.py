"""Every JSON page has a JSON Schema in docs/schemas/; Dory's real outputs and a live
daemon's pages both validate against it.

Dory's samples passing is what shows that scripts written against Dory's pages keep
working on pydory's; the live pages passing shows pydory serves what the schemas promise.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator, FormatChecker, ValidationError

from pydory.client import DatagramSender
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.mock_cluster import MockCluster
from test_status import fetch, port_of, request_metadata_update, send_good_and_bad, wait_until

SCHEMAS = Path(__file__).parents[1] / "docs" / "schemas"
SAMPLES = Path(__file__).parent / "data" / "dory_http_samples"

#: JSON page -> the Dory 3.2.6 outputs of it we have.
DORY_SAMPLES = {
    "server_info": ["mock_nc_server_info_json.txt"],
    "counters": ["mock_counters_json_excerpt.txt"],
    "discards": ["mock_discards_json.txt", "tansu_discards_json.txt"],
    "metadata_fetch_time": ["mock_nc_metadata_fetch_time_json.txt"],
    "queues": ["tansu_queues_json.txt"],
}
#: Every JSON document the daemon serves, by schema name -> URL.
LIVE_PAGES = {
    "server_info": "/server_info/json",
    "counters": "/counters/json",
    "discards": "/discards/json",
    "metadata_fetch_time": "/metadata_fetch_time/json",
    "queues": "/queues/json",
    "books": "/books/json",
    "dashboard": "/dashboard/json",
    "config": "/config/json",
}


def validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    return Draft202012Validator(schema, format_checker=FormatChecker())


def dory_sample(file_name: str) -> dict[str, Any]:
    return json.loads((SAMPLES / file_name).read_text())  # type: ignore[no-any-return]


# --- the schemas themselves ----------------------------------------------------------------


def test_every_schema_is_valid_draft_2020_12() -> None:
    names = sorted(path.name.removesuffix(".schema.json") for path in SCHEMAS.glob("*.json"))
    assert set(LIVE_PAGES) <= set(names)
    for name in names:
        schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        Draft202012Validator.check_schema(schema)


# --- Dory's outputs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "file_name"),
    [(name, file_name) for name, files in DORY_SAMPLES.items() for file_name in files],
)
def test_dorys_output_validates(name: str, file_name: str) -> None:
    validator(name).validate(dory_sample(file_name))


def _without_each_key(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for key in document:
        broken = copy.deepcopy(document)
        del broken[key]
        yield key, broken


@pytest.mark.parametrize("name", sorted(DORY_SAMPLES))
def test_a_document_missing_any_of_dorys_keys_is_rejected(name: str) -> None:
    sample = dory_sample(DORY_SAMPLES[name][0])
    for key, broken in _without_each_key(sample):
        with pytest.raises(ValidationError, match=repr(key)):
            validator(name).validate(broken)


def test_wrong_types_and_unknown_keys_are_rejected() -> None:
    queues = dory_sample("tansu_queues_json.txt")
    for mutate in (
        lambda d: d["sending"][0].update(ack_wait="24"),
        lambda d: d.update(new=-1),
        lambda d: d.update(surprise=1),
        lambda d: d["sending"][0].pop("topic"),
    ):
        broken = copy.deepcopy(queues)
        mutate(broken)
        with pytest.raises(ValidationError):
            validator("queues").validate(broken)
    discards = dory_sample("mock_discards_json.txt")
    discards["unfinished_report"]["discard_topic"][0]["count"] = 1.5
    with pytest.raises(ValidationError):
        validator("discards").validate(discards)


# --- a live daemon -------------------------------------------------------------------------


@pytest.fixture
def topic(mock_cluster: MockCluster, unique_topic: Callable[[str], str]) -> str:
    name = unique_topic("schemas")
    mock_cluster.create_topic(name, 2)
    return name


@pytest.fixture
def daemon(
    mock_cluster: MockCluster, tmp_path_factory: pytest.TempPathFactory, topic: str
) -> Iterator[RunningDaemon]:
    # A 1-second discard report period, so that a finished report appears too.
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        str(tmp_path_factory.mktemp("s", numbered=True)),
        message_max_bytes=2000,
        discard_report_interval_s=1,
    )
    with running_daemon(config) as running:
        yield running


@pytest.mark.slow
def test_every_live_json_page_validates(
    daemon: RunningDaemon, mock_cluster: MockCluster, topic: str
) -> None:
    port = port_of(daemon)
    send_good_and_bad(daemon, topic)  # fills the discard lists, counters and books
    with DatagramSender(daemon.daemon_config.datagram_path) as sender:
        for i in range(20):
            sender.send(topic, b"more-%d" % i)
    request_metadata_update(port)
    # A finished period holding this test's discards: every list of the report in use.
    wait_until(
        lambda: (
            fetch(port, "/discards/json").json().get("finished_report", {}).get("recent_malformed")
        ),
        what="a finished discard report period with malformed messages",
    )
    # Slow brokers: these wait for their ACK, so /queues lists the topic (Dory lists only
    # topics with messages held).
    for broker_id in mock_cluster.broker_ids:
        mock_cluster.set_rtt(broker_id, 3000)
    with DatagramSender(daemon.daemon_config.datagram_path) as sender:
        for i in range(20):
            sender.send(topic, b"held-%d" % i)
    wait_until(
        lambda: fetch(port, "/queues/json").json()["sending"],
        what="librdkafka's statistics listing the topic",
    )
    for broker_id in mock_cluster.broker_ids:
        mock_cluster.set_rtt(broker_id, 0)
    for name, url in LIVE_PAGES.items():
        reply = fetch(port, url)
        assert reply.status == 200, url
        validator(name).validate(reply.json())
