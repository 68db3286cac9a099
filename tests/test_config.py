"""The config loader: Dory's sample file, defaults, per-topic resolution, and every kind
of error it must refuse (one test per kind at least), with path, line and column."""

from __future__ import annotations

import dataclasses
import urllib.request
import xml.sax
import xml.sax.saxutils
import xml.sax.xmlreader
from pathlib import Path
from typing import Any

import pytest

from pydory.config import (
    BatchingAction,
    BatchingThresholds,
    Broker,
    CompressionType,
    Config,
    ConfigError,
    ConfigErrors,
    LogLevel,
    load_config,
    parse_config,
)
from pydory.config.model import (
    ClientRate,
    ListenerQuotas,
    OverloadPolicy,
    QuotasConfig,
    SpoolConfig,
)
from pydory.config.xmltree import MAX_CONFIG_BYTES, MAX_DEPTH, MAX_ELEMENTS, parse_xml
from pydory.errors import MAX_REPORTED_ERRORS

SAMPLE = Path(__file__).parent / "data" / "dory_conf.xml"

MINIMAL = """<?xml version="1.0" encoding="US-ASCII"?>
<doryConfig>
    <batching>
        <namedConfigs>
            <config name="fast">
                <time value="10" />
                <messages value="disable" />
                <bytes value="64k" />
            </config>
        </namedConfigs>
        <produceRequestDataLimit value="1024k" />
        <messageMaxBytes value="1000000" />
        <combinedTopics enable="true" config="fast" />
        <defaultTopic action="combinedTopics" />
    </batching>
    <compression>
        <namedConfigs>
            <config name="plain" type="none" />
        </namedConfigs>
        <defaultTopic config="plain" />
    </compression>
    <initialBrokers>
        <broker host="127.0.0.1" port="9092" />
    </initialBrokers>
</doryConfig>
"""


def replaced(old: str, new: str, text: str = MINIMAL) -> str:
    """``text`` with ``old`` (which must occur) replaced by ``new``."""
    assert old in text
    return text.replace(old, new)


def with_section(section: str) -> str:
    """MINIMAL with an extra top-level section before <initialBrokers>."""
    return replaced("    <initialBrokers>", f"{section}\n    <initialBrokers>")


def errors_of(text: str) -> list[ConfigError]:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    error = info.value
    return error.errors if isinstance(error, ConfigErrors) else [error]


def the_error(text: str) -> ConfigError:
    errors = errors_of(text)
    assert len(errors) == 1, [str(e) for e in errors]
    return errors[0]


def position_of(text: str, needle: str) -> tuple[int, int]:
    """(line, 1-based column) of the '<' of the tag on the line holding ``needle``."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number, line.index("<") + 1
    raise AssertionError(f"{needle!r} not in text")


# --- Dory's sample file ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample() -> Config:
    return load_config(SAMPLE)


def test_sample_batching(sample: Config) -> None:
    batching = sample.batching
    assert batching.named_configs["low_latency"] == BatchingThresholds(500, None, 262144)
    assert batching.named_configs["default_latency"] == BatchingThresholds(10000, None, 256 * 1024)
    assert batching.produce_request_data_limit == 1048576
    assert batching.message_max_bytes == 1000000
    assert batching.combined_topics_enabled is True
    assert batching.combined_topics_config == "default_latency"
    assert dict(batching.topic_configs) == {}  # the sample's topic entries are commented out
    default = sample.batching_for("any_topic")
    assert default.action is BatchingAction.COMBINED
    assert default.thresholds == BatchingThresholds(10000, None, 262144)


def test_sample_compression(sample: Config) -> None:
    compression = sample.compression
    assert compression.size_threshold_percent == 75
    assert set(compression.named_configs) == {"snappy_config", "gzip_config", "no_compression"}
    gzip = compression.named_configs["gzip_config"]
    assert (gzip.type, gzip.min_size, gzip.level) == (CompressionType.GZIP, 128, 3)
    none = compression.named_configs["no_compression"]
    assert (none.type, none.min_size, none.level) == (CompressionType.NONE, 0, None)
    codec = sample.compression_for("any_topic")
    assert (codec.name, codec.type, codec.min_size) == (
        "snappy_config",
        CompressionType.SNAPPY,
        128,
    )


def test_sample_rate_limiting(sample: Config) -> None:
    named = sample.rate_limiting.named_configs
    assert (named["zero"].interval_ms, named["zero"].max_count) == (1, 0)
    assert named["infinity"].max_count is None
    assert named["infinity"].unlimited
    assert (named["config1"].interval_ms, named["config1"].max_count) == (10000, 1000)
    assert (named["config2"].interval_ms, named["config2"].max_count) == (15000, 4096)
    assert sample.rate_limit_for("any_topic").name == "infinity"


def test_sample_inputs(sample: Config) -> None:
    inputs = sample.inputs
    assert inputs.unix_datagram.path == "/var/run/dory/input_datagram_sock"
    assert inputs.unix_datagram.mode == 0o222
    assert inputs.unix_stream.path is None  # enable="false"
    assert inputs.unix_stream.mode == 0o222
    assert inputs.tcp.port is None  # enable="false", port 9000
    assert sample.input_config.max_buffer == 128 * 1024 * 1024
    assert sample.input_config.max_datagram_msg_size == 64 * 1024
    assert sample.input_config.allow_large_unix_datagrams is False
    assert sample.input_config.max_stream_msg_size == 16 * 1024 * 1024


def test_sample_delivery_http_kafka(sample: Config) -> None:
    delivery = sample.delivery
    assert delivery.topic_autocreate is False
    assert delivery.max_failed_delivery_attempts == 5
    assert delivery.shutdown_max_delay_ms == 30000
    assert delivery.dispatcher_restart_max_delay_ms == 5000
    assert delivery.metadata_refresh_interval_min == 15
    assert delivery.compare_metadata_on_refresh is True
    assert delivery.kafka_socket_timeout_s == 60
    assert delivery.pause_rate_limit_initial_ms == 5000
    assert delivery.pause_rate_limit_max_double == 4
    assert delivery.min_pause_delay_ms == 5000
    assert sample.http.port == 9090
    assert sample.http.loopback_only is False
    assert sample.http.discard_report_interval_s == 600
    assert sample.http.bad_msg_prefix_size == 256
    assert (sample.kafka.client_id, sample.kafka.replication_timeout_ms) == ("dory", 10000)


def test_sample_discard_logging_msg_debug_logging(sample: Config) -> None:
    assert sample.discard_logging.path is None  # enable="false"
    assert sample.discard_logging.max_file_size == 32 * 1024 * 1024
    assert sample.discard_logging.max_archive_size == 256 * 1024 * 1024
    assert sample.discard_logging.max_msg_prefix_size == 2048
    assert sample.msg_debug.path is None
    assert sample.msg_debug.time_limit_s == 3600
    assert sample.msg_debug.byte_limit == 2048 * 1024 * 1024
    logging = sample.logging
    assert logging.level is LogLevel.NOTICE
    assert (logging.stdout_stderr, logging.syslog, logging.log_discards) == (False, False, True)
    assert (logging.file_path, logging.file_mode) == ("/var/log/dory/dory.log", 0o644)


def test_sample_brokers(sample: Config) -> None:
    assert sample.initial_brokers == (Broker("broker_host_1", 9092), Broker("broker_host_2", 9092))
    assert sample.bootstrap_servers == "broker_host_1:9092,broker_host_2:9092"
    assert dict(sample.librdkafka) == {}


def test_bytes_and_str_give_the_same_config() -> None:
    text = SAMPLE.read_text(encoding="ascii")
    assert parse_config(text) == parse_config(text.encode("ascii")) == load_config(SAMPLE)


def test_config_is_immutable(sample: Config) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.http = sample.http  # type: ignore[misc]
    with pytest.raises(TypeError):
        sample.batching.named_configs["x"] = BatchingThresholds(1, 1, 1)  # type: ignore[index]


# --- defaults and value syntax ----------------------------------------------------------------


def test_omitted_sections_take_dorys_defaults() -> None:
    config = parse_config(MINIMAL)
    assert config.http.port == 9090
    assert config.http.discard_report_interval_s == 600
    assert config.http.bad_msg_prefix_size == 256
    assert config.logging.level is LogLevel.NOTICE
    assert (config.logging.syslog, config.logging.stdout_stderr) == (True, False)
    assert config.logging.file_path is None
    assert config.rate_limit_for("t").unlimited
    assert not config.inputs.unix_datagram.enabled
    assert not config.inputs.unix_stream.enabled
    assert not config.inputs.tcp.enabled
    assert config.input_config.max_buffer == 16 * 1024 * 1024
    assert config.input_config.max_datagram_msg_size == 64 * 1024
    assert config.input_config.max_stream_msg_size == 2 * 1024 * 1024
    assert config.delivery.shutdown_max_delay_ms == 30000
    assert config.discard_logging.enabled is False
    assert config.kafka.client_id == "dory"
    assert config.compression.size_threshold_percent == 100


def test_size_and_count_suffixes() -> None:
    text = with_section("""
    <inputConfig>
        <maxBuffer value="3m" />
        <maxDatagramMsgSize value="2K" />
        <maxStreamMsgSize value="1048576" />
    </inputConfig>""")
    text = replaced('<messages value="disable" />', '<messages value="10k" />', text)
    config = parse_config(text)
    assert config.input_config.max_buffer == 3 * 1024 * 1024
    assert config.input_config.max_datagram_msg_size == 2048
    assert config.input_config.max_stream_msg_size == 1048576
    assert config.batching.named_configs["fast"].messages == 10 * 1024


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("0644", 0o644), ("0222", 0o222), ("0", 0), ("0b110100100", 0o644), ("0B111", 0o7)],
)
def test_octal_and_binary_modes(mode: str, expected: int) -> None:
    config = parse_config(socket_section(mode=mode))
    assert config.inputs.unix_stream.mode == expected


def test_unspecified_mode_means_umask() -> None:
    config = parse_config(socket_section(mode="unspecified"))
    assert config.inputs.unix_stream.mode is None


def test_empty_path_and_empty_port_turn_inputs_off() -> None:
    config = parse_config(socket_section(path=""))
    assert config.inputs.unix_stream.path is None
    config = parse_config(socket_section(port=""))
    assert config.inputs.tcp.port is None


def test_an_input_section_that_enables_nothing_is_refused_as_dory_does() -> None:
    """Dory (conf.cc, TNoInputSource): "Input sources config must enable at least one of
    {unixDatagram, unixStream, tcp}"."""
    error = the_error(socket_section(path="", port=""))
    assert error.reason == (
        "Input sources config must enable at least one of {unixDatagram, unixStream, tcp}"
    )
    assert error.path == "/doryConfig/inputSources"
    disabled = with_section("""
    <inputSources>
        <unixDatagram enable="false"><path value="/run/d" /></unixDatagram>
        <unixStream enable="false"><path value="/run/s" /></unixStream>
        <tcp enable="false"><port value="9000" /></tcp>
    </inputSources>""")
    assert the_error(disabled).reason.startswith("Input sources config must enable")


