"""One client of the status port (issue 23, item 13): every tool that reads a daemon's pages
takes the same URL forms and treats proxies the same way.

The clients: ``pydory status`` (and ``reload``, through the same class), ``pydory wait``,
``pydory pipeline audit --status`` (``fetch_books``), the demo and the benchmark. Each is
run here against a stand-in status server on loopback, with ``HTTP_PROXY`` pointing at a
stand-in proxy that answers something else: a loopback status URL must reach the daemon
itself, and any other host must go through the proxy.
"""

from __future__ import annotations

import ast
import ipaddress
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pydory
from pydory.cli import main
from pydory.pipeline.audits.audit import BooksUnavailable, fetch_books
from pydory.status_client import (
    DaemonUnreachable,
    NotAStatusPage,
    StatusHttp,
    StatusUrlError,
    is_loopback,
    proxies_for,
    status_base_url,
)
from pydory_tools.bench.daemon import BenchDaemon
from pydory_tools.demo import get_json as demo_get_json
from pydory_tools.testing.daemon_config import DaemonConfig

BOOKS = {"received": {"unix_dgram": 3}, "topics": [], "from": "the daemon"}
COMMIT_POINT = {
    "passed": True,
    "after": 1.0,
    "commit_point": 2.0,
    "lag_s": 0.0,
    "open_messages": 0,
    "shutting_down": False,
}
PROXIED = {"received": {}, "topics": [], "from": "the proxy"}
#: Under ``.invalid`` (RFC 6761): a name that is never this host, and never resolves.
REMOTE_HOST = "status.invalid"


class Recorder:
    """A stand-in HTTP server on 127.0.0.1 that records the request lines it gets."""

    def __init__(self, pages: dict[str, Any]) -> None:
        self.requests: list[str] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's naming
                recorder.requests.append(self.path)
                path = self.path.split("?", 1)[0]
                if "://" in path:  # a proxy's request names the whole URL
                    path = "/" + path.split("/", 3)[3]
                page = pages.get(path)
                body = json.dumps(page).encode()
                self.send_response(404 if page is None else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def daemon() -> Iterator[Recorder]:
    server = Recorder({"/books/json": BOOKS, "/commit_point/json": COMMIT_POINT})
    yield server
    server.close()


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    """A proxy in the environment (both spellings, as curl reads them), no NO_PROXY."""
    server = Recorder({"/books/json": PROXIED, "/commit_point/json": COMMIT_POINT})
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{server.port}")
    for name in ("no_proxy", "NO_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    yield server
    server.close()


@pytest.fixture(autouse=True)
def no_name_lookups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the tests off the network whatever the code under test does: a name under
    ``.invalid`` fails at once instead of asking a DNS server."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def forms(port: int) -> list[str]:
    """The ways a user writes the address of the status server on ``port`` here."""
    return [
        f"127.0.0.1:{port}",
        f"http://127.0.0.1:{port}",
        f"http://127.0.0.1:{port}/",
        f"HTTP://LOCALHOST:{port}//",
        f"localhost:{port}/books/json",  # a page's address, pasted from a browser
        f"  http://127.0.0.1:{port}/commit_point/json  ",
    ]


# --- the URL forms -----------------------------------------------------------------------------

hosts = st.one_of(
    st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,20}){0,3}", fullmatch=True),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda address: f"[{address}]"),
)
pages = st.sampled_from(
    ["", "/", "//", "/books/json", "/server_info/plain", "/metrics", "/ready", "/health/"]
)


@given(host=hosts, port=st.integers(1, 65535), page=pages, scheme=st.sampled_from(["", "http://"]))
def test_every_form_of_one_address_names_the_same_server(
    host: str, port: int, page: str, scheme: str
) -> None:
    canonical = status_base_url(f"http://{host}:{port}")
    assert canonical == f"http://{host}:{port}"
    assert status_base_url(f"{scheme}{host}:{port}{page}") == canonical
    assert status_base_url(canonical) == canonical  # idempotent


@given(host=hosts, prefix=st.from_regex(r"(/[a-z0-9_.-]{1,10}){1,3}", fullmatch=True))
def test_a_path_is_a_prefix_the_pages_live_under(host: str, prefix: str) -> None:
    """A reverse proxy's mount point stays; only a trailing slash and a page's own address
    are cut."""
    expected = f"https://{host}:8443{prefix.rstrip('/')}"
    assert status_base_url(f"https://{host}:8443{prefix}/") == expected
    assert status_base_url(f"https://{host}:8443{prefix}/books/json") == expected


def test_the_default_ports() -> None:
    assert status_base_url("dory-host") == "http://dory-host:9090"  # Dory's default port
    assert status_base_url("http://dory-host") == "http://dory-host:80"  # a URL keeps its own
    assert status_base_url("https://dory-host/") == "https://dory-host:443"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no host"),
        ("http://", "no host"),
        ("ftp://host:21", "use http://HOST:PORT"),
        ("host:port", "not a status URL"),
        ("host:70000", "not a status URL"),
        ("http://user:secret@host:9090", "user name or password"),
        ("http://host:9090/?after=now", r"without \? or #"),
    ],
)
def test_what_is_not_a_status_url_is_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(StatusUrlError, match=why):
        status_base_url(text)


def test_the_command_line_refuses_a_bad_url_as_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["status", "--url", "ftp://host:21"])
    assert exited.value.code == 2
    assert "use http://HOST:PORT or HOST:PORT" in capsys.readouterr().err


@given(st.ip_addresses())
def test_loopback_is_the_addresses_python_calls_loopback(address: Any) -> None:
    assert is_loopback(str(address)) == address.is_loopback


