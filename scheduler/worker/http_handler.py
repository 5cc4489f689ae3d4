"""``builtin:http``: call a URL as a job, without letting a schedule reach what it should not.

A schedule's author chooses the URL, but the request leaves from inside the worker's network, next to
cloud metadata endpoints and internal services. So every request this handler makes, the first and
every redirect hop, goes through :class:`PinnedTransport`, which resolves the host once, refuses it if
the literal address or any resolved address is loopback, private, link-local, CGNAT, multicast,
unspecified or reserved (unless ``SCHEDULER_HTTP_ALLOWLIST`` names the host or a network containing
the address), and then connects to exactly the address it checked. The response decides the outcome
as docs/architecture.md says: 2xx succeeds, 408, 429, 5xx, timeouts and connection errors are worth retrying,
any other 4xx is not.

DNS pinning: the transport rewrites the request URL to the checked IP address and keeps the original
name in the ``Host`` header and as the TLS server name (httpcore's ``sni_hostname`` extension), so
certificate checks still apply to the name. httpx therefore never resolves the name itself, which
closes the window in which a rebinding DNS server could answer "public" to the check and "private" to
the connection. Doing this in a transport rather than around ``client.send`` means no request of the
client can skip the check, and redirects are followed by hand, so each hop is checked the same way
and counted (at most five).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from scheduler.worker.builtin_payloads import http_problem
from scheduler.worker.handlers import HandlerError, JobContext, NonRetryableError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Resolves (host, port) to address strings; injectable so tests need no DNS.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

ALLOWLIST_VARIABLE = "SCHEDULER_HTTP_ALLOWLIST"
DEFAULT_TIMEOUT_S = 30.0
MAX_REDIRECTS = 5
MAX_BODY_BYTES = 64 * 1024
USER_AGENT = "kafka-pg-scheduler (builtin:http)"

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Credentials are for the origin the author wrote; a redirect elsewhere must not carry them along.
# They hide in headers of any name (X-Api-Key, X-Auth-Token, a webhook's signature), so across
# origins only headers that describe the request, never who sends it, go on.
_CROSS_ORIGIN_HEADERS = frozenset(
    {"accept", "accept-encoding", "accept-language", "user-agent", "content-type", "content-length",
     "content-encoding", "content-language", "transfer-encoding"}
)  # fmt: skip
_CONTENT_HEADERS = ("content-type", "content-length", "content-encoding", "transfer-encoding")

_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")  # Linux connects 0.0.0.0 to the local host
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_PRIVATE = tuple(
    ipaddress.ip_network(cidr) for cidr in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)


class TargetRefused(NonRetryableError):
    """The URL points somewhere the worker may not send requests; the same URL will be refused again."""


# --- which addresses are refused -----------------------------------------------------------------


def classify_address(address: IPAddress) -> str | None:
    """Why ``address`` is no public target, as a phrase ("a loopback address"), or None if it is one."""
    if isinstance(address, ipaddress.IPv6Address):
        # An IPv6 address that carries an IPv4 one reaches that IPv4 host, so judge the IPv4 host.
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            reason = classify_address(embedded)
            return None if reason is None else f"an IPv6 address embedding {embedded}, {reason}"
    if address.is_unspecified or address in _THIS_NETWORK:
        return "an unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address in _CGNAT:
        return "a carrier-grade NAT (100.64.0.0/10) address"
    if any(address in network for network in _PRIVATE):
        return "a private address"
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return "a site-local address"
    if address.is_reserved or not address.is_global:
        # Broadcast, documentation, benchmarking, protocol-assignment and unallocated ranges.
        return "a reserved address"
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return address.sixtofour


def _parse_ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


async def resolve_host(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to, in the resolver's order, without duplicates."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class AddressPolicy:
    """The allow-list: exact host names, ``*.domain`` suffixes and networks (a bare IP is a /32 or /128)."""

    hosts: frozenset[str] = frozenset()
    domain_suffixes: tuple[str, ...] = ()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_allowlist(cls, entries: Iterable[str]) -> AddressPolicy:
        """Parse ``SCHEDULER_HTTP_ALLOWLIST`` entries; a malformed network raises ValueError at start-up
        rather than silently becoming a host name that never matches."""
        hosts: set[str] = set()
        suffixes: list[str] = []
        networks: list[IPNetwork] = []
        for raw in entries:
            entry = raw.strip().lower().rstrip(".")
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                if "/" in entry:
                    raise ValueError(f"{ALLOWLIST_VARIABLE}: {raw!r} is not a valid network") from None
            if entry.startswith("*."):
                suffixes.append(entry[1:])
            else:
                hosts.add(entry)
        return cls(frozenset(hosts), tuple(suffixes), tuple(networks))

    def allows_host(self, host: str) -> bool:
        name = host.lower().rstrip(".")
        return name in self.hosts or name.endswith(self.domain_suffixes)

    def refusal(self, address: IPAddress) -> str | None:
        """Why a connection to ``address`` is refused, or None if it is public or allow-listed."""
        candidates: list[IPAddress] = [address]
        if isinstance(address, ipaddress.IPv6Address) and (embedded := _embedded_ipv4(address)):
            candidates.append(embedded)
        if any(candidate in network for candidate in candidates for network in self.networks):
            return None
        return classify_address(address)

    async def vet(self, host: str, port: int, resolver: Resolver = resolve_host) -> list[IPAddress]:
        """The addresses to connect to for ``host``, all checked; TargetRefused if any is refused.

        A name whose answers mix public and private addresses is refused outright rather than
        filtered: that is either an attack or a misconfiguration, and both deserve a loud failure.
        """
        literal = _parse_ip(host)
        if literal is not None:
            reason = self.refusal(literal)
            if reason is not None:
                raise TargetRefused(
                    f"refused: {literal} is {reason} (allow-list it with {ALLOWLIST_VARIABLE})"
                )
            return [literal]
        try:
            answers = await resolver(host, port)
        except OSError as exc:  # socket.gaierror: a DNS outage may pass, so this is retryable
            raise HandlerError(f"cannot resolve {host}: {exc}", error_class="DNSError") from exc
        addresses = [ipaddress.ip_address(answer) for answer in answers]
        if not addresses:
            raise HandlerError(f"cannot resolve {host}: no addresses", error_class="DNSError")
        if self.allows_host(host):
            return addresses
        for address in addresses:
            reason = self.refusal(address)
            if reason is not None:
                raise TargetRefused(
                    f"refused: {host} resolves to {address}, {reason} "
                    f"(allow-list the host or the address with {ALLOWLIST_VARIABLE})"
                )
        return addresses


# --- the transport that checks and pins ----------------------------------------------------------


class PinnedTransport(httpx.AsyncBaseTransport):
    """Checks every request's target with the policy and connects only to the checked addresses."""

    def __init__(self, policy: AddressPolicy, resolver: Resolver, inner: httpx.AsyncBaseTransport) -> None:
        self._policy = policy
        self._resolver = resolver
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.raw_host.decode("ascii")  # IDNA-encoded, as DNS wants it
        port = request.url.port or (443 if request.url.scheme == "https" else 80)
        addresses = await self._policy.vet(host, port, self._resolver)
        extensions = dict(request.extensions)
        if _parse_ip(host) is None:
            extensions["sni_hostname"] = host
        last_error: httpx.ConnectError | None = None
        # Like a browser, try the next checked address when one does not accept connections
        # (a name answering ::1 and 127.0.0.1 with a server on only one of them).
        for address in addresses:
            pinned = httpx.Request(
                request.method,
                request.url.copy_with(host=str(address)),
                headers=request.headers,  # already holds Host: <the original name>
                stream=request.stream,
                extensions=extensions,
            )
            try:
                return await self._inner.handle_async_request(pinned)
            except httpx.ConnectError as exc:
                last_error = exc
        assert last_error is not None  # vet() never returns an empty list
        raise last_error

    async def aclose(self) -> None:
        await self._inner.aclose()


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Loading the CA bundle takes milliseconds; a context is safe to share, so load it once.
    return httpx.create_ssl_context()


