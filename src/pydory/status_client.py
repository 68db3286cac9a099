"""The one HTTP client of a daemon's status port, for every tool that reads it.

``pydory status``, ``wait`` and ``reload``, ``pydory pipeline audit --status``, the demo
and the benchmark all read the daemon's JSON pages through :class:`StatusHttp`, so they
take the same URL forms, treat proxies the same way and say the same thing when the
daemon cannot be read.

URL forms (:func:`status_base_url`), all meaning the same server:

- ``HOST:PORT``, ``HOST`` (port 9090, Dory's default), ``[::1]:PORT``: plain HTTP;
- ``http://HOST:PORT`` or ``https://HOST:PORT``, with or without a trailing slash; a URL
  without a port keeps its scheme's (80, 443), as every HTTP client reads it;
- a path is a prefix the pages live under (a reverse proxy's mount point), except that
  a page's own address (``http://HOST:PORT/books/json``, as pasted from a browser) means
  its server.

Proxies: a status URL on a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``) is
never sent through a proxy, whatever ``HTTP_PROXY`` says: the daemon is on this host, and
a proxy would see (and could answer for) a local service. Any other host follows the
environment as curl and every urllib program do: ``HTTP_PROXY``/``HTTPS_PROXY``, minus
the hosts ``NO_PROXY`` names.

Standard library only, and ``urllib.request`` (which pulls in ``http.client``, ``email``
and ``ssl``) is imported only when a request is made: the commands that import this
module must start fast (``pydory --help`` reads no page).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydory.errors import PydoryError

if TYPE_CHECKING:
    import urllib.request

__all__ = [
    "DEFAULT_PORT",
    "DaemonUnreachable",
    "NotAStatusPage",
    "PageNotFound",
    "StatusHttp",
    "StatusUrlError",
    "is_loopback",
    "status_base_url",
]

#: Dory's default httpInterface port: a bare ``HOST`` means this port.
DEFAULT_PORT = 9090
DEFAULT_TIMEOUT_S = 10.0

#: The end of a page's address: what :func:`status_base_url` strips to find the server.
_PAGE_SUFFIX = re.compile(
    r"/(?:(?:server_info|counters|discards|queues|metadata_fetch_time|books|config"
    r"|commit_point|dashboard)/(?:json|plain)|metrics|health|ready)$"
)
_LOCALHOST_NAMES = ("localhost", "localhost.")


class StatusUrlError(PydoryError, ValueError):
    """The text cannot name a status server; the message says what is wrong with it."""


class DaemonUnreachable(PydoryError):
    """Nothing answered at the status URL: the daemon is down, or the URL is wrong."""


class NotAStatusPage(PydoryError):
    """Something answered, but not with a pydory/Dory status page (wrong port?)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        #: The HTTP status of the answer, when it was an HTTP error.
        self.status = status


class PageNotFound(NotAStatusPage):
    """The server answered 404: it serves no such page (an older pydory, or not pydory)."""


