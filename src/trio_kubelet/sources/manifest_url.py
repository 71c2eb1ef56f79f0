"""The manifest URL pod source: static pods served over HTTP (``staticPodURL``).

What the URL means follows the Go kubelet (``pkg/kubelet/config/http.go``):

- the URL is fetched with a GET every ``httpCheckFrequency`` (``--http-check-frequency``,
  20 s), carrying every value of ``staticPodURLHeader`` (``--manifest-url-header``);
  redirects are followed, a request gives up after 10 s, a body may be at most 10 MiB;
- only a 200 answer counts; its body is one v1 Pod or a v1 PodList, JSON or YAML;
- a body byte for byte the same as the previous one is neither parsed nor applied again;
- the pods are static pods with the same defaults as a manifest file's
  (``static_files.static_pod``), ``kubernetes.io/config.source: http`` and the URL
  where a file's pods have the file's path.

Deliberate differences from the Go kubelet (the same as the file source's):

- **UID** from node + URL + namespace + name rather than from the content, so an edit
  of a served pod restarts only the containers that changed.
- **Last good set.** A failed request, a status other than 200, and a body that is
  empty or does not parse all keep the pods of the last good body while the problem
  is reported (Go keeps them too, except for an empty body, which it applies as an
  empty set, killing every pod on a server's glitch).
- **First answer.** The first answer, even a failure, is sent (as an empty set when
  there are no good pods yet) so that the source counts as having reported; Go sends
  nothing until a 200 answer parses.
- **Several YAML documents** (``---``) are accepted, as in a manifest file.
- Each distinct problem is logged once (and once when it is resolved) rather than
  three times and then at debug level.

A password in the URL never reaches a log line, a problem or a UID: the URL is shown
as ``user:***@host``, so rotating the password does not restart the pods either.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from urllib.parse import urlsplit

import httpx
import trio

from trio_kubelet.events import Event, ManifestProblem, PodSetUpdate
from trio_kubelet.model.pod import Pod
from trio_kubelet.sources.manifest_decode import MAX_MANIFEST_BYTES
from trio_kubelet.sources.static_files import (
    INLINE_PARSE_BYTES,
    Log,
    ParsedManifest,
    StaticPodReporter,
    parse_manifest,
    parse_off_loop,
)

logger = logging.getLogger(__name__)

SOURCE = "http"
REQUEST_TIMEOUT = 10.0  # seconds; Go's http.Client timeout for this source
MAX_BODY_BYTES = MAX_MANIFEST_BYTES  # Go's maxConfigLength

_TIMEOUTS: Mapping[type[httpx.TimeoutException], str] = {
    httpx.ConnectTimeout: "connecting",
    httpx.WriteTimeout: "sending the request",
    httpx.ReadTimeout: "waiting for the response",
    httpx.PoolTimeout: "waiting for a free connection",
}


class _FetchFailed(Exception):
    """The URL gave no usable body; the message says precisely why."""


def shown_url(url: str) -> str:
    """``url`` without its password (``user:***@host``), for logs, problems and UIDs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()


def _os_reason(exc: BaseException) -> str | None:
    """The operating system's words ("Connection refused") buried under httpx's wrappers."""
    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, OSError) and current.strerror:
            return current.strerror
        if isinstance(current, BaseExceptionGroup):
            current = current.exceptions[0]
        else:
            current = current.__cause__ or current.__context__
    return None