def test_enabled_inputs() -> None:
    config = parse_config(socket_section(path="/run/pydory.sock", port="9000"))
    assert config.inputs.unix_stream.path == "/run/pydory.sock"
    assert config.inputs.tcp.port == 9000


def socket_section(path: str = "/run/s", mode: str = "0600", port: str = "9000") -> str:
    return with_section(f"""
    <inputSources>
        <unixStream enable="true">
            <path value="{path}" />
            <mode value="{mode}" />
        </unixStream>
        <tcp enable="true">
            <port value="{port}" />
        </tcp>
    </inputSources>""")


# --- per-topic resolution ---------------------------------------------------------------------


OVERRIDES = replaced(
    "    </batching>",
    """        <topicConfigs>
            <topic name="urgent" action="perTopic" config="instant" />
            <topic name="raw" action="disable" />
            <topic name="mixed" action="combinedTopics" config="" />
        </topicConfigs>
    </batching>""",
    replaced(
        "        </namedConfigs>\n        <produceRequestDataLimit",
        """            <config name="instant">
                <time value="0" />
                <messages value="1" />
                <bytes value="disable" />
            </config>
        </namedConfigs>
        <produceRequestDataLimit""",
    ),
)


def test_batching_overrides_resolve_named_configs() -> None:
    config = parse_config(OVERRIDES)
    urgent = config.batching_for("urgent")
    assert urgent.action is BatchingAction.PER_TOPIC
    assert urgent.thresholds == BatchingThresholds(0, 1, None)
    assert urgent.config_name == "instant"
    assert config.batching_for("raw").action is BatchingAction.DISABLE
    assert config.batching_for("raw").thresholds is None
    assert config.batching_for("mixed") == config.batching_for("not_listed")
    assert config.batching_for("mixed").thresholds == BatchingThresholds(10, None, 65536)


def test_combined_topics_disabled_means_no_batching_for_combined_topics() -> None:
    text = replaced(
        '<combinedTopics enable="true" config="fast" />', '<combinedTopics enable="false" />'
    )
    config = parse_config(text)
    assert config.batching.combined_topics_enabled is False
    assert config.batching_for("t").action is BatchingAction.DISABLE


def test_compression_and_rate_limit_overrides() -> None:
    text = replaced(
        '        </namedConfigs>\n        <defaultTopic config="plain" />',
        """            <config name="small" type="zstd" minSize="1k" level="12" />
            <config name="fast" type="LZ4" minSize="0" level="-1" />
        </namedConfigs>
        <defaultTopic config="plain" />
        <topicConfigs>
            <topic name="logs" config="small" />
            <topic name="metrics" config="fast" />
        </topicConfigs>""",
    )
    text = replaced(
        "    <initialBrokers>",
        """    <topicRateLimiting>
        <namedConfigs>
            <config name="free" maxCount="unlimited" />
            <config name="tight" interval="1000" maxCount="2k" />
        </namedConfigs>
        <defaultTopic config="free" />
        <topicConfigs>
            <topic name="noisy" config="tight" />
        </topicConfigs>
    </topicRateLimiting>
    <initialBrokers>""",
        text,
    )
    config = parse_config(text)
    logs = config.compression_for("logs")
    assert (logs.type, logs.min_size, logs.level) == (CompressionType.ZSTD, 1024, 12)
    metrics = config.compression_for("metrics")
    assert (metrics.type, metrics.level) == (CompressionType.LZ4, None)  # -1 = codec default
    assert config.compression_for("other").type is CompressionType.NONE
    assert (
        config.rate_limit_for("noisy").interval_ms,
        config.rate_limit_for("noisy").max_count,
    ) == (
        1000,
        2048,
    )
    assert config.rate_limit_for("quiet").unlimited