def test_loopback_names_and_mapped_addresses() -> None:
    assert is_loopback("localhost")
    assert is_loopback("LOCALHOST.")
    assert is_loopback("status.localhost")
    assert is_loopback("::ffff:127.0.0.1")
    assert is_loopback("127.8.9.10")
    assert not is_loopback("localhost.example.com")
    assert not is_loopback(REMOTE_HOST)
    assert not is_loopback(str(ipaddress.ip_address("10.0.0.1")))


# --- every client, every form, a proxy in the environment ---------------------------------------


def test_status_reads_the_daemon_in_every_form(
    daemon: Recorder, proxy: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    for url in forms(daemon.port):
        assert main(["status", "books", "--json", "--url", url]) == 0, url
        assert json.loads(capsys.readouterr().out) == BOOKS
    assert proxy.requests == []


def test_wait_reads_the_daemon_in_every_form(daemon: Recorder, proxy: Recorder) -> None:
    for url in forms(daemon.port):
        assert main(["wait", "--url", url, "--timeout", "0", "--quiet"]) == 0, url
    assert proxy.requests == []
    assert all(path.startswith("/commit_point/json?after=") for path in daemon.requests)


def test_the_audit_reads_the_books_in_every_form(daemon: Recorder, proxy: Recorder) -> None:
    for url in forms(daemon.port):
        assert fetch_books(url) == BOOKS, url
    assert proxy.requests == []


def test_the_demo_and_the_benchmark_read_the_daemon_not_the_proxy(
    daemon: Recorder, proxy: Recorder, tmp_path: Path
) -> None:
    assert demo_get_json(f"http://127.0.0.1:{daemon.port}", "/books/json") == BOOKS
    bench = BenchDaemon(DaemonConfig("127.0.0.1:1", str(tmp_path), http_port=daemon.port), tmp_path)
    assert bench.books("absent").accepted == 0
    assert proxy.requests == []
    assert daemon.requests == ["/books/json", "/books/json"]


def test_a_status_server_on_another_host_is_read_through_the_proxy(
    proxy: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    """A daemon on another host is reached as curl would reach it: through HTTP_PROXY."""
    remote = f"{REMOTE_HOST}:9090"
    assert main(["status", "books", "--json", "--url", remote]) == 0
    assert json.loads(capsys.readouterr().out) == PROXIED
    assert main(["wait", "--url", remote, "--timeout", "0", "--quiet"]) == 0
    assert fetch_books(f"http://{remote}/") == PROXIED
    assert proxy.requests[0] == f"http://{remote}/books/json"
    assert proxy.requests[1].startswith(f"http://{remote}/commit_point/json?after=now")
    assert proxy.requests[2] == f"http://{remote}/books/json"


def test_no_proxy_and_loopback_decide_which_requests_use_the_proxy(
    proxy: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy_url = f"http://127.0.0.1:{proxy.port}"
    assert proxies_for("http://127.0.0.1:9090") == {}
    assert proxies_for("http://[::1]:9090") == {}
    assert proxies_for(f"http://{REMOTE_HOST}:9090")["http"] == proxy_url
    monkeypatch.setenv("no_proxy", REMOTE_HOST)
    # urllib's ProxyHandler applies NO_PROXY per request, as curl does.
    assert proxies_for(f"http://{REMOTE_HOST}:9090")["no"] == REMOTE_HOST


# --- what each client says when it cannot read the daemon -------------------------------------


def test_unreachable_and_wrong_answers_are_named(daemon: Recorder) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    with pytest.raises(DaemonUnreachable, match=rf"cannot reach the daemon at .*:{closed_port}/"):
        StatusHttp(f"127.0.0.1:{closed_port}").get_json("/books/json")
    with pytest.raises(NotAStatusPage, match=r"/metrics does not exist \(404\)"):
        StatusHttp(f"127.0.0.1:{daemon.port}").get_json("/metrics")
    with pytest.raises(BooksUnavailable, match="cannot reach the daemon"):
        fetch_books(f"127.0.0.1:{closed_port}")


def test_not_http_at_all_is_named_as_such() -> None:
    """A port that answers something other than HTTP (Kafka's, say)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def answer_garbage() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(4096)
                connection.sendall(b"\x00\x00\x00\x10not http at all\n")

        thread = threading.Thread(target=answer_garbage, daemon=True)
        thread.start()
        with pytest.raises(NotAStatusPage, match="did not answer HTTP"):
            StatusHttp(f"127.0.0.1:{port}", timeout_s=60).get_json("/books/json")
        thread.join(60)


# --- one client: nothing else in the package speaks HTTP to the status port -------------------

HTTP_CLIENT_MODULES = {"urllib.request", "http.client", "aiohttp.client"}
#: Clients of other servers than a daemon's status port, and which.
OTHER_SERVERS = {"testing/spark_cluster.py": "the Spark standalone master's /json/"}


def test_no_other_module_has_an_http_client_of_its_own() -> None:
    """Every caller goes through ``pydory.status_client`` (the status server itself, under
    ``status/``, serves with aiohttp and is no client)."""
    package = Path(pydory.__file__).parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "status_client.py" or str(path.relative_to(package)) in OTHER_SERVERS:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Attribute) and node.attr in ("ClientSession", "urlopen"):
                names = [node.attr]
            bad = [n for n in names if n in HTTP_CLIENT_MODULES or n.endswith("ClientSession")]
            bad += [n for n in names if n in ("urlopen", "ClientSession")]
            if bad:
                offenders.append(f"{path.relative_to(package)}:{node.lineno}: {bad[0]}")
    assert offenders == []
