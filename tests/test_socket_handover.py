"""The input sockets bound before the daemon (issue 33, point 5): the early reading of the
config's addresses, the handover to the inputs, systemd's sockets (sd_listen_fds).

The daemon-level tests (``pydory serve`` on sockets the test passes as systemd does,
killed and restarted) are in tests/test_restarts.py.
"""

from __future__ import annotations

import os
import re
import socket
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydory.config import load_config
from pydory.config.model import DEFAULT_SOCKET_MODE
from pydory.config.xmltree import MAX_CONFIG_BYTES
from pydory.daemon.inputs import addresses
from pydory.daemon.inputs import handover as handover_module
from pydory.daemon.inputs.addresses import InputAddresses, UnixAddress, read_input_addresses
from pydory.daemon.inputs.handover import (
    DATAGRAM,
    STREAM,
    TCP,
    Handover,
    HeldSocket,
    inherit_from_systemd,
    open_early,
)
from pydory.errors import ConfigError
from pydory_tools.testing.daemon_config import DaemonConfig

SAMPLE = Path(__file__).parents[1] / "docs" / "pydory.sample.xml"


def test_the_early_reader_shares_the_loaders_limits() -> None:
    assert addresses.MAX_CONFIG_BYTES == MAX_CONFIG_BYTES
    assert addresses.DEFAULT_SOCKET_MODE == DEFAULT_SOCKET_MODE


def loaders_addresses(path: Path) -> InputAddresses:
    inputs = load_config(str(path)).inputs

    def unix(source: object) -> UnixAddress | None:
        path_, mode = source.path, source.mode  # type: ignore[attr-defined]
        return None if path_ is None else UnixAddress(path_, mode)

    return InputAddresses(unix(inputs.unix_datagram), unix(inputs.unix_stream), inputs.tcp.port)


def test_the_early_reader_reads_the_sample_config_as_the_loader_does() -> None:
    early = read_input_addresses(str(SAMPLE))
    assert early == loaders_addresses(SAMPLE)
    assert early.unix_datagram is not None  # the sample has inputs: the test compares some


_MODES = st.sampled_from(
    [
        None,
        "0666",
        "0222",
        "0",
        "0777",
        "0b110110110",
        "unspecified",
        "UNSPECIFIED",
        "666",
        "0o666",
        "x",
    ]
)
_PATHS = st.sampled_from(["/run/pydory/d.sock", " /run/pydory/s.sock ", "", "relative.sock"])
_FLAGS = st.sampled_from(["true", "false", "TRUE", " True ", "yes"])
_PORTS = st.sampled_from(["0", "9090", "65535", "65536", "", "-1", "0x10", " 8080 "])


def _unix(tag: str, flag: str, path: str, mode: str | None) -> str:
    mode_element = "" if mode is None else f'<mode value="{mode}" />'
    return f'<{tag} enable="{flag}"><path value="{path}" />{mode_element}</{tag}>'


@settings(max_examples=60, deadline=None)
@given(
    st.tuples(_FLAGS, _PATHS, _MODES),
    st.tuples(_FLAGS, _PATHS, _MODES),
    st.tuples(_FLAGS, _PORTS),
    st.booleans(),
)
def test_the_early_reader_never_disagrees_with_the_loader(
    tmp_path_factory: pytest.TempPathFactory,
    datagram: tuple[str, str, str | None],
    stream: tuple[str, str, str | None],
    tcp: tuple[str, str],
    doctype: bool,
) -> None:
    """Where the loader accepts the file, the early reader finds its addresses or leaves
    an input out, never another address; on plain values it finds them all."""
    path = tmp_path_factory.mktemp("cfg") / "pydory.xml"
    text = DaemonConfig(bootstrap_servers="127.0.0.1:9092", socket_dir="/run/pydory").render()
    sources = (
        _unix("unixDatagram", *datagram)
        + _unix("unixStream", *stream)
        + f'<tcp enable="{tcp[0]}"><port value="{tcp[1]}" /></tcp>'
    )
    text = re.sub(
        "<inputSources>.*</inputSources>",
        f"<inputSources>{sources}</inputSources>",
        text,
        flags=re.S,
    )
    if doctype:
        text = text.replace("<doryConfig>", "<!DOCTYPE doryConfig []><doryConfig>", 1)
    path.write_text(text)
    early = read_input_addresses(str(path))
    try:
        loaded = loaders_addresses(path)
    except ConfigError:
        return  # refused: nothing the early reader bound survives (Handover.close_rest)
    for field in ("unix_datagram", "unix_stream", "tcp_port"):
        found = getattr(early, field)
        assert found is None or found == getattr(loaded, field), field
    plain = (
        not doctype
        and all(v[0] in ("true", "false") for v in (datagram, stream, tcp))
        and all(v[2] in (None, "0666", "0222", "0777", "unspecified") for v in (datagram, stream))
    )
    if plain:
        assert early == loaded


def test_a_file_the_early_reader_cannot_read_gives_no_address(tmp_path: Path) -> None:
    assert read_input_addresses(str(tmp_path / "missing.xml")) == InputAddresses()
    broken = tmp_path / "broken.xml"
    broken.write_text("<doryConfig><inputSources>")
    assert read_input_addresses(str(broken)) == InputAddresses()
    entity = tmp_path / "entity.xml"
    entity.write_text(
        '<!DOCTYPE d [<!ENTITY p "/run/x.sock">]><doryConfig><inputSources>'
        '<unixStream enable="true"><path value="&p;" /></unixStream></inputSources></doryConfig>'
    )
    assert read_input_addresses(str(entity)) == InputAddresses()