def test_librdkafka_properties() -> None:
    config = parse_config(
        with_section("""
    <librdkafka>
        <property name="security.protocol" value="SSL" />
        <property name="ssl.ca.location" value="/etc/ssl/certs/ca.pem" />
    </librdkafka>""")
    )
    assert dict(config.librdkafka) == {
        "security.protocol": "SSL",
        "ssl.ca.location": "/etc/ssl/certs/ca.pem",
    }


def test_bootstrap_servers_brackets_ipv6_and_defaults_port() -> None:
    text = replaced(
        '<broker host="127.0.0.1" port="9092" />',
        '<broker host="::1" port="9093" />\n        <broker host="kafka1" />',
    )
    assert parse_config(text).bootstrap_servers == "[::1]:9093,kafka1:9092"


# --- errors: one test per kind ----------------------------------------------------------------


def test_error_names_path_line_and_column_in_dorys_format() -> None:
    text = replaced('<messageMaxBytes value="1000000" />', '<messageMaxBytes value="12x" />')
    error = the_error(text)
    line, column = position_of(text, "messageMaxBytes")
    assert (error.path, error.line, error.column) == (
        "/doryConfig/batching/messageMaxBytes",
        line,
        column,
    )
    assert str(error) == (
        f"Error in config file: (line {line}, column {column}) "
        f"/doryConfig/batching/messageMaxBytes: {error.reason}"
    )


def test_unknown_element() -> None:
    text = replaced("<messageMaxBytes", "<bogus />\n        <messageMaxBytes")
    error = the_error(text)
    assert error.reason.startswith("Unknown element [bogus]")
    assert error.path == "/doryConfig/batching/bogus"
    assert error.line == position_of(text, "bogus")[0]


def test_unknown_top_level_section() -> None:
    error = the_error(with_section("    <kafka />"))
    assert error.reason.startswith("Unknown element [kafka]")


def test_unknown_attribute_is_ignored_with_a_warning_as_dory_ignores_it() -> None:
    """Dory reads the attributes it knows and never looks at others (TAttrReader)."""
    text = replaced(
        '<messageMaxBytes value="1000000" />', '<messageMaxBytes value="1000000" unit="b" />'
    )
    config = parse_config(text)
    assert config.batching.message_max_bytes == 1_000_000
    line, column = position_of(text, "messageMaxBytes")
    assert config.warnings == (
        f"Warning in config file: (line {line}, column {column}) "
        "/doryConfig/batching/messageMaxBytes: Unknown attribute [unit]: expected one of: "
        "value; ignored, as Dory ignores it",
    )
    assert config == parse_config(MINIMAL)  # warnings aside, the same config


def test_unknown_attribute_on_a_container_is_ignored_with_a_warning() -> None:
    config = parse_config(MINIMAL.replace("<namedConfigs>", '<namedConfigs kind="x">', 1))
    assert len(config.warnings) == 1
    assert "/doryConfig/batching/namedConfigs: Unknown attribute [kind]" in config.warnings[0]


def test_what_dory_accepts_loads() -> None:
    """Issue 22: a rack on a broker, any extra attribute on <maxBuffer>, syslog's three
    most severe levels, gzip level 10 all load in Dory 3.2.6; so they do here."""
    text = replaced(
        '<broker host="127.0.0.1" port="9092" />',
        '<broker host="127.0.0.1" port="9092" rack="r1" />',
    )
    text = replaced(
        "    <initialBrokers>",
        """    <inputConfig>
        <maxBuffer value="1m" comment="one megabyte" />
    </inputConfig>
    <initialBrokers>""",
        text,
    )
    text = replaced(
        '<config name="plain" type="none" />',
        '<config name="plain" type="gzip" minSize="0" level="10" />',
        text,
    )
    config = parse_config(text)
    assert config.initial_brokers == (Broker("127.0.0.1", 9092),)
    assert config.input_config.max_buffer == 1024 * 1024
    assert config.compression.default_topic.level is None  # zlib's default, as Dory's gzip codec
    assert [w.split(") ", 1)[1].split(": ", 1)[0] for w in config.warnings] == [
        "/doryConfig/compression/namedConfigs/config[@name=plain]",
        "/doryConfig/inputConfig/maxBuffer",
        "/doryConfig/initialBrokers/broker",
    ]
    for level in ("EMERG", "ALERT", "CRIT"):
        logging_section = f'    <logging>\n        <level value="{level}" />\n    </logging>'
        config = parse_config(with_section(logging_section))
        assert config.logging.level is LogLevel(level)
        assert config.warnings == ()


def test_an_unknown_attribute_in_pydorys_own_sections_is_still_an_error() -> None:
    """Dory never reads <spool>, <quotas> or <librdkafka>: nothing there is Dory's to
    ignore, and a typo must not pass silently."""
    text = with_section(
        '    <spool enable="false" fsynch="always">\n        <path value="" />\n    </spool>'
    )
    error = the_error(text)
    assert error.reason.startswith("Unknown attribute [fsynch]")
    assert error.path == "/doryConfig/spool"


def test_http_port_0_is_refused_as_dory_does() -> None:
    """Dory: "HTTP interface port must be > 0"."""
    text = with_section('    <httpInterface>\n        <port value="0" />\n    </httpInterface>')
    error = the_error(text)
    assert error.path == "/doryConfig/httpInterface/port"
    assert "at least 1" in error.reason


def test_max_unknown_topics_defaults_to_a_thousand_and_may_be_set_or_refused() -> None:
    """pydory's bound on the records kept for topic names Kafka does not have (issue 21)."""
    assert parse_config(MINIMAL).http.max_unknown_topics == 1000
    text = with_section(
        '    <httpInterface>\n        <maxUnknownTopics value="0" />\n    </httpInterface>'
    )
    assert parse_config(text).http.max_unknown_topics == 0
    error = the_error(text.replace('value="0"', 'value="1000001"'))
    assert error.path == "/doryConfig/httpInterface/maxUnknownTopics"
    assert "at most 1000000" in error.reason


@pytest.mark.parametrize("value", ["12x3", "1.5", "-1", "0x10", "1_000", "+5"])
def test_malformed_number(value: str) -> None:
    error = the_error(
        replaced('<messageMaxBytes value="1000000" />', f'<messageMaxBytes value="{value}" />')
    )
    assert "Invalid number" in error.reason
    assert f"[{value}]" in error.reason


def test_bad_suffix() -> None:
    # time values take no suffix (Dory: "you must specify integer values directly")
    error = the_error(replaced('<time value="10" />', '<time value="10k" />'))
    assert "Suffix [k] not allowed" in error.reason
    assert error.path == "/doryConfig/batching/namedConfigs/config[@name=fast]/time"
    error = the_error(replaced('<bytes value="64k" />', '<bytes value="1g" />'))
    assert "Suffix [g] not allowed" in error.reason


