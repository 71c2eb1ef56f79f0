"""Running one probe: exec through the CRI, httpGet, tcpSocket and grpc from the node.

Each kind answers Success or Failure with an output line, as the Go prober's
(pkg/probe/...) do, or raises ``ProbeError`` when the probe cannot be run at all
(an unknown port name, say): the Go worker throws such results away. The same
HTTP and exec runners serve the lifecycle hooks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
import trio

from trio_kubelet.core.observed import ProbeResult
from trio_kubelet.model.pod import (
    Container,
    GRPCAction,
    HTTPGetAction,
    Probe,
    TCPSocketAction,
)
from trio_kubelet.node.registration import KUBERNETES_VERSION
from trio_kubelet.runtime.client import CRIClient, HealthCheckError, grpc_health_check
from trio_kubelet.runtime.errors import CRIDeadlineExceeded, CRIError

# The Go prober's User-Agent names the Kubernetes major.minor it speaks for.
USER_AGENT = "kube-probe/" + KUBERNETES_VERSION.removeprefix("v").rsplit(".", 1)[0]
MAX_REDIRECTS = 10
MAX_BODY = 10 * 1024  # how much of a response body ends up in the probe's output


class ProbeError(Exception):
    """The probe could not run; its result is discarded (and reported as an event)."""


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    """A probe's result and output; ``warning`` marks a success to report (Go's
    probe.Warning: the prober records a ProbeWarning event and counts a success)."""

    result: ProbeResult
    output: str = ""
    warning: bool = False


def resolve_port(port: int | str, container: Container) -> int:
    """A port number, or the number of the container port with that name."""
    if isinstance(port, int) or port.isdigit():
        number = int(port)
    else:
        number = next((p.container_port for p in container.ports if p.name == port), 0)
        if not number:
            raise ProbeError(f"port named {port!r} not found in container {container.name!r}")
    if not 0 < number < 65536:
        raise ProbeError(f"invalid port number: {number}")
    return number


def http_url(action: HTTPGetAction, host: str, port: int) -> str:
    path = action.path if action.path.startswith("/") else "/" + action.path
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"{action.scheme.lower()}://{host}:{port}{path}"


def http_headers(action: HTTPGetAction, user_agent: str = USER_AGENT) -> dict[str, str]:
    """The user's headers over the prober's defaults (User-Agent, Accept)."""
    headers = {"User-Agent": user_agent, "Accept": "*/*"}
    for header in action.http_headers:
        for existing in [k for k in headers if k.lower() == header.name.lower()]:
            del headers[existing]
        headers[header.name] = header.value
    return headers


def node_http_client() -> httpx.AsyncClient:
    """The client probes and hooks use: no pooled connections, no certificate checks, no
    timeout of its own (callers bound the request), redirects left to `get_within_host`.

    A stale pooled connection would fail a healthy container; Go verifies nothing either.
    """
    limits = httpx.Limits(max_keepalive_connections=0)
    return httpx.AsyncClient(verify=False, limits=limits, follow_redirects=False, timeout=None)


class RedirectLimitError(Exception):
    """More redirects than Go's HTTP client follows."""


@dataclass(frozen=True, slots=True)
class HTTPAnswer:
    """The response that ended a GET: status and start of body (a redirect to another
    host ends it too)."""

    status_code: int
    body: str


async def get_within_host(
    http: httpx.AsyncClient, url: str, headers: Mapping[str, str]
) -> HTTPAnswer:
    """GET ``url``, following redirects only while they stay on its host.

    Raises ``httpx.HTTPError``, or ``RedirectLimitError`` after 10 redirects.
    """
    host = httpx.URL(url).host
    for _ in range(MAX_REDIRECTS + 1):
        response = await http.get(url, headers=dict(headers))
        body = (await response.aread())[:MAX_BODY].decode(errors="replace")
        location = response.headers.get("location")
        if not response.is_redirect or location is None:
            return HTTPAnswer(response.status_code, body)
        target = response.url.join(location)
        if target.host != host:
            return HTTPAnswer(response.status_code, body)
        url = str(target)
    raise RedirectLimitError(f"stopped after {MAX_REDIRECTS} redirects")


@dataclass(frozen=True, slots=True)
class ExecAnswer:
    """How a command run in a container ended: exit code (None: timed out) and output."""

    exit_code: int | None
    output: str


async def exec_in_container(
    cri: CRIClient, container_id: str, command: list[str], timeout: float
) -> ExecAnswer:
    """ExecSync ``command`` (``timeout`` 0: unbounded); ``ProbeError`` when it cannot run."""
    try:
        reply = await cri.exec_sync(container_id, command, timeout)
    except CRIDeadlineExceeded:
        return ExecAnswer(None, "")
    except CRIError as err:
        if "timeout" in err.message and "exceeded" in err.message:
            return ExecAnswer(None, "")
        raise ProbeError(str(err)) from err
    return ExecAnswer(reply.exit_code, (reply.stdout + reply.stderr).decode(errors="replace"))