# --- the handler ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpRequest:
    """A validated ``builtin:http`` payload."""

    url: httpx.URL
    method: str
    headers: httpx.Headers
    content: bytes | None
    timeout: float

    @classmethod
    def from_payload(cls, payload: Any) -> HttpRequest:
        """Validate up front: a malformed payload fails the same way on every attempt, so it must be
        non-retryable here rather than surface later as a transport error that looks transient.

        Errors name the field and say what is wrong with it, never its value: they are stored in
        the run, the dead letter and the logs, and a payload may carry a token in any field."""
        if problem := http_problem(payload):  # the checks a schedule's creation makes too
            raise NonRetryableError(problem)
        try:
            url = httpx.URL(payload["url"])
        except httpx.InvalidURL as exc:
            # httpx's reason quotes the offending part of the URL after a colon.
            reason = str(exc).split(":", 1)[0].strip() or type(exc).__name__
            raise NonRetryableError(f"builtin:http: the url is not a valid URL ({reason})") from None
        _check_scheme(url)
        method = payload.get("method", "GET")
        headers = httpx.Headers({"User-Agent": USER_AGENT})
        headers.update(payload.get("headers") or {})
        body = payload.get("body")
        content: bytes | None
        if body is None:
            content = None
        elif isinstance(body, str):
            content = body.encode()
        else:
            content = json.dumps(body, separators=(",", ":")).encode()
            headers.setdefault("Content-Type", "application/json")
        timeout = payload.get("timeout", DEFAULT_TIMEOUT_S)
        return cls(url, method.upper(), headers, content, float(timeout))