@pytest.mark.parametrize(
    ("section", "path", "limit"),
    [
        (
            '<httpInterface><port value="70000" /></httpInterface>',
            "/doryConfig/httpInterface/port",
            "at most 65535",
        ),
        (
            '<inputSources><tcp enable="true"><port value="65536" /></tcp></inputSources>',
            "/doryConfig/inputSources/tcp/port",
            "at most 65535",
        ),
        (
            '<msgDelivery><kafkaSocketTimeout value="0" /></msgDelivery>',
            "/doryConfig/msgDelivery/kafkaSocketTimeout",
            "at least 1",
        ),
    ],
)
def test_out_of_range_values(section: str, path: str, limit: str) -> None:
    error = the_error(with_section(section))
    assert "out of range" in error.reason
    assert limit in error.reason
    assert error.path == path


def test_size_threshold_percent_above_100() -> None:
    text = replaced(
        '<defaultTopic config="plain" />',
        '<sizeThresholdPercent value="101" />\n<defaultTopic config="plain" />',
    )
    error = the_error(text)
    assert error.path == "/doryConfig/compression/sizeThresholdPercent"
    assert "at most 100" in error.reason


@pytest.mark.parametrize("level", ["10", "12", "-2", "2147483647"])
def test_gzip_level_outside_zlibs_range_takes_the_default_with_a_warning(level: str) -> None:
    """Dory's gzip codec (GetRealCompressionLevel): a level outside 0..9 means zlib's
    default level."""
    text = replaced(
        '<config name="plain" type="none" />',
        f'<config name="plain" type="gzip" minSize="0" level="{level}" />',
    )
    config = parse_config(text)
    assert config.compression.default_topic.level is None
    assert f"gzip level [{level}] is outside zlib's 0..9" in config.warnings[0]


def test_a_level_that_is_no_integer_is_refused_as_dory_does() -> None:
    text = replaced(
        '<config name="plain" type="none" />',
        '<config name="plain" type="gzip" minSize="0" level="fast" />',
    )
    assert "[level]" in the_error(text).reason


@pytest.mark.parametrize(("codec", "level", "bound"), [("zstd", "13", "12"), ("lz4", "13", "12")])
def test_compression_level_out_of_range(codec: str, level: str, bound: str) -> None:
    text = replaced(
        '<config name="plain" type="none" />',
        f'<config name="plain" type="{codec}" minSize="0" level="{level}" />',
    )
    error = the_error(text)
    assert error.path == "/doryConfig/compression/namedConfigs/config[@name=plain]"
    assert "[level]" in error.reason
    assert bound in error.reason


def test_level_is_ignored_with_a_warning_for_codecs_without_levels() -> None:
    """Dory reads the level of any codec and uses it only for gzip."""
    text = replaced(
        '<config name="plain" type="none" />',
        '<config name="plain" type="snappy" minSize="0" level="3" />',
    )
    config = parse_config(text)
    assert config.compression.default_topic.level is None
    assert "Attribute [level] ignored for compression type snappy" in config.warnings[0]


def test_unknown_compression_type() -> None:
    text = replaced('type="none"', 'type="brotli" minSize="0"')
    assert "invalid compression type [brotli]" in the_error(text).reason


def test_missing_required_attribute_broker_host() -> None:
    text = replaced('<broker host="127.0.0.1" port="9092" />', '<broker port="9092" />')
    error = the_error(text)
    assert error.reason == "Missing required attribute [host]"
    assert error.path == "/doryConfig/initialBrokers/broker"


def test_missing_required_attribute_min_size() -> None:
    text = replaced('<config name="plain" type="none" />', '<config name="plain" type="gzip" />')
    assert "Missing required attribute [minSize]" in the_error(text).reason


def test_missing_required_element() -> None:
    error = the_error(replaced('        <messageMaxBytes value="1000000" />\n', ""))
    assert error.reason == "Missing required element [messageMaxBytes]"
    assert error.path == "/doryConfig/batching"


def test_missing_required_section() -> None:
    start = MINIMAL.index("    <initialBrokers>")
    end = MINIMAL.index("</initialBrokers>") + len("</initialBrokers>")
    error = the_error(MINIMAL[:start] + MINIMAL[end:])
    assert error.reason == "Missing required element [initialBrokers]"
    assert error.path == "/doryConfig"


def test_a_file_without_compression_loads_uncompressed_as_dorys_does() -> None:
    """Dory's conf.cc reads <compression> only when present (issue 33)."""
    start = MINIMAL.index("    <compression>")
    end = MINIMAL.index("    <initialBrokers>")
    config = parse_config(MINIMAL[:start] + MINIMAL[end:])
    assert config.compression_for("anything").type is CompressionType.NONE
    assert config.warnings == ()


def test_a_file_without_batching_loads_with_dorys_zero_limits_and_says_so() -> None:
    """Dory starts without <batching> and, its messageMaxBytes being 0, discards every
    message; pydory does the same, and says so (issue 33)."""
    start = MINIMAL.index("    <batching>")
    end = MINIMAL.index("    <compression>")
    config = parse_config(MINIMAL[:start] + MINIMAL[end:])
    assert config.batching.message_max_bytes == 0
    assert config.batching.produce_request_data_limit == 0
    assert len(config.warnings) == 1
    assert "No <batching> section" in config.warnings[0]
    assert "too_long" in config.warnings[0]


@pytest.mark.parametrize(
    ("old", "new", "path"),
    [
        (
            '<defaultTopic config="plain" />',
            '<defaultTopic config="snappy" />',
            "/doryConfig/compression/defaultTopic",
        ),
        (
            '<combinedTopics enable="true" config="fast" />',
            '<combinedTopics enable="true" config="slow" />',
            "/doryConfig/batching/combinedTopics",
        ),
        (
            '<defaultTopic action="combinedTopics" />',
            '<defaultTopic action="perTopic" config="slow" />',
            "/doryConfig/batching/defaultTopic",
        ),
    ],
)
def test_undefined_named_config_reference(old: str, new: str, path: str) -> None:
    error = the_error(replaced(old, new))
    assert "is not defined" in error.reason
    assert error.path == path


def test_undefined_rate_limit_reference_in_topic_configs() -> None:
    error = the_error(
        with_section("""
    <topicRateLimiting>
        <namedConfigs><config name="free" maxCount="unlimited" /></namedConfigs>
        <defaultTopic config="free" />
        <topicConfigs><topic name="t" config="nope" /></topicConfigs>
    </topicRateLimiting>""")
    )
    assert error.reason.startswith("Topic rate limiting config [nope] is not defined")
    assert error.path == "/doryConfig/topicRateLimiting/topicConfigs/topic[@name=t]"


def test_duplicate_named_config() -> None:
    text = replaced(
        '<config name="plain" type="none" />',
        '<config name="plain" type="none" />\n            <config name="plain" type="none" />',
    )
    error = the_error(text)
    assert error.reason == "Compression config contains duplicate named config: [plain]"
    assert error.line == position_of(text, "plain")[0] + 1


def test_all_three_batching_thresholds_disabled() -> None:
    text = replaced('<time value="10" />', '<time value="disable" />')
    text = replaced('<bytes value="64k" />', '<bytes value="disable" />', text)
    error = the_error(text)
    assert error.reason == (
        "Named batching config [fast] must specify at least one of {time, messages, bytes}"
    )
    assert error.path == "/doryConfig/batching/namedConfigs/config[@name=fast]"
    assert (error.line, error.column) == position_of(text, 'name="fast"')


def test_relative_socket_path() -> None:
    error = the_error(socket_section(path="run/s"))
    assert error.reason == "UNIX stream socket path must be absolute: [run/s]"
    assert error.path == "/doryConfig/inputSources/unixStream/path"


