"""From config to librdkafka properties: every property pydory sets is listed
(pydory.config.librdkafka) and documented (docs/librdkafka-mapping.md), and a <librdkafka>
property pydory owns is refused by the settings as well as by the loader."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pydory.config import Config, load_config, parse_config
from pydory.config.librdkafka import (
    DEFAULTED_LIBRDKAFKA_PROPERTIES,
    OWNED_LIBRDKAFKA_PROPERTIES,
    librdkafka_property_problem,
)
from pydory.daemon.delivery.librdkafka_settings import (
    DeliverySettings,
    ProducerProfile,
    delivery_settings,
    producer_profile,
    producer_properties,
)
from pydory.errors import ConfigError

ROOT = Path(__file__).parents[1]
MAPPING_DOC = ROOT / "docs" / "librdkafka-mapping.md"
SHIPPED = ROOT / "docs" / "pydory.sample.xml"
DORY_SAMPLE = ROOT.parent / "shared" / "compat" / "dory_conf.xml"
#: Set beside the settings, on the same dictionary: ProducerHandle's statistics callback.
PRODUCER_CALLBACKS = {"stats_cb"}

#: Every branch of the mapping: per-topic batching, batching disabled, compression with
#: a level and without, a codec switched off by minSize, the spool with backpressure.
EVERY_BRANCH = """<?xml version="1.0" encoding="US-ASCII"?>
<doryConfig>
    <batching>
        <namedConfigs>
            <config name="fast">
                <time value="10" />
                <messages value="disable" />
                <bytes value="64k" />
            </config>
            <config name="slow">
                <time value="disable" />
                <messages value="100" />
                <bytes value="disable" />
            </config>
        </namedConfigs>
        <produceRequestDataLimit value="1024k" />
        <messageMaxBytes value="1000000" />
        <combinedTopics enable="true" config="fast" />
        <defaultTopic action="combinedTopics" />
        <topicConfigs>
            <topic name="slow" action="perTopic" config="slow" />
            <topic name="raw" action="disable" />
        </topicConfigs>
    </batching>
    <compression>
        <namedConfigs>
            <config name="plain" type="none" />
            <config name="small" type="zstd" minSize="1k" level="12" />
            <config name="huge" type="gzip" minSize="10m" />
        </namedConfigs>
        <defaultTopic config="plain" />
        <topicConfigs>
            <topic name="slow" config="small" />
            <topic name="raw" config="huge" />
        </topicConfigs>
    </compression>
    <spool enable="true">
        <path value="/var/lib/pydory/spool" />
        <overloadPolicy value="backpressure" />
    </spool>
    <librdkafka>
        <property name="message.timeout.ms" value="120000" />
        <property name="security.protocol" value="SSL" />
    </librdkafka>
    <initialBrokers>
        <broker host="127.0.0.1" port="9092" />
    </initialBrokers>
</doryConfig>
"""


def topics_of(config: Config) -> set[str]:
    return {"any_topic", *config.batching.topic_configs, *config.compression.topic_configs}


def properties_set(config: Config) -> set[str]:
    """Every property name pydory gives any producer of ``config``, or the metadata
    client (the shared properties); the <librdkafka> section's own are the user's."""
    settings = dataclasses.replace(delivery_settings(config), extra={})
    names = set(settings.properties()) | PRODUCER_CALLBACKS
    for topic in topics_of(config):
        profile = producer_profile(config, topic)
        names |= set(producer_properties(settings, profile, statistics=True))
    return names


def configs() -> list[object]:
    found = [
        pytest.param(parse_config(EVERY_BRANCH), id="every-branch"),
        pytest.param(load_config(SHIPPED), id="pydory.sample.xml"),
    ]
    if DORY_SAMPLE.exists():  # Dory's own sample, beside the checkout
        found.append(pytest.param(load_config(DORY_SAMPLE), id="dory_conf.xml"))
    return found


def test_the_configs_reach_every_branch() -> None:
    config = parse_config(EVERY_BRANCH)
    profiles = {topic: producer_profile(config, topic) for topic in topics_of(config)}
    assert profiles["raw"] == ProducerProfile(0, 1, 1_000_000, "none", None)
    assert profiles["slow"] == ProducerProfile(10_000, 100, 1_000_000, "zstd", 12)
    assert profiles["any_topic"].compression == "none"
    shared = delivery_settings(config)
    assert shared.queue_max_bytes > config.input_config.max_buffer  # held overshoot
    properties = producer_properties(shared, profiles["slow"], statistics=True)
    assert properties["message.timeout.ms"] == "120000"  # <librdkafka> has the last word
    assert properties["security.protocol"] == "SSL"
    assert "compression.level" in properties


@pytest.mark.parametrize("config", configs())
def test_every_property_pydory_sets_is_listed(config: Config) -> None:
    unlisted = {
        name
        for name in properties_set(config)
        if name not in OWNED_LIBRDKAFKA_PROPERTIES
        and name not in DEFAULTED_LIBRDKAFKA_PROPERTIES
        and librdkafka_property_problem(name) is None  # a callback is refused as one
    }
    assert unlisted == set()


@pytest.mark.parametrize("config", configs())
def test_every_property_pydory_sets_is_documented(config: Config) -> None:
    doc = MAPPING_DOC.read_text()
    assert {name for name in properties_set(config) if f"`{name}`" not in doc} == set()


def test_a_defaulted_property_is_the_users_to_set_and_an_owned_one_is_not() -> None:
    assert not set(DEFAULTED_LIBRDKAFKA_PROPERTIES) & set(OWNED_LIBRDKAFKA_PROPERTIES)
    assert all(librdkafka_property_problem(n) is None for n in DEFAULTED_LIBRDKAFKA_PROPERTIES)


@pytest.mark.parametrize("name", [*OWNED_LIBRDKAFKA_PROPERTIES, "stats_cb", "logger"])
def test_a_property_pydory_owns_is_refused_by_the_settings(name: str) -> None:
    """The loader refuses it first; a config built otherwise is refused all the same."""
    config = dataclasses.replace(parse_config(EVERY_BRANCH), librdkafka={name: "1"})
    for build in (
        lambda: delivery_settings(config),
        lambda: DeliverySettings("127.0.0.1:9092", extra={name: "1"}),
    ):
        with pytest.raises(ConfigError, match=rf"\[{name}\] cannot be set here") as info:
            build()
        assert info.value.path == "/doryConfig/librdkafka"