def status_base_url(text: str) -> str:
    """The status server's base URL, ``scheme://host:port[/prefix]``, from any of the forms
    the module docstring lists; raises :class:`StatusUrlError` naming what is wrong."""
    given = text.strip()
    bare = "://" not in given
    try:
        parts = urllib.parse.urlsplit(f"http://{given}" if bare else given)
        port = parts.port
    except ValueError as error:  # a port that is not a number in range, a bad IPv6 literal
        raise StatusUrlError(f"not a status URL: {text!r} ({error})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise StatusUrlError(f"not a status URL: {text!r} (use http://HOST:PORT or HOST:PORT)")
    host = parts.hostname
    if not host:
        raise StatusUrlError(f"not a status URL: {text!r} (no host; e.g. 127.0.0.1:9090)")
    if parts.username is not None or parts.password is not None:
        raise StatusUrlError(
            f"not a status URL: {text!r} (a user name or password in the URL is not supported)"
        )
    if parts.query or parts.fragment:
        raise StatusUrlError(
            f"not a status URL: {text!r} (give the server's address, without ? or #)"
        )
    if port is None:
        port = DEFAULT_PORT if bare else (443 if scheme == "https" else 80)
    netloc_host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{netloc_host}:{port}{_prefix_of(parts.path)}"


def _prefix_of(path: str) -> str:
    """The path the pages live under: no trailing slash, a page's own address cut off."""
    prefix = path.rstrip("/")
    return _PAGE_SUFFIX.sub("", prefix).rstrip("/")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 without brackets) is this host's
    loopback: ``localhost`` (and its subdomains, RFC 6761), ``127.0.0.0/8``, ``::1``."""
    import ipaddress  # lazy: see the module docstring

    name = host.lower()
    if name in _LOCALHOST_NAMES or name.rstrip(".").endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def proxies_for(base_url: str) -> dict[str, str]:
    """The proxies a request to ``base_url`` may use: none for a loopback host, else the
    environment's (``urllib.request.getproxies``; ``NO_PROXY`` is applied per request by
    urllib's ProxyHandler)."""
    import urllib.request  # lazy: see the module docstring

    host = urllib.parse.urlsplit(base_url).hostname or ""
    return {} if is_loopback(host) else urllib.request.getproxies()


class StatusHttp:
    """GETs pages from one daemon's status server (stdlib only)."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """``url`` in any form :func:`status_base_url` takes (raises StatusUrlError);
        each request waits ``timeout_s`` unless it says otherwise."""
        self.base_url = status_base_url(url)
        self.timeout_s = timeout_s
        self._opener: urllib.request.OpenerDirector | None = None

    def url_of(self, path: str, query: Mapping[str, str] | None = None) -> str:
        """The full URL of the page at ``path`` (``/books/json``), with its query."""
        url = self.base_url + "/" + path.lstrip("/")
        return f"{url}?{urllib.parse.urlencode(query)}" if query else url

    def get_json(
        self, path: str, query: Mapping[str, str] | None = None, timeout_s: float | None = None
    ) -> Any:
        """The JSON document at ``path``; raises DaemonUnreachable, PageNotFound (404) or
        NotAStatusPage (another HTTP error, or not JSON)."""
        url = self.url_of(path, query)
        body = self._get(url, self.timeout_s if timeout_s is None else timeout_s)
        try:
            return json.loads(body)
        except ValueError:
            raise NotAStatusPage(f"{url} did not answer with JSON (is this pydory?)") from None

    def get_page(self, path: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Like :meth:`get_json`, for a page that is a JSON object (every status page)."""
        page = self.get_json(path, timeout_s=timeout_s)
        if not isinstance(page, dict):
            raise NotAStatusPage(f"{self.url_of(path)} did not answer with a JSON object")
        return page

    def _get(self, url: str, timeout_s: float) -> bytes:
        import http.client  # lazy: see the module docstring
        import urllib.error

        try:
            with self._open(url, timeout_s) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as error:
            if error.code == 404:
                raise PageNotFound(f"{url} does not exist (404): is this pydory?", 404) from None
            raise NotAStatusPage(
                f"{url} answered HTTP {error.code} {error.reason}", error.code
            ) from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, TimeoutError):
                raise _timed_out(url, timeout_s) from None
            reason = getattr(error.reason, "strerror", None) or error.reason
            raise DaemonUnreachable(f"cannot reach the daemon at {url}: {reason}") from None
        except TimeoutError:
            raise _timed_out(url, timeout_s) from None
        except ConnectionError as error:
            raise DaemonUnreachable(
                f"cannot reach the daemon at {url}: {error.strerror or error}"
            ) from None
        except http.client.HTTPException as error:  # e.g. a Kafka port: not HTTP at all
            raise NotAStatusPage(
                f"{url} did not answer HTTP ({type(error).__name__}): is this the status port?"
            ) from None

    def _open(self, url: str, timeout_s: float) -> Any:
        import urllib.request  # lazy: see the module docstring

        if self._opener is None:
            handler = urllib.request.ProxyHandler(proxies_for(self.base_url))
            self._opener = urllib.request.build_opener(handler)
        return self._opener.open(url, timeout=timeout_s)


def _timed_out(url: str, timeout_s: float) -> DaemonUnreachable:
    return DaemonUnreachable(f"the daemon at {url} did not answer within {timeout_s:g} s")
