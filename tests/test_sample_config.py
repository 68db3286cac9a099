"""The config pydory ships (docs/pydory.sample.xml): Dory's sample plus the spool, on.

Its paths are the systemd unit's directories (docs/systemd/pydory.service) instead of
Dory's /var/run/dory and /var/log/dory, and its status pages are on loopback only, on
port 8877 instead of Dory's 9090 (Prometheus's own).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from pydory.config import load_config, parse_config
from pydory.config.model import OverloadPolicy

ROOT = Path(__file__).parents[1]
SHIPPED = ROOT / "docs" / "pydory.sample.xml"
DORY_SAMPLE = Path(__file__).parent / "data" / "dory_conf.xml"
#: The sample's status port: not Prometheus's 9090 (docs/config.md, "<httpInterface>").
SAMPLE_STATUS_PORT = 8877


def test_the_shipped_config_loads_with_the_spool_on() -> None:
    config = load_config(SHIPPED)
    assert config.spool.path == "/var/lib/pydory/spool"
    assert config.spool.fsync_interval_ms == 1000
    assert config.spool.overload_policy is OverloadPolicy.DISCARD
    assert config.spool.max_bytes == 1024**3


def test_its_paths_are_the_units_directories() -> None:
    config = load_config(SHIPPED)
    assert config.inputs.unix_datagram.path == "/run/pydory/input_datagram_sock"
    assert config.logging.file_path == "/var/log/pydory/pydory.log"
    text = SHIPPED.read_text()
    assert "/run/pydory/input_stream_sock" in text  # off, as in Dory's sample
    assert "/var/log/pydory/discard.log" in text
    assert "/var/log/pydory/msg-debug" in text


def test_its_status_pages_are_on_loopback_and_off_prometheuss_port() -> None:
    """The pages have no authentication: the sample keeps them on this host (a user widens
    them on purpose), on a port Prometheus (9090) does not use (issue 23, item 14)."""
    http = load_config(SHIPPED).http
    assert http.loopback_only is True
    assert http.port == SAMPLE_STATUS_PORT
    assert http.port != 9090


def test_a_config_without_the_elements_keeps_dorys_defaults() -> None:
    """The sample's choices are the sample's: a config that omits them gets Dory's."""
    without = re.sub(r"<httpInterface>.*</httpInterface>", "", SHIPPED.read_text(), flags=re.S)
    http = parse_config(without, source="<sample without httpInterface>").http
    assert (http.port, http.loopback_only) == (9090, False)


def test_apart_from_the_spool_the_paths_and_the_status_port_it_is_dorys_sample() -> None:
    shipped, dory = load_config(SHIPPED), load_config(DORY_SAMPLE)
    assert dory.spool.path is None
    assert dory.inputs.unix_datagram.path == "/var/run/dory/input_datagram_sock"
    assert dory.logging.file_path == "/var/log/dory/dory.log"
    assert (dory.http.port, dory.http.loopback_only) == (9090, False)
    with_dorys_paths = dataclasses.replace(
        shipped,
        http=dory.http,
        spool=dory.spool,
        inputs=dataclasses.replace(
            shipped.inputs,
            unix_datagram=dataclasses.replace(
                shipped.inputs.unix_datagram, path=dory.inputs.unix_datagram.path
            ),
        ),
        logging=dataclasses.replace(shipped.logging, file_path=dory.logging.file_path),
    )
    assert with_dorys_paths == dory