class HttpHandler:
    """The ``builtin:http`` handler: one request (plus redirects), returning status and body text."""

    def __init__(
        self, allowlist: Sequence[str] | AddressPolicy = (), *, resolver: Resolver = resolve_host
    ) -> None:
        self.policy = (
            allowlist if isinstance(allowlist, AddressPolicy) else AddressPolicy.from_allowlist(allowlist)
        )
        self._resolver = resolver

    async def __call__(self, ctx: JobContext) -> dict[str, Any]:
        request = HttpRequest.from_payload(ctx.payload)
        # The payload timeout bounds the whole job (DNS, every hop, the body), not each socket
        # operation, so a server that drips bytes cannot hold a worker slot for ever.
        try:
            async with asyncio.timeout(request.timeout):
                return await self._fetch(request, ctx)
        except TimeoutError:
            raise HandlerError(
                f"timed out after {request.timeout:g} s: {request.method} {_shown(request.url)}",
                error_class="Timeout",
            ) from None

    async def _fetch(self, request: HttpRequest, ctx: JobContext) -> dict[str, Any]:
        transport = PinnedTransport(
            self.policy,
            self._resolver,
            # No keep-alive: a pooled connection is keyed by the pinned IP and could be reused for
            # another name on the same IP with the first name's TLS session.
            httpx.AsyncHTTPTransport(verify=_ssl_context(), limits=httpx.Limits(max_keepalive_connections=0)),
        )
        headers = request.headers.copy()
        headers.setdefault("Idempotency-Key", ctx.idempotency_key)  # lets the receiver drop duplicates
        hop = _Hop(request.method, request.url, headers, request.content)
        # trust_env=False: an HTTP(S)_PROXY from the environment would connect for us and bypass the
        # checks, and .netrc credentials must not be sent to a URL a schedule chose.
        async with httpx.AsyncClient(
            transport=transport, timeout=request.timeout, follow_redirects=False, trust_env=False
        ) as client:
            for redirects in range(MAX_REDIRECTS + 1):
                response = await _send(client, hop.build(client))
                try:
                    location = response.headers.get("location")
                    if response.status_code not in _REDIRECTS or location is None:
                        return await _outcome(response, hop.url)
                    if redirects == MAX_REDIRECTS:
                        raise NonRetryableError(
                            f"more than {MAX_REDIRECTS} redirects from {_shown(request.url)}"
                        )
                    hop = hop.redirected(response.status_code, location)
                finally:
                    await response.aclose()
        raise AssertionError("unreachable: the loop returns or raises")