async def _fetch(client: httpx.AsyncClient, url: str, timeout: float) -> bytes:
    """The body of a 200 answer from ``url``; raises _FetchFailed otherwise."""
    try:
        async with client.stream("GET", url) as response:
            if response.status_code != httpx.codes.OK:
                status = f"{response.status_code} {response.reason_phrase}".strip()
                raise _FetchFailed(f"HTTP {status}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise _FetchFailed(f"response body is larger than {MAX_BODY_BYTES} bytes")
            return bytes(body)
    except httpx.TimeoutException as exc:
        doing = _TIMEOUTS.get(type(exc), "on the request")
        raise _FetchFailed(f"timed out {doing} (after {timeout:g} s)") from None
    except httpx.ConnectError as exc:
        raise _FetchFailed(f"cannot connect: {_os_reason(exc) or exc}") from None
    except httpx.RequestError as exc:
        reason = _os_reason(exc) or str(exc) or type(exc).__name__
        raise _FetchFailed(f"request failed: {reason}") from None
    except httpx.InvalidURL as exc:
        raise _FetchFailed(f"invalid URL: {exc}") from None


class _StaticPodURL:
    """The state between polls: the last body and what it gave, and the last good pods."""

    def __init__(self, url: str, node_name: str, log: Log, wall_clock: Callable[[], float]) -> None:
        self.url = url
        self.node_name = node_name
        self.body: bytes | None = None
        self.parsed = ParsedManifest()
        self.good: tuple[Pod, ...] = ()
        self.reported = False  # a good answer has been seen (and so sent)
        self.reporter = StaticPodReporter(SOURCE, "static pod URL", log, wall_clock)
        self.parser = trio.CapacityLimiter(1)

    async def answered(self, body: bytes) -> PodSetUpdate | None:
        """The update for a 200 answer, or None when nothing changed since the last one.

        A body bigger than ``INLINE_PARSE_BYTES`` is parsed in a worker thread, as a
        big manifest file is.
        """
        if body != self.body:
            self.body = body
            parse = partial(
                parse_manifest,
                body, self.url, self.node_name, source=SOURCE, container="response body",
            )
            self.parsed = (
                parse() if len(body) <= INLINE_PARSE_BYTES
                else await parse_off_loop(parse, self.parser)
            )
            if not self.parsed.problems:
                self.good = self.parsed.pods
                self.reported = True
        return self._report(self.parsed.problems)

    def failed(self, reason: str) -> PodSetUpdate | None:
        """The update for a request that gave no body, or None if it failed the same way."""
        return self._report((ManifestProblem(file=self.url, reason=reason),))

    def _report(self, problems: Sequence[ManifestProblem]) -> PodSetUpdate | None:
        stale = (self.url,) if problems and self.good else ()
        return self.reporter.update(self.good, problems, stale)


async def run_manifest_url(
    send: trio.MemorySendChannel[Event],
    url: str,
    headers: Mapping[str, Sequence[str]],
    node_name: str,
    *,
    check_frequency: float = 20.0,
    timeout: float = REQUEST_TIMEOUT,
    log: Log = logger,
    wall_clock: Callable[[], float] = time.time,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Send the pods served at ``url`` as ``PodSetUpdate(source="http")`` whenever they change.

    ``task_status.started()`` is called before the first request, so that a slow or
    unreachable server never holds up the agent's start. Nothing is sent before the
    first good answer (as in Go): until then the source has not reported, so pods
    adopted after a restart are not torn down for want of a URL. Problems are logged
    all the same. The URL is fetched again ``check_frequency`` seconds after each answer.
    ``wall_clock`` (epoch seconds) only stamps ``kubernetes.io/config.seen``.
    """
    shown = shown_url(url)
    source = _StaticPodURL(shown, node_name.lower(), log, wall_clock)
    request_headers = [(name, value) for name, values in headers.items() for value in values]
    log.info("polling static pod URL %s every %g s", shown, check_frequency)
    async with httpx.AsyncClient(
        headers=request_headers, timeout=timeout, follow_redirects=True
    ) as client:
        task_status.started()
        while True:
            try:
                body = await _fetch(client, url, timeout)
            except _FetchFailed as exc:
                update = source.failed(str(exc))
            else:
                update = await source.answered(body)
            # Until a first good answer the source has not reported: a restarted agent
            # must not tear down the pods it is adopting because the URL is unreachable.
            if update is not None and source.reported:
                await send.send(update)
            await trio.sleep(check_frequency)
