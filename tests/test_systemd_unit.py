"""The systemd unit pydory ships (docs/systemd/pydory.service), its sample config and the
logrotate snippet agree, and the unit is sandboxed (issue 23, item 15).

``systemd-analyze security --offline=yes`` scores the unit file itself (no systemd as PID
1 needed); the score must stay at 4 or below ("OK"), and ``systemd-analyze verify`` must
know every directive. Both are skipped, saying so, where the binary is absent; the
directive checks below run everywhere. The sandbox must not break the sockets: clients of
every user reach them in the unit's RuntimeDirectory, never in a private /tmp.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pydory.config import load_config

ROOT = Path(__file__).parents[1]
UNIT = ROOT / "docs" / "systemd" / "pydory.service"
SAMPLE = ROOT / "docs" / "pydory.sample.xml"
OPERATIONS = ROOT / "docs" / "operations.md"
#: systemd-analyze's "OK" band ends here (5 and above: "MEDIUM", then "EXPOSED").
MAX_EXPOSURE = 4.0
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed on this machine"
)


def directives() -> dict[str, list[str]]:
    """The unit's ``Key=value`` lines, every value of each key in order."""
    found: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def only(key: str) -> str:
    values = directives()[key]
    assert len(values) == 1, f"{key}= is set {len(values)} times"
    return values[0]


