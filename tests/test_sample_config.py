"""The config pydory ships (docs/pydory.sample.xml): Dory's sample plus the spool, on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pydory.config import load_config
from pydory.config.model import OverloadPolicy

ROOT = Path(__file__).parents[1]
SHIPPED = ROOT / "docs" / "pydory.sample.xml"
DORY_SAMPLE = Path(__file__).parent / "data" / "dory_conf.xml"


def test_the_shipped_config_loads_with_the_spool_on() -> None:
    config = load_config(SHIPPED)
    assert config.spool.path == "/var/lib/pydory/spool"
    assert config.spool.fsync_interval_ms == 1000
    assert config.spool.overload_policy is OverloadPolicy.DISCARD
    assert config.spool.max_bytes == 1024**3


def test_apart_from_the_spool_it_is_dorys_sample() -> None:
    shipped, dory = load_config(SHIPPED), load_config(DORY_SAMPLE)
    assert dory.spool.path is None
    assert dataclasses.replace(shipped, spool=dory.spool) == dory