def request_url(err: httpx.HTTPError, fallback: str) -> str:
    """The URL of the request that failed (a redirect's target, say), for the message."""
    try:
        return str(err.request.url)
    except RuntimeError:  # an error raised outside any request
        return fallback


class Prober:
    """Runs probes; one per agent, sharing its HTTP client."""

    def __init__(self, client: CRIClient) -> None:
        self._cri = client
        self._http = node_http_client()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def probe(
        self, probe: Probe, container: Container, container_id: str, pod_ip: str
    ) -> ProbeOutcome:
        """Run ``probe`` against ``container`` (instance ``container_id``, pod at ``pod_ip``)."""
        timeout = float(probe.timeout_seconds)
        if probe.exec is not None:
            return await self.exec(container_id, probe.exec.command, timeout)
        if probe.http_get is not None:
            return await self.http_get(probe.http_get, container, pod_ip, timeout)
        if probe.tcp_socket is not None:
            return await self.tcp_socket(probe.tcp_socket, container, pod_ip, timeout)
        assert probe.grpc is not None  # the model requires exactly one handler
        return await self.grpc(probe.grpc, pod_ip, timeout)

    async def exec(self, container_id: str, command: list[str], timeout: float) -> ProbeOutcome:
        """ExecSync in the container: exit code 0 succeeds; a timeout fails (ExecProbeTimeout)."""
        answer = await exec_in_container(self._cri, container_id, command, timeout)
        if answer.exit_code is None:
            return ProbeOutcome(ProbeResult.FAILURE, f"command {command!r} timed out")
        if answer.exit_code == 0:
            return ProbeOutcome(ProbeResult.SUCCESS, answer.output)
        return ProbeOutcome(ProbeResult.FAILURE, answer.output or f"exit code {answer.exit_code}")

    async def http_get(
        self, action: HTTPGetAction, container: Container, pod_ip: str, timeout: float
    ) -> ProbeOutcome:
        """GET the URL: 200-399 succeeds; redirects are followed only within the same host.

        A 3xx that ends the GET (a redirect to another host, or one without a Location) is
        a success with a warning, as Go's DoHTTPProbe.
        """
        port = resolve_port(action.port, container)
        url = http_url(action, action.host or pod_ip, port)
        try:
            with trio.fail_after(timeout):
                answer = await get_within_host(self._http, url, http_headers(action))
        except trio.TooSlowError:
            return ProbeOutcome(ProbeResult.FAILURE, f'Get "{url}": timeout after {timeout:g}s')
        except RedirectLimitError as err:
            return ProbeOutcome(ProbeResult.FAILURE, str(err))
        except httpx.HTTPError as err:
            return ProbeOutcome(
                ProbeResult.FAILURE, f'Get "{request_url(err, url)}": {err or type(err).__name__}'
            )
        if 300 <= answer.status_code < 400:
            return ProbeOutcome(
                ProbeResult.SUCCESS,
                f"Probe terminated redirects, Response body: {answer.body}",
                warning=True,
            )
        if 200 <= answer.status_code < 300:
            return ProbeOutcome(ProbeResult.SUCCESS, answer.body)
        return ProbeOutcome(
            ProbeResult.FAILURE, f"HTTP probe failed with statuscode: {answer.status_code}"
        )

    async def tcp_socket(
        self, action: TCPSocketAction, container: Container, pod_ip: str, timeout: float
    ) -> ProbeOutcome:
        """Open a TCP connection and close it again: connecting is success."""
        port = resolve_port(action.port, container)
        host = action.host or pod_ip
        try:
            with trio.fail_after(timeout):
                stream = await trio.open_tcp_stream(host, port)
        except trio.TooSlowError:
            return ProbeOutcome(ProbeResult.FAILURE, f"dial tcp {host}:{port}: i/o timeout")
        except OSError as err:
            return ProbeOutcome(ProbeResult.FAILURE, f"dial tcp {host}:{port}: {err}")
        await stream.aclose()
        return ProbeOutcome(ProbeResult.SUCCESS)

    async def grpc(self, action: GRPCAction, pod_ip: str, timeout: float) -> ProbeOutcome:
        """The standard gRPC health check: SERVING is success, anything else failure."""
        try:
            with trio.fail_after(math.ceil(timeout) + 1):  # grpclib's own timeout comes first
                status = await grpc_health_check(pod_ip, action.port, action.service or "",
                                                 timeout)
        except trio.TooSlowError:
            return ProbeOutcome(
                ProbeResult.FAILURE, f"timeout: health rpc did not complete within {timeout:g}s"
            )
        except HealthCheckError as err:
            return ProbeOutcome(ProbeResult.FAILURE, str(err))
        if status == "SERVING":
            return ProbeOutcome(ProbeResult.SUCCESS, status)
        return ProbeOutcome(ProbeResult.FAILURE, f"service unhealthy (responded with {status!r})")