@needs_systemd_analyze
def test_the_unit_scores_ok_in_systemd_analyze_security(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    score = re.search(r"Overall exposure level for pydory\.service: ([0-9.]+)", result.stdout)
    assert score is not None, result.stdout + result.stderr
    assert float(score[1]) <= MAX_EXPOSURE, result.stdout


@needs_systemd_analyze
def test_systemd_knows_every_directive_of_the_unit(tmp_path: Path) -> None:
    """``verify`` warns about an unknown or misspelt key (and ignores it: a hardening line
    with a typo would silently do nothing). The executable must exist for it: this
    venv's stands in for /opt/pydory's."""
    assert SYSTEMD_ANALYZE is not None
    venv_bin = Path(sys.executable).parent
    unit = tmp_path / "pydory.service"
    unit.write_text(UNIT.read_text().replace("/opt/pydory/bin/", f"{venv_bin}/"))
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


def test_the_sandbox_directives_are_there() -> None:
    found = directives()
    assert only("ProtectSystem") == "strict"
    assert only("PrivateTmp") == "true"
    assert only("NoNewPrivileges") == "true"
    assert only("ProtectHome") == "true"
    assert only("CapabilityBoundingSet") == ""
    assert set(only("RestrictAddressFamilies").split()) == {
        "AF_UNIX",
        "AF_INET",
        "AF_INET6",
        "AF_NETLINK",
    }
    assert "@system-service" in found["SystemCallFilter"]
    for key in ("ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs"):
        assert only(key) == "true"


def test_the_sample_configs_paths_are_the_directories_the_unit_makes_writable() -> None:
    """ProtectSystem=strict leaves writable only what the unit names: the sample config
    must write nowhere else (or the daemon fails at start with a read-only file system)."""
    config = load_config(SAMPLE)
    runtime = Path("/run") / only("RuntimeDirectory")
    state = Path("/var/lib") / only("StateDirectory")
    logs = Path("/var/log") / only("LogsDirectory")
    text = SAMPLE.read_text()
    assert Path(config.inputs.unix_datagram.path).parent == runtime
    assert f'<path value="{runtime}/input_stream_sock" />' in text  # off, but the same place
    assert config.spool.path is not None
    assert Path(config.spool.path).is_relative_to(state)
    assert config.logging.file_path is not None
    assert Path(config.logging.file_path).parent == logs
    for optional in ("discard.log", "msg-debug"):
        assert f'<path value="{logs}/{optional}" />' in text


def test_clients_of_every_user_can_reach_the_sockets() -> None:
    """The sockets are in /run/pydory, outside the service's private /tmp, in a directory
    every user may enter, with a mode that lets every user send."""
    config = load_config(SAMPLE)
    path = config.inputs.unix_datagram.path
    assert not path.startswith(("/tmp/", "/var/tmp/"))
    assert int(only("RuntimeDirectoryMode"), 8) & 0o001  # others may enter the directory
    mode = config.inputs.unix_datagram.mode
    assert mode is not None
    assert mode & 0o002  # others may send (connect/sendto need write permission)


def test_the_logrotate_snippet_rotates_the_file_the_daemon_writes() -> None:
    text = OPERATIONS.read_text()
    snippet = re.search(r"```\n\s*(/\S+) \{\n(.*?)\n\s*\}\n\s*```", text, re.S)
    assert snippet is not None, "no logrotate snippet in docs/operations.md"
    assert snippet[1] == load_config(SAMPLE).logging.file_path
    assert "systemctl kill -s USR1 pydory.service" in snippet[2]  # SIGUSR1: reopen


# --- socket activation (issue 33, point 5) -------------------------------------------------

SOCKET_UNIT = ROOT / "docs" / "systemd" / "pydory.socket"


def socket_unit_lines() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The socket unit's ``Key=value`` lines, and those commented out (``#Key=value``)."""
    active: dict[str, list[str]] = {}
    commented: dict[str, list[str]] = {}
    for line in SOCKET_UNIT.read_text().splitlines():
        match = re.fullmatch(r"(#?)([A-Za-z0-9]+)=(.*)", line.strip())
        if match:
            (commented if match[1] else active).setdefault(match[2], []).append(match[3])
    return active, commented


def test_the_socket_unit_holds_the_sample_configs_inputs_and_no_other() -> None:
    """pydory refuses a socket systemd passes that is not an input the config enables: the
    unit's active sockets are the sample's enabled inputs, at their addresses; the other
    inputs' sockets are there, commented out, at the addresses the sample gives them."""
    inputs = load_config(SAMPLE).inputs
    active, commented = socket_unit_lines()
    assert active["ListenDatagram"] == [inputs.unix_datagram.path]
    assert "ListenStream" not in active  # stream and TCP are off in the sample
    text = SAMPLE.read_text()
    stream_path = re.search(r'<unixStream.*?<path value="([^"]+)"', text, re.S)
    tcp_port = re.search(r'<tcp .*?<port value="([^"]+)"', text, re.S)
    assert stream_path is not None
    assert tcp_port is not None
    assert commented["ListenStream"] == [
        stream_path[1],
        f"127.0.0.1:{tcp_port[1]}",
        f"[::1]:{tcp_port[1]}",
    ]
    assert int(only_in(active, "SocketMode"), 8) == inputs.unix_datagram.mode
    assert active.get("Accept", ["no"]) == ["no"]  # listening sockets, not connections
    assert only_in(active, "Service") == "pydory.service"


def only_in(found: dict[str, list[str]], key: str) -> str:
    values = found[key]
    assert len(values) == 1, f"{key}= is set {len(values)} times"
    return values[0]


def test_the_service_keeps_the_socket_directory_and_orders_after_the_socket_unit() -> None:
    """RuntimeDirectory= is removed when the service stops, unless preserved: the socket
    unit's files are there, and must outlive every restart."""
    assert only("RuntimeDirectoryPreserve") == "yes"
    found = directives()
    assert "pydory.socket" in found["Wants"]
    assert "pydory.socket" in found["After"]
    active, _ = socket_unit_lines()
    socket_dir = Path(active["ListenDatagram"][0]).parent
    assert socket_dir == Path("/run") / only("RuntimeDirectory")


@needs_systemd_analyze
def test_systemd_knows_every_directive_of_the_socket_unit(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    venv_bin = Path(sys.executable).parent
    (tmp_path / "pydory.service").write_text(
        UNIT.read_text().replace("/opt/pydory/bin/", f"{venv_bin}/")
    )
    unit = tmp_path / "pydory.socket"
    unit.write_text(SOCKET_UNIT.read_text())
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""