@dataclass(frozen=True)
class _Hop:
    """One request of a redirect chain."""

    method: str
    url: httpx.URL
    headers: httpx.Headers
    content: bytes | None

    def build(self, client: httpx.AsyncClient) -> httpx.Request:
        return client.build_request(self.method, self.url, headers=self.headers, content=self.content)

    def redirected(self, status: int, location: str) -> _Hop:
        try:
            target = self.url.join(location)
        except httpx.InvalidURL as exc:
            raise NonRetryableError(f"bad redirect {location!r} from {_shown(self.url)}: {exc}") from None
        _check_scheme(target)
        method, headers, content = self.method, self.headers.copy(), self.content
        if _origin(target) != _origin(self.url):
            for name in [name for name in headers if name.lower() not in _CROSS_ORIGIN_HEADERS]:
                headers.pop(name, None)
        # As browsers do: 303 always, and 301/302 after a POST, become a GET without a body.
        if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
            method, content = "GET", None
            for name in _CONTENT_HEADERS:
                headers.pop(name, None)
        return _Hop(method, target, headers, content)


async def _send(client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    shown = f"{request.method} {_shown(request.url)}"
    try:
        return await client.send(request, stream=True)
    except httpx.TimeoutException as exc:
        raise HandlerError(f"timed out: {shown}: {type(exc).__name__}", error_class="Timeout") from exc
    except httpx.LocalProtocolError as exc:  # our request is malformed: it will be next time too
        # Not the exception's text: h11 quotes the offending header value in it.
        raise NonRetryableError(
            f"cannot send {shown}: the request is not valid HTTP (most often a header name or value)",
            error_class="HTTPProtocolError",
        ) from exc
    except httpx.TransportError as exc:
        detail = " ".join(str(exc).split()) or "no detail"
        name = type(exc).__name__
        raise HandlerError(f"{name} for {shown}: {detail}", error_class=name) from exc


async def _outcome(response: httpx.Response, url: httpx.URL) -> dict[str, Any]:
    status = response.status_code
    if 200 <= status < 300:
        return {"status": status, "body": await _read_text(response)}
    phrase = f" {response.reason_phrase}" if response.reason_phrase else ""
    message = f"HTTP {status}{phrase} from {_shown(url)}"
    if status in (408, 429) or status >= 500:
        raise HandlerError(message, error_class=f"HTTP{status}")
    if 400 <= status < 500:
        raise NonRetryableError(message, error_class=f"HTTP{status}")
    raise NonRetryableError(
        f"{message} (not a success, nor a redirect to follow)", error_class=f"HTTP{status}"
    )


async def _read_text(response: httpx.Response) -> str:
    # Stop reading at the cap instead of downloading a body nobody will store.
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= MAX_BODY_BYTES:
            break
    return bytes(body[:MAX_BODY_BYTES]).decode(response.encoding or "utf-8", errors="replace")


def _check_scheme(url: httpx.URL) -> None:
    if url.scheme not in ("http", "https") or not url.host:
        # Not the URL itself: it may be anything a payload holds (or a redirect points to).
        raise TargetRefused("refused: only http and https URLs with a host are allowed")


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port


def _shown(url: httpx.URL) -> str:
    # Error messages end up in logs, run records and dead letters: the origin says which endpoint
    # failed; the path and query are the payload's, and may hold a secret (a webhook's token).
    rest = "/…" if url.raw_path not in (b"", b"/") else ""
    return f"{url.scheme}://{url.netloc.decode('ascii')}{rest}"  # netloc: host and port, no userinfo