@pytest.mark.parametrize("mode", ["644", "0999", "0b102", "rw-r--r--", "01777", ""])
def test_bad_mode_string(mode: str) -> None:
    error = the_error(socket_section(mode=mode))
    assert error.path == "/doryConfig/inputSources/unixStream/mode"
    assert "mode" in error.reason.lower()


@pytest.mark.parametrize("element", ["produceRequestDataLimit", "messageMaxBytes"])
def test_disable_where_not_allowed(element: str) -> None:
    text = MINIMAL
    for line in MINIMAL.splitlines():
        if f"<{element} " in line:
            text = replaced(line, f'        <{element} value="disable" />')
    error = the_error(text)
    assert error.reason.startswith(
        f"Bad value for attribute [value]: [disable] is not allowed for [{element}]"
    )


def test_combined_topics_action_with_a_config() -> None:
    error = the_error(
        replaced(
            '<defaultTopic action="combinedTopics" />',
            '<defaultTopic action="combinedTopics" config="fast" />',
        )
    )
    assert "must be missing or empty when action is combinedTopics" in error.reason
    assert error.path == "/doryConfig/batching/defaultTopic"


def test_per_topic_action_without_a_config() -> None:
    error = the_error(
        replaced('<defaultTopic action="combinedTopics" />', '<defaultTopic action="perTopic" />')
    )
    assert "must name a batching config" in error.reason


def test_bad_action() -> None:
    error = the_error(replaced('action="combinedTopics"', 'action="combined"'))
    assert "expected perTopic, combinedTopics or disable" in error.reason


@pytest.mark.parametrize("value", ["yes", "1", "", "on"])
def test_bad_boolean(value: str) -> None:
    error = the_error(
        replaced('<combinedTopics enable="true"', f'<combinedTopics enable="{value}"')
    )
    assert (
        error.reason
        == f"Bad value for attribute [enable]: Invalid boolean [{value}]: expected true or false"
    )


def test_no_initial_brokers() -> None:
    error = the_error(replaced('        <broker host="127.0.0.1" port="9092" />\n', ""))
    assert error.reason.startswith("Initial brokers missing")
    assert error.path == "/doryConfig/initialBrokers"


def test_broker_port_zero_is_refused() -> None:
    error = the_error(replaced('port="9092"', 'port="0"'))
    assert "at least 1" in error.reason


def test_duplicate_topic_in_topic_configs() -> None:
    text = replaced(
        '<topic name="raw" action="disable" />',
        '<topic name="urgent" action="disable" />',
        OVERRIDES,
    )
    error = the_error(text)
    assert error.reason == "Batching config contains duplicate specification for topic [urgent]"
    assert error.line == position_of(text, 'name="urgent" action="disable"')[0]


@pytest.mark.parametrize("topic", ["bad topic", "a/b", ".", "..", "x" * 250, "caf\u00e9"])
def test_bad_topic_name_in_topic_configs(topic: str) -> None:
    text = replaced('<topic name="raw"', f'<topic name="{topic}"', OVERRIDES)
    error = the_error(text)
    assert error.reason.startswith(f"Invalid topic name [{topic}]")


def test_empty_topic_name() -> None:
    error = the_error(replaced('<topic name="raw"', '<topic name="  "', OVERRIDES))
    assert error.reason == "Attribute [name] must not be empty"


def test_not_well_formed_xml() -> None:
    text = replaced("</compression>", "</compresion>")
    error = the_error(text)
    assert error.reason.startswith("Config file is not well-formed XML: mismatched tag")
    assert error.line == position_of(text, "</compresion>")[0]
    assert error.column is not None


def test_wrong_root_element() -> None:
    error = the_error(MINIMAL.replace("doryConfig", "kafkaConfig"))
    assert error.reason == "Unknown root element [kafkaConfig]: expected [doryConfig]"
    assert error.line == 2


def test_legacy_bruce_root_element_is_accepted() -> None:
    assert parse_config(MINIMAL.replace("doryConfig", "bruceConfig")).http.port == 9090


@pytest.mark.parametrize("text", ["", "   \n", b""])
def test_empty_file(text: str | bytes) -> None:
    with pytest.raises(ConfigError, match="is empty"):
        parse_config(text)


def test_text_content_is_refused() -> None:
    text = replaced(
        '<messageMaxBytes value="1000000" />',
        '<messageMaxBytes value="1">1000000</messageMaxBytes>',
    )
    error = the_error(text)
    assert error.reason == "Unexpected text [1000000]: values go in attributes"
    assert error.path == "/doryConfig/batching/messageMaxBytes"


def test_all_errors_are_collected_in_one_pass_in_file_order() -> None:
    text = replaced('<messageMaxBytes value="1000000" />', '<messageMaxBytes value="big" />')
    text = replaced(
        '<broker host="127.0.0.1" port="9092" />', '<broker host="h" port="99999" />', text
    )
    text = replaced('<time value="10" />', '<time value="soon" />', text)
    errors = errors_of(text)
    assert [e.path.rsplit("/", 1)[1] for e in errors] == ["time", "messageMaxBytes", "broker"]
    assert [e.line for e in errors] == sorted(e.line or 0 for e in errors)
    with pytest.raises(ConfigErrors) as info:
        parse_config(text)
    assert str(info.value).count("Error in config file:") == 3


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Cannot read config file \[.*missing.xml\]"):
        load_config(tmp_path / "missing.xml")


# --- librdkafka extension errors --------------------------------------------------------------


def librdkafka(*properties: tuple[str, str]) -> str:
    items = "\n".join(f'        <property name="{n}" value="{v}" />' for n, v in properties)
    return with_section(f"    <librdkafka>\n{items}\n    </librdkafka>")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("bootstrap.servers", "<initialBrokers>"),
        ("enable.idempotence", "pydory sets it"),
        ("acks", "pydory sets it"),
        ("dr_msg_cb", "callbacks"),
        ("dr_cb", "callbacks"),
        ("error_cb", "callbacks"),
        ("stats_cb", "callbacks"),
        ("on_delivery", "callbacks"),
        ("compression.type", "<compression>"),
    ],
)
def test_librdkafka_owned_properties_are_refused(name: str, why: str) -> None:
    error = the_error(librdkafka((name, "x")))
    assert error.reason.startswith(f"librdkafka property [{name}] cannot be set here")
    assert why in error.reason
    assert error.path == f"/doryConfig/librdkafka/property[@name={name}]"


@pytest.mark.parametrize("name", ["Security.Protocol", "ssl-ca", "a b", "sasl.password!"])
def test_librdkafka_bad_property_names(name: str) -> None:
    assert the_error(librdkafka((name, "x"))).reason.startswith(
        f"Invalid librdkafka property name [{name}]"
    )


def test_librdkafka_empty_name_and_duplicates() -> None:
    assert the_error(librdkafka(("", "x"))).reason == "Attribute [name] must not be empty"
    error = the_error(librdkafka(("security.protocol", "SSL"), ("security.protocol", "PLAINTEXT")))
    assert error.reason == "Duplicate librdkafka property [security.protocol]"