# --- the handover ------------------------------------------------------------------------


def test_the_inputs_take_their_sockets_by_kind_and_address(tmp_path: Path) -> None:
    handover = Handover()
    dgram, stream = str(tmp_path / "d.sock"), str(tmp_path / "s.sock")
    handover.bind_missing(InputAddresses(UnixAddress(dgram, 0o660), UnixAddress(stream, None), 0))
    try:
        assert {each.kind for each in handover.held} == {DATAGRAM, STREAM, TCP}
        assert stat.S_IMODE(os.stat(dgram).st_mode) == 0o660
        assert stat.S_ISSOCK(os.stat(stream).st_mode)
        assert handover.take(STREAM, dgram) == []  # a datagram socket is no stream input
        (taken,) = handover.take(DATAGRAM, dgram)
        assert taken.sock.type == socket.SOCK_DGRAM
        assert not taken.inherited
        taken.sock.close()
        tcp = handover.take(TCP, 0)  # port 0: whatever loopback port was bound
        assert tcp
        assert {each.address[1] for each in tcp} == {tcp[0].sock.getsockname()[1]}
        for each in tcp:
            each.sock.close()
    finally:
        handover.close_rest()
    assert not os.path.exists(stream)  # bound here, taken by nobody: its file removed


def _inherited(sock: socket.socket, kind: str, address: str | tuple[str, int]) -> HeldSocket:
    return HeldSocket(sock, kind, address, inherited=True, origin="systemd's fd 3 'test'")


@pytest.mark.parametrize(
    ("kind", "address", "element"),
    [
        (STREAM, "/run/other.sock", "/doryConfig/inputSources/unixStream/path"),
        (DATAGRAM, "/run/stream.sock", "/doryConfig/inputSources/unixDatagram/path"),
        (TCP, ("127.0.0.1", 9999), "/doryConfig/inputSources/tcp/port"),
        (TCP, ("10.0.0.1", 9000), "/doryConfig/inputSources/tcp/port"),
    ],
)
def test_a_systemd_socket_no_input_takes_is_refused_naming_the_element(
    kind: str, address: str | tuple[str, int], element: str
) -> None:
    config = DaemonConfig(bootstrap_servers="127.0.0.1:9092", socket_dir="/run", tcp_port=9000)
    config.stream_file, config.datagram_file = "stream.sock", "dgram.sock"
    inputs = load_config_text(config.render()).inputs
    with socket.socket() as sock:
        handover = Handover([_inherited(sock, kind, address)])
        with pytest.raises(ConfigError) as refused:
            handover.check(inputs)
    assert refused.value.path == element
    assert "systemd's fd 3 'test'" in str(refused.value)


def test_systemd_sockets_the_inputs_name_pass_the_check() -> None:
    config = DaemonConfig(bootstrap_servers="127.0.0.1:9092", socket_dir="/run", tcp_port=9000)
    inputs = load_config_text(config.render()).inputs
    with socket.socket() as a, socket.socket() as b, socket.socket() as c:
        Handover(
            [
                _inherited(a, STREAM, config.stream_path),
                _inherited(b, DATAGRAM, config.datagram_path),
                _inherited(c, TCP, ("::1", 9000)),
            ]
        ).check(inputs)


def load_config_text(text: str) -> object:
    from pydory.config import parse_config

    return parse_config(text)


def test_listen_fds_for_another_process_are_not_taken_and_the_variables_go() -> None:
    """sd_listen_fds(unset_environment=1): LISTEN_PID names the process the sockets are
    for; the variables are unset either way, so no child sees them."""
    environ = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "3", "LISTEN_FDNAMES": "a:b:c"}
    assert inherit_from_systemd(environ) == []
    assert environ == {}
    assert inherit_from_systemd({}) == []
    with pytest.raises(ConfigError, match="LISTEN_FDS"):
        inherit_from_systemd({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "three"})


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        (["serve", "--config-path", "/a.xml"], "/a.xml"),
        (["serve", "--config-path=/a.xml"], "/a.xml"),
        (["serve", "--config", "/a.xml", "--daemon"], "/a.xml"),  # argparse's prefixes
        (["serve", "--config-path", "/a.xml", "--config-path", "/b.xml"], "/b.xml"),
        (["serve", "--daemon"], None),
        (["serve", "--", "--config-path", "/a.xml"], None),
        (["serve", "--config-path"], None),
    ],
)
def test_the_first_step_finds_the_config_path_as_argparse_does(
    argv: list[str], found: str | None
) -> None:
    assert handover_module._config_path_in(argv) == found


def test_sockets_bound_first_are_taken_by_serve_or_closed_with_their_files(
    tmp_path: Path,
) -> None:
    config = DaemonConfig(bootstrap_servers="127.0.0.1:9092", socket_dir=str(tmp_path))
    path = tmp_path / "pydory.xml"
    path.write_text(config.render())
    handover_module.open_first(["serve", "--config-path", str(path)])
    assert stat.S_ISSOCK(os.stat(config.stream_path).st_mode)  # bound at once
    taken = open_early(str(path))  # what serve() does: the same sockets
    assert {each.kind for each in taken.held} == {DATAGRAM, STREAM, TCP}
    taken.close_rest()
    assert not os.path.exists(config.stream_path)
    handover_module.open_first(["serve", "--config-path", str(path)])
    handover_module.close_first()  # the command line was refused: nothing stays
    assert not os.path.exists(config.datagram_path)
    assert not os.path.exists(config.stream_path)
