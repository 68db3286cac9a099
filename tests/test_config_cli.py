"""`pydory config check PATH`: exit 0 with the effective settings, or 1 with the errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pydory.cli import main

SAMPLE = Path(__file__).parent / "data" / "dory_conf.xml"


def test_check_prints_every_section_of_the_sample(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(SAMPLE)]) == 0
    out = capsys.readouterr().out
    for section in ("batching", "compression", "topicRateLimiting", "inputSources",
                    "inputConfig", "msgDelivery", "httpInterface", "discardLogging",
                    "kafkaConfig", "msgDebug", "logging", "librdkafka",
                    "initialBrokers"):  # fmt: skip
        assert f"[{section}]" in out
    lines = set(out.splitlines())
    assert "namedConfigs/config[low_latency]/time = 500" in lines
    assert "namedConfigs/config[low_latency]/messages = disable" in lines
    assert "namedConfigs/config[low_latency]/bytes = 262144" in lines
    assert "defaultTopic/@action = combinedTopics" in lines
    assert "namedConfigs/config[infinity]/@maxCount = unlimited" in lines
    assert "unixDatagram/mode = 0222" in lines
    assert "unixStream/path = (none)" in lines
    assert "shutdownMaxDelay = 30000" in lines
    assert "topicAutocreate/@enable = false" in lines
    assert "broker = broker_host_1:9092" in lines


def test_check_speaks_the_xml_names_never_python_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["config", "check", str(SAMPLE)]) == 0
    settings = [line for line in capsys.readouterr().out.splitlines()[1:] if " = " in line]

    assert len(settings) > 80
    for line in settings:
        path = re.sub(r"\[[^]]*\]", "", line.split(" = ")[0])  # names in [] are the user's
        assert "_" not in path, line  # no snake_case: elements and attributes are camelCase


def test_check_lists_the_sections_in_the_files_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = SAMPLE.read_text(encoding="ascii")
    start, end = text.index("    <msgDelivery>"), text.index("</msgDelivery>\n") + 15
    moved = text[:start] + text[end:]
    moved = moved.replace("    <batching>", text[start:end] + "    <batching>", 1)
    path = tmp_path / "moved.xml"
    path.write_text(moved, encoding="ascii")

    assert main(["config", "check", str(path)]) == 0
    headers = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]

    assert headers[:3] == ["[msgDelivery]", "[batching]", "[compression]"]
    # Sections the file leaves out come after the file's, defaults filled in.
    assert headers[-1] in ("[spool]", "[quotas]", "[messageIdentity]")


def test_check_shows_per_topic_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = SAMPLE.read_text(encoding="ascii").replace(
        "        </topicConfigs>\n    </batching>",
        '            <topic name="clicks" action="perTopic" config="low_latency" />\n'
        "        </topicConfigs>\n    </batching>",
    )
    path = tmp_path / "dory.xml"
    path.write_text(text, encoding="ascii")
    assert main(["config", "check", str(path)]) == 0
    lines = set(capsys.readouterr().out.splitlines())
    assert "topicConfigs/topic[clicks]/@action = perTopic" in lines
    assert "topicConfigs/topic[clicks]/@config = low_latency" in lines


def test_check_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", "--json", str(SAMPLE)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["valid"] is True
    config = document["config"]
    assert config["batching"]["named_configs"]["low_latency"] == {
        "time_ms": 500,
        "messages": None,
        "bytes": 262144,
    }
    assert config["compression"]["named_configs"]["gzip_config"]["level"] == 3
    assert config["rate_limiting"]["named_configs"]["config2"]["max_count"] == 4096
    assert config["inputs"]["unix_datagram"]["mode"] == "0222"
    assert config["initial_brokers"] == [
        {"host": "broker_host_1", "port": 9092},
        {"host": "broker_host_2", "port": 9092},
    ]
    assert config["bootstrap_servers"] == "broker_host_1:9092,broker_host_2:9092"


def bad_copy(tmp_path: Path) -> Path:
    text = SAMPLE.read_text(encoding="ascii").replace(
        '<sizeThresholdPercent value="75" />', '<sizeThresholdPercent value="101" />'
    )
    path = tmp_path / "bad.xml"
    path.write_text(text, encoding="ascii")
    return path


def test_check_refuses_a_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = bad_copy(tmp_path)
    assert main(["config", "check", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        "Error in config file: (line 159, column 9) /doryConfig/compression/sizeThresholdPercent: "
        "Bad value for attribute [value]: Value [101] is out of range: must be at most 100"
    ) in captured.err
    assert f"{path} is invalid (1 error)" in captured.err


def test_check_json_lists_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", "--json", str(bad_copy(tmp_path))]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["valid"] is False
    [error] = document["errors"]
    assert (error["path"], error["line"], error["column"]) == (
        "/doryConfig/compression/sizeThresholdPercent",
        159,
        9,
    )


def test_check_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(tmp_path / "nope.xml")]) == 1
    assert "Cannot read config file" in capsys.readouterr().err


def test_config_without_subcommand_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config"]) == 2
    assert "check" in capsys.readouterr().err


def test_installed_script_checks_the_sample(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "pydory"
    ok = subprocess.run(
        [script, "config", "check", SAMPLE], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0, ok.stderr
    assert "namedConfigs/config[low_latency]/time = 500" in ok.stdout
    bad = subprocess.run(
        [script, "config", "check", bad_copy(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 1
    assert "sizeThresholdPercent: Bad value" in bad.stderr