# --- security: defusedxml refuses entities and external references ----------------------------


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE doryConfig [
  <!ENTITY lol "lol">
  <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
  <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
  <!ENTITY lol9 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
]>
<doryConfig><kafkaConfig><clientId value="&lol9;" /></kafkaConfig></doryConfig>
"""


def test_entity_expansion_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(BILLION_LAUGHS)
    assert (
        info.value.reason == "Entity declarations are not allowed in a config file (entity [lol])"
    )
    assert info.value.line == 3


@pytest.fixture
def reads_of_external_sources(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every attempt by the SAX machinery to open an external resource."""
    attempts: list[str] = []
    real_prepare = xml.sax.saxutils.prepare_input_source
    real_urlopen = urllib.request.urlopen

    def spying_prepare(source: Any, base: str = "") -> Any:
        if not isinstance(source, xml.sax.xmlreader.InputSource):  # not the document itself
            attempts.append(str(source))
        return real_prepare(source, base)

    def spying_urlopen(url: Any, *args: Any, **kwargs: Any) -> Any:
        attempts.append(str(url))
        return real_urlopen(url, *args, **kwargs)

    monkeypatch.setattr(xml.sax.saxutils, "prepare_input_source", spying_prepare)
    monkeypatch.setattr(urllib.request, "urlopen", spying_urlopen)
    return attempts


def external_entity_document(secret: Path) -> str:
    return f"""<?xml version="1.0"?>
<!DOCTYPE doryConfig [ <!ENTITY secret SYSTEM "{secret.as_uri()}"> ]>
<doryConfig><kafkaConfig><clientId value="x" />&secret;</kafkaConfig></doryConfig>
"""


def test_external_entity_is_refused_and_no_file_is_read(
    tmp_path: Path, reads_of_external_sources: list[str]
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    with pytest.raises(ConfigError) as info:
        parse_config(external_entity_document(secret))
    assert info.value.reason.startswith("Entity declarations are not allowed")
    assert "TOP-SECRET" not in str(info.value)
    assert reads_of_external_sources == []


def test_the_read_spy_does_see_an_unsafe_parser_read_the_file(
    tmp_path: Path, reads_of_external_sources: list[str]
) -> None:
    """Control for the test above: the spy catches a read when external entities are on."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    parser = xml.sax.make_parser()
    parser.setFeature(xml.sax.handler.feature_external_ges, True)
    parser.setContentHandler(xml.sax.handler.ContentHandler())
    parser.feed(external_entity_document(secret))
    parser.close()
    assert any("secret.txt" in attempt for attempt in reads_of_external_sources)


def test_external_dtd_reference_is_refused(
    tmp_path: Path, reads_of_external_sources: list[str]
) -> None:
    dtd = tmp_path / "dory.dtd"
    dtd.write_text("<!ELEMENT doryConfig ANY>")
    text = MINIMAL.replace(
        "<doryConfig>", f'<!DOCTYPE doryConfig SYSTEM "{dtd.as_uri()}">\n<doryConfig>', 1
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert info.value.reason.startswith("External references are not allowed in a config file")
    assert reads_of_external_sources == []


def test_undefined_entity_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="undefined entity"):
        parse_config(replaced('value="1000000"', 'value="&nope;"'))


# --- <spool> (pydory extension) ---------------------------------------------------------------

COMPAT_SAMPLE = Path(__file__).parents[2] / "shared" / "compat" / "dory_conf.xml"

SPOOL = """
    <spool enable="true">
        <path value="/var/lib/pydory/spool" />
        <maxSize value="2g" />
        <segmentSize value="32m" />
        <fsync value="always" />
        <overloadPolicy value="backpressure" />
    </spool>"""


def spool_section(*children: str, enable: str = "true", path: str = "/var/lib/pydory/s") -> str:
    inner = "".join(f"\n        {child}" for child in children)
    return with_section(f"""
    <spool enable="{enable}">
        <path value="{path}" />{inner}
    </spool>""")


def test_spool_is_off_when_absent_and_dorys_files_load_unchanged(sample: Config) -> None:
    assert parse_config(MINIMAL).spool == SpoolConfig()
    assert sample.spool == SpoolConfig()
    assert not sample.spool.enabled
    if COMPAT_SAMPLE.exists():
        assert load_config(COMPAT_SAMPLE).spool == SpoolConfig()


def test_spool_element() -> None:
    spool = parse_config(with_section(SPOOL)).spool
    assert spool == SpoolConfig(
        path="/var/lib/pydory/spool",
        max_bytes=2 * 1024**3,
        segment_bytes=32 * 1024**2,
        fsync_interval_ms=0,
        overload_policy=OverloadPolicy.BACKPRESSURE,
    )
    assert spool.enabled


def test_spool_defaults() -> None:
    spool = parse_config(spool_section()).spool
    assert spool == SpoolConfig(path="/var/lib/pydory/s")
    assert (spool.max_bytes, spool.segment_bytes) == (1024**3, 64 * 1024**2)
    assert spool.fsync_interval_ms == 1000
    assert spool.overload_policy is OverloadPolicy.DISCARD


@pytest.mark.parametrize(
    ("fsync", "expected"),
    [("none", None), ("NONE", None), (" always ", 0), ("0", 0), ("250", 250), ("1000", 1000)],
)
def test_spool_fsync_policies(fsync: str, expected: int | None) -> None:
    config = parse_config(spool_section(f'<fsync value="{fsync}" />'))
    assert config.spool.fsync_interval_ms == expected


@pytest.mark.parametrize(
    ("size", "expected"),
    [("1g", 1024**3), ("3G", 3 * 1024**3), ("512m", 512 * 1024**2), ("4096", 4096), ("64k", 65536)],
)
def test_spool_sizes_take_k_m_and_g(size: str, expected: int) -> None:
    config = parse_config(spool_section(f'<maxSize value="{size}" />', '<segmentSize value="1" />'))
    assert config.spool.max_bytes == expected


@pytest.mark.parametrize("policy", ["discard", "backpressure", "spool", "Spool"])
def test_spool_overload_policies(policy: str) -> None:
    config = parse_config(spool_section(f'<overloadPolicy value="{policy}" />'))
    assert config.spool.overload_policy == policy.lower()


@pytest.mark.parametrize(("enable", "path"), [("false", "/var/lib/pydory/s"), ("true", "")])
def test_spool_disabled_or_empty_path_is_off(enable: str, path: str) -> None:
    config = parse_config(spool_section('<fsync value="none" />', enable=enable, path=path))
    assert config.spool == SpoolConfig(fsync_interval_ms=None)
    assert not config.spool.enabled


def test_spool_relative_path() -> None:
    text = spool_section(path="var/spool")
    error = the_error(text)
    assert error.reason == "Spool path must be absolute: [var/spool]"
    assert error.path == "/doryConfig/spool/path"
    assert (error.line, error.column) == position_of(text, 'value="var/spool"')


def test_spool_needs_enable_and_path() -> None:
    error = the_error(with_section("    <spool><path value='/s' /></spool>"))
    assert (error.path, error.reason) == (
        "/doryConfig/spool",
        "Missing required attribute [enable]",
    )
    error = the_error(with_section('    <spool enable="true" />'))
    assert (error.path, error.reason) == ("/doryConfig/spool", "Missing required element [path]")


@pytest.mark.parametrize(
    ("size", "reason"),
    [
        ("1t", "Invalid size [1t]: expected a positive integer, optionally with suffix k"),
        ("1.5g", "Invalid size [1.5g]"),
        ("-1", "Invalid size [-1]"),
        ("", "Value is empty"),
        ("0", "Value [0] is out of range: must be at least 1"),
        ("0g", "Value [0g] is out of range: must be at least 1"),
        ("9999999999g", "Value [9999999999g] is out of range: must be at most 9223372036854775807"),
    ],
)
def test_spool_bad_size(size: str, reason: str) -> None:
    text = spool_section(f'<maxSize value="{size}" />')
    error = the_error(text)
    assert error.path == "/doryConfig/spool/maxSize"
    assert error.reason.startswith(f"Bad value for attribute [value]: {reason}")
    assert error.line == position_of(text, "maxSize")[0]


def test_spool_segment_size_must_not_exceed_max_size() -> None:
    text = spool_section('<maxSize value="1g" />', '<segmentSize value="2g" />')
    error = the_error(text)
    assert error.path == "/doryConfig/spool/segmentSize"
    assert (error.line, error.column) == position_of(text, "segmentSize")
    assert error.reason == (
        "Spool segmentSize [2147483648] must not exceed maxSize [1073741824]: "
        "a segment must fit in the spool"
    )
    # Against the default segment size (64m), the mistake is in <maxSize>.
    error = the_error(spool_section('<maxSize value="10m" />'))
    assert error.path == "/doryConfig/spool/maxSize"
    assert error.reason.startswith("Spool segmentSize [67108864] must not exceed maxSize")


@pytest.mark.parametrize(
    ("fsync", "reason"),
    [
        (
            "sometimes",
            "Invalid fsync policy [sometimes]: expected none, always, or an interval in "
            "milliseconds (a nonnegative integer, e.g. 1000)",
        ),
        ("-1", "Invalid fsync policy [-1]"),
        ("1s", "Invalid fsync policy [1s]"),
        ("", "Invalid fsync policy []"),
        ("2147483648", "Value [2147483648] is out of range: must be at most 2147483647"),
    ],
)
def test_spool_bad_fsync(fsync: str, reason: str) -> None:
    error = the_error(spool_section(f'<fsync value="{fsync}" />'))
    assert error.path == "/doryConfig/spool/fsync"
    assert error.reason.startswith(f"Bad value for attribute [value]: {reason}")


def test_spool_bad_overload_policy() -> None:
    error = the_error(spool_section('<overloadPolicy value="block" />'))
    assert error.path == "/doryConfig/spool/overloadPolicy"
    assert error.reason == (
        "Bad value for attribute [value]: invalid overload policy [block]: "
        "expected one of: discard, backpressure, spool"
    )


def test_spool_unknown_and_duplicate_children() -> None:
    errors = errors_of(
        spool_section('<fsync value="none" />', '<fsync value="none" />', '<size value="1g" />')
    )
    assert [(e.path, e.reason.split(":")[0]) for e in errors] == [
        ("/doryConfig/spool/fsync[2]", "Duplicate element [fsync]"),
        ("/doryConfig/spool/size", "Unknown element [size]"),
    ]


def test_a_disabled_spool_is_still_validated() -> None:
    error = the_error(spool_section('<segmentSize value="2x" />', enable="false"))
    assert error.path == "/doryConfig/spool/segmentSize"


# --- <quotas> (pydory extension) ---------------------------------------------------------------

QUOTAS = """    <quotas>
        <unixStream>
            <maxConnections value="256" />
            <clientRate bytesPerSec="8m" msgsPerSec="50k" window="2000" />
        </unixStream>
        <tcp>
            <maxConnections value="64" />
            <clientRate bytesPerSec="1m" />
        </tcp>
    </quotas>"""


def quotas_section(*children: str, listener: str = "tcp") -> str:
    inner = "\n".join(f"            {child}" for child in children)
    return with_section(f"""    <quotas>
        <{listener}>
{inner}
        </{listener}>
    </quotas>""")


def test_quotas_are_off_when_absent(sample: Config) -> None:
    assert parse_config(MINIMAL).quotas == QuotasConfig()
    assert sample.quotas == QuotasConfig()
    assert not sample.quotas.enabled
    assert not parse_config(with_section("    <quotas />")).quotas.enabled


def test_quotas_element() -> None:
    quotas = parse_config(with_section(QUOTAS)).quotas
    assert quotas == QuotasConfig(
        unix_stream=ListenerQuotas(256, ClientRate(8 * 1024**2, 50 * 1024, 2000)),
        tcp=ListenerQuotas(64, ClientRate(1024**2, None, 1000)),
    )
    assert quotas.enabled
    assert quotas.unix_stream.enabled
    assert quotas.tcp.client_rate.limited


def test_the_datagram_quota_is_a_client_rate_only() -> None:
    """<unixDatagram> (issue 21 item 5): a clientRate, no connection limit (a datagram
    socket has no connections)."""
    rate = '<clientRate msgsPerSec="100" window="500" />'
    quotas = parse_config(quotas_section(rate, listener="unixDatagram")).quotas
    assert quotas == QuotasConfig(unix_datagram=ClientRate(None, 100, 500))
    assert quotas.enabled
    error = the_error(quotas_section('<maxConnections value="3" />', listener="unixDatagram"))
    assert error.path == "/doryConfig/quotas/unixDatagram/maxConnections"
    assert "expected one of: clientRate" in str(error)


@pytest.mark.parametrize(
    ("children", "expected"),
    [
        (['<maxConnections value="unlimited" />'], ListenerQuotas()),
        (['<maxConnections value="1k" />'], ListenerQuotas(1024)),
        (
            ['<clientRate msgsPerSec="100" />'],
            ListenerQuotas(None, ClientRate(msgs_per_sec=100)),
        ),
        (
            ['<clientRate bytesPerSec="unlimited" msgsPerSec="unlimited" />'],
            ListenerQuotas(),
        ),
        (
            ['<clientRate bytesPerSec="512k" window="100" />'],
            ListenerQuotas(None, ClientRate(512 * 1024, None, 100)),
        ),
    ],
)
def test_quota_values(children: list[str], expected: ListenerQuotas) -> None:
    assert parse_config(quotas_section(*children)).quotas.tcp == expected
    unix = parse_config(quotas_section(*children, listener="unixStream")).quotas
    assert unix.unix_stream == expected
    assert unix.tcp == ListenerQuotas()


@pytest.mark.parametrize(
    ("child", "path", "reason"),
    [
        (
            '<maxConnections value="0" />',
            "/doryConfig/quotas/tcp/maxConnections",
            "Bad value for attribute [value]: Value [0] is out of range: must be at least 1",
        ),
        (
            '<maxConnections value="lots" />',
            "/doryConfig/quotas/tcp/maxConnections",
            "Bad value for attribute [value]: Invalid number [lots]",
        ),
        (
            '<maxConnections value="2147483648" />',
            "/doryConfig/quotas/tcp/maxConnections",
            "Bad value for attribute [value]: Value [2147483648] is out of range",
        ),
        (
            "<maxConnections />",
            "/doryConfig/quotas/tcp/maxConnections",
            "Missing required attribute [value]",
        ),
        (
            '<clientRate bytesPerSec="0" />',
            "/doryConfig/quotas/tcp/clientRate",
            "Bad value for attribute [bytesPerSec]: Value [0] is out of range: must be at least 1",
        ),
        (
            '<clientRate bytesPerSec="1g" />',
            "/doryConfig/quotas/tcp/clientRate",
            "Bad value for attribute [bytesPerSec]: Suffix [g] not allowed in [1g]",
        ),
        (
            '<clientRate msgsPerSec="1m" />',
            "/doryConfig/quotas/tcp/clientRate",
            "Bad value for attribute [msgsPerSec]: Suffix [m] not allowed in [1m]",
        ),
        (
            '<clientRate msgsPerSec="-5" />',
            "/doryConfig/quotas/tcp/clientRate",
            "Bad value for attribute [msgsPerSec]: Invalid number [-5]",
        ),
        (
            '<clientRate msgsPerSec="10" window="99" />',
            "/doryConfig/quotas/tcp/clientRate",
            "Bad value for attribute [window]: Value [99] is out of range: must be at least 100",
        ),
        (
            '<clientRate msgsPerSec="10" window="60001" />',
            "/doryConfig/quotas/tcp/clientRate",
            "Bad value for attribute [window]: Value [60001] is out of range: must be at most "
            "60000",
        ),
        (
            '<clientRate window="1000" />',
            "/doryConfig/quotas/tcp/clientRate",
            "Missing attribute: give bytesPerSec or msgsPerSec (or both) in clientRate",
        ),
        (
            '<clientRate msgsPerSec="10" burst="5" />',
            "/doryConfig/quotas/tcp/clientRate",
            "Unknown attribute [burst]: expected one of: bytesPerSec, msgsPerSec, window",
        ),
        (
            '<maxConnection value="5" />',
            "/doryConfig/quotas/tcp/maxConnection",
            "Unknown element [maxConnection]: expected one of: maxConnections, clientRate",
        ),
    ],
)
def test_quota_bad_values_name_their_element(child: str, path: str, reason: str) -> None:
    text = quotas_section(child)
    error = the_error(text)
    assert error.path == path
    assert error.reason.startswith(reason), error.reason
    assert (error.line, error.column) == position_of(text, child.split()[0])


def test_quota_listeners_and_duplicates() -> None:
    errors = errors_of(
        with_section("""    <quotas enable="true">
        <udp />
        <tcp><maxConnections value="1" /><maxConnections value="2" /></tcp>
        <tcp />
    </quotas>""")
    )
    assert [(e.path, e.reason.split(":")[0]) for e in errors] == [
        ("/doryConfig/quotas", "Unknown attribute [enable]"),
        ("/doryConfig/quotas/udp", "Unknown element [udp]"),
        ("/doryConfig/quotas/tcp[1]/maxConnections[2]", "Duplicate element [maxConnections]"),
        ("/doryConfig/quotas/tcp[2]", "Duplicate element [tcp]"),
    ]


# --- pathological files: refused early, with one message naming the limit ------------------


def nested(depth: int) -> str:
    """A <doryConfig> whose first child holds elements nested ``depth`` levels in all."""
    inner = depth - 1  # the root is the first level
    return "<doryConfig>" + "<a>" * inner + "</a>" * inner + "</doryConfig>"


def test_nesting_beyond_the_depth_limit_is_refused_in_one_line() -> None:
    # 1,000 levels used to end in a RecursionError traceback.
    with pytest.raises(ConfigError) as caught:
        parse_config(nested(1000))
    assert type(caught.value) is ConfigError  # one error, not a list
    message = str(caught.value)
    assert message.count("\n") == 0
    assert f"nested more than {MAX_DEPTH} deep" in message
    assert f"the limit is {MAX_DEPTH} levels" in message
    # Refused at the first element too deep: its column is that of the (limit+1)-th <a>.
    assert caught.value.line == 1
    assert caught.value.column == len("<doryConfig>") + len("<a>") * (MAX_DEPTH - 1) + 1


def test_nesting_at_the_depth_limit_is_parsed() -> None:
    root = parse_xml(nested(MAX_DEPTH))
    depth = 1
    while root.children:
        (root,) = root.children
        depth += 1
    assert depth == MAX_DEPTH
    with pytest.raises(ConfigError, match="nested more than"):
        parse_xml(nested(MAX_DEPTH + 1))


def test_too_many_elements_stop_the_parse_at_the_first_one_over() -> None:
    # 10 MB of unknown elements used to take 83 s and print 2.1 M error lines. One element
    # per line: the error's line shows where the parse stopped, so nothing after the limit
    # was built or checked (the file goes on for 3 * MAX_ELEMENTS more elements).
    document = "<doryConfig>\n" + "<unknown/>\n" * (4 * MAX_ELEMENTS) + "</doryConfig>\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(document)
    assert type(caught.value) is ConfigError
    assert str(caught.value).count("\n") == 0
    assert f"more than {MAX_ELEMENTS} elements" in str(caught.value)
    assert caught.value.line == MAX_ELEMENTS + 1  # the root is element 1, on line 1


def test_many_errors_show_the_first_ones_then_a_count() -> None:
    unknown = 3 * MAX_REPORTED_ERRORS
    with pytest.raises(ConfigErrors) as caught:
        parse_config(replaced("<initialBrokers>", "<initialBrokers>" + "<bad/>" * unknown))
    lines = str(caught.value).splitlines()
    assert len(lines) == MAX_REPORTED_ERRORS + 1
    assert all("Unknown element [bad]" in line for line in lines[:-1])
    assert lines[-1] == f"... and {unknown - MAX_REPORTED_ERRORS} more errors"
    assert caught.value.total == unknown


def test_errors_beyond_those_kept_are_still_counted() -> None:
    # Past what the reader keeps, errors are counted, not built: memory stays bounded.
    unknown = MAX_ELEMENTS - 100
    with pytest.raises(ConfigErrors) as caught:
        parse_config(replaced("<initialBrokers>", "<initialBrokers>" + "<bad/>" * unknown))
    assert caught.value.total == unknown
    assert len(caught.value.errors) < unknown // 10
    assert str(caught.value).splitlines()[-1] == (
        f"... and {unknown - MAX_REPORTED_ERRORS} more errors"
    )


def test_many_warnings_show_the_first_ones_then_a_count() -> None:
    attributes = " ".join(f'extra{i}="x"' for i in range(2 * MAX_REPORTED_ERRORS))
    config = parse_config(replaced("<batching>", f"<batching {attributes}>"))
    assert len(config.warnings) == MAX_REPORTED_ERRORS + 1
    assert config.warnings[-1] == f"... and {MAX_REPORTED_ERRORS} more warnings"


def test_a_file_over_the_size_limit_is_refused_without_being_read(tmp_path: Path) -> None:
    # A sparse file of 1 TiB: reading it whole (as the loader used to) would take far
    # longer than the test's timeout, or fail to allocate; the limit needs one read.
    huge = tmp_path / "huge.xml"
    with huge.open("wb") as file:
        file.truncate(1 << 40)
    with pytest.raises(ConfigError) as caught:
        load_config(huge)
    assert type(caught.value) is ConfigError
    assert f"[{huge}] is larger than {MAX_CONFIG_BYTES} bytes" in str(caught.value)


def test_a_document_over_the_size_limit_is_refused() -> None:
    padding = " " * MAX_CONFIG_BYTES  # whitespace: well-formed, and nothing else wrong
    with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        parse_config(MINIMAL.replace("</doryConfig>", padding + "</doryConfig>"))
    parse_config(MINIMAL.replace("</doryConfig>", padding[: -len(MINIMAL)] + "</doryConfig>"))
