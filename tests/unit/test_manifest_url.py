"""The manifest URL source against a real local HTTP server: formats, headers, errors, polling.

The server runs in a thread (``http.server``) and the source polls it every 20 ms of
real time: real sockets need real time. "Nothing was sent" is decided without
sleeping on a guess: the source polls sequentially, so once the server has seen
two more requests, the answer to the first of them has been fully handled.
"""

from __future__ import annotations

import functools
import json
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import trio

from trio_kubelet.core.phase import CONFIG_SOURCE_ANNOTATION
from trio_kubelet.events import Event, PodSetUpdate
from trio_kubelet.sources import manifest_url
from trio_kubelet.sources.manifest_url import run_manifest_url, shown_url
from trio_kubelet.sources.static_files import (
    CONFIG_HASH_ANNOTATION,
    CONFIG_SEEN_ANNOTATION,
    ParsedManifest,
    static_pod_uid,
)

NODE = "node-1"
POLL = 0.02

POD_YAML = b"""\
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
    - name: app
      image: busybox:1.36
      command: [sleep, "3600"]
"""


POD_LIST_YAML = b"""\
apiVersion: v1
kind: PodList
items:
  - metadata: {name: a}
    spec: {containers: [{name: c, image: nginx}]}
  - metadata: {name: b}
    spec: {containers: [{name: c, image: nginx}]}
"""


def pod_list_json(*names: str) -> bytes:
    items = [
        {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
        for name in names
    ]
    return json.dumps({"apiVersion": "v1", "kind": "PodList", "items": items}).encode()


@dataclass
class Server:
    """What the test server answers, and the headers of every request it received."""

    url: str
    answer: tuple[int, bytes] = (200, POD_YAML)  # replaced whole: one atomic assignment
    required: dict[str, str] = field(default_factory=dict)
    requests: list[dict[str, list[str]]] = field(default_factory=list)

    async def wait_for_requests(self, count: int) -> None:
        with trio.fail_after(2):
            while len(self.requests) < count:
                await trio.sleep(0.005)


class _Handler(BaseHTTPRequestHandler):
    state: Server

    def do_GET(self) -> None:
        state = self.state
        state.requests.append({name: self.headers.get_all(name) or [] for name in self.headers})
        status, body = state.answer
        if any(self.headers.get(name) != value for name, value in state.required.items()):
            status, body = 401, b"missing credentials"
        if self.path == "/old":
            self.send_response(301)
            self.send_header("Location", "/pods")
            self.end_headers()
            return
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Keep the test output quiet."""


@pytest.fixture
def server() -> Iterator[Server]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    state = Server(url=f"http://127.0.0.1:{httpd.server_address[1]}/pods")
    _Handler.state = state
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join()


async def start_source(
    nursery: trio.Nursery,
    url: str,
    *,
    headers: dict[str, list[str]] | None = None,
    timeout: float = 1.0,
    log: logging.Logger | None = None,
) -> trio.MemoryReceiveChannel[Event]:
    send, receive_channel = trio.open_memory_channel[Event](100)
    await nursery.start(
        functools.partial(
            run_manifest_url,
            send,
            url,
            headers or {},
            "Node-1",
            check_frequency=POLL,
            timeout=timeout,
            log=log or logging.getLogger("test.url"),
            wall_clock=lambda: 1_700_000_000.0,
        )
    )
    return receive_channel


async def receive(updates: trio.MemoryReceiveChannel[Event]) -> PodSetUpdate:
    with trio.fail_after(2):
        event = await updates.receive()
    assert isinstance(event, PodSetUpdate)
    return event


async def nothing_new(server: Server, updates: trio.MemoryReceiveChannel[Event]) -> bool:
    """Whether two more polls sent nothing."""
    await server.wait_for_requests(len(server.requests) + 2)
    try:
        updates.receive_nowait()
    except trio.WouldBlock:
        return True
    return False


class ProblemLog(logging.Handler):
    """Collects the problems the source logs (before a good answer, they are not sent)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def first_problem(
    nursery: trio.Nursery, url: str, **kwargs: Any
) -> tuple[str, trio.MemoryReceiveChannel[Event]]:
    """Start the source on a URL that fails; the problem it logged first, and its channel."""
    problems = ProblemLog()
    log = logging.getLogger(f"test.url.{id(problems)}")
    log.addHandler(problems)
    updates = await start_source(nursery, url, log=log, **kwargs)
    with trio.fail_after(2):
        while not problems.messages:
            await trio.sleep(0.01)
    return problems.messages[0], updates


def nothing_sent(updates: trio.MemoryReceiveChannel[Event]) -> bool:
    try:
        updates.receive_nowait()
    except trio.WouldBlock:
        return True
    return False


def names(update: PodSetUpdate) -> list[str]:
    return [f"{p.metadata.namespace}/{p.metadata.name}" for p in update.pods]


def reasons(update: PodSetUpdate) -> list[str]:
    return [p.reason for p in update.problems]


# --- formats and static pod defaults -------------------------------------------------------


async def test_a_yaml_pod_then_a_json_pod_list(server: Server) -> None:
    async with trio.open_nursery() as nursery:
        updates = await start_source(nursery, server.url)
        first = await receive(updates)
        assert first.source == "http" and first.problems == []
        (pod,) = first.pods
        assert pod.metadata.name == "web-node-1" and pod.metadata.namespace == "default"
        assert pod.spec.node_name == NODE
        annotations = pod.metadata.annotations
        assert annotations[CONFIG_SOURCE_ANNOTATION] == "http"
        assert len(annotations[CONFIG_HASH_ANNOTATION]) == 32
        assert annotations[CONFIG_SEEN_ANNOTATION] == "2023-11-14T22:13:20.000000Z"
        assert pod.metadata.uid == static_pod_uid(NODE, server.url, "default", "web", "http")
        assert pod.metadata.uid != static_pod_uid(NODE, server.url, "default", "web")  # a file's
        assert pod.to_api()["spec"]["tolerations"] == [
            {"operator": "Exists", "effect": "NoExecute"}
        ]

        server.answer = (200, pod_list_json("web", "db"))
        listed = await receive(updates)
        assert names(listed) == ["default/web-node-1", "default/db-node-1"]
        assert listed.pods[0].metadata.uid == pod.metadata.uid  # the same pod, edited
        assert listed.pods[0].spec.containers[0].image == "nginx"
        nursery.cancel_scope.cancel()


async def test_a_json_pod_and_a_yaml_pod_list(server: Server) -> None:
    single = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "j", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
    }
    server.answer = (200, json.dumps(single).encode())
    async with trio.open_nursery() as nursery:
        updates = await start_source(nursery, server.url)
        assert names(await receive(updates)) == ["ns/j-node-1"]
        server.answer = (200, POD_LIST_YAML)
        assert names(await receive(updates)) == ["default/a-node-1", "default/b-node-1"]
        server.answer = (200, pod_list_json())
        emptied = await receive(updates)
        assert emptied.pods == [] and emptied.problems == []  # an empty PodList means no pods
        nursery.cancel_scope.cancel()


# --- headers, credentials, redirects -------------------------------------------------------------


async def test_the_configured_headers_are_sent(server: Server) -> None:
    server.required = {"Authorization": "Bearer s3cret"}
    headers = {"Authorization": ["Bearer s3cret"], "X-Team": ["a", "b"]}
    async with trio.open_nursery() as nursery:
        updates = await start_source(nursery, server.url, headers=headers)
        assert names(await receive(updates)) == ["default/web-node-1"]
        assert server.requests[0]["X-Team"] == ["a", "b"]  # every value of a repeated header
        nursery.cancel_scope.cancel()


async def test_without_the_required_header_the_server_refuses(server: Server) -> None:
    server.required = {"Authorization": "Bearer s3cret"}
    async with trio.open_nursery() as nursery:
        problem, updates = await first_problem(
            nursery, server.url, headers={"Authorization": ["wrong"]})
        assert problem == f"static pod URL {server.url}: HTTP 401 Unauthorized"
        # Not sent: before a first good answer the source has not reported (as in Go).
        assert nothing_sent(updates)
        nursery.cancel_scope.cancel()


async def test_a_password_in_the_url_is_used_but_never_shown(server: Server) -> None:
    url = server.url.replace("http://", "http://admin:hunter2@")
    server.answer = (200, b"kind: Pod\n")
    async with trio.open_nursery() as nursery:
        problem, _ = await first_problem(nursery, url)
        assert server.url.replace("http://", "http://admin:***@") in problem
        assert "hunter2" not in problem
        assert server.requests[0]["Authorization"] == ["Basic YWRtaW46aHVudGVyMg=="]
        nursery.cancel_scope.cancel()
    assert shown_url("https://h/x") == "https://h/x"


async def test_redirects_are_followed(server: Server) -> None:
    async with trio.open_nursery() as nursery:
        updates = await start_source(nursery, server.url.replace("/pods", "/old"))
        assert names(await receive(updates)) == ["default/web-node-1"]
        nursery.cancel_scope.cancel()


# --- unchanged content, errors and the last good set -----------------------------------------


async def test_an_unchanged_body_is_not_parsed_or_sent_again(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[bytes] = []
    real = manifest_url.parse_manifest

    def counting(raw: bytes, *args: Any, **kwargs: Any) -> ParsedManifest:
        parsed.append(raw)
        return real(raw, *args, **kwargs)

    monkeypatch.setattr(manifest_url, "parse_manifest", counting)
    async with trio.open_nursery() as nursery:
        updates = await start_source(nursery, server.url)
        await receive(updates)
        assert await nothing_new(server, updates)
        assert parsed == [POD_YAML]
        server.answer = (200, POD_YAML + b"# only a comment changed\n")
        assert await nothing_new(server, updates)  # parsed, but the same pods: nothing to send
        assert len(parsed) == 2
        nursery.cancel_scope.cancel()


async def test_errors_keep_the_last_good_set_and_are_logged_once(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="test.url")

    def logged(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == level]

    async with trio.open_nursery() as nursery:
        updates = await start_source(nursery, server.url)
        good = (await receive(updates)).pods
        bad_answers = [
            ((500, b"boom"), "HTTP 500 Internal Server Error"),
            ((404, b""), "HTTP 404 Not Found"),
            (
                (200, b"apiVersion: v1\nkind: Pod\nmetadata: {name: web\n"),
                "invalid YAML at line 4, column 1: did not find expected ',' or '}'",
            ),
            ((200, b""), "no pod manifest in response body (it is empty)"),
            ((200, b"kind: Pod\n"), "apiVersion: required value (expected v1)"),
            (
                (200, pod_list_json("ok").replace(b'"image": "nginx"', b'"imag": "nginx"')),
                "items[0].spec.containers[0].image: required value",
            ),
        ]
        for answer, reason in bad_answers:
            server.answer = answer
            kept = await receive(updates)
            assert kept.pods == good
            assert [(p.file, p.reason) for p in kept.problems] == [(server.url, reason)]
            assert await nothing_new(server, updates)  # the same problem again: nothing new
        warnings = logged(logging.WARNING)
        assert warnings == [
            f"static pod URL {server.url}: {reason} (keeping its last good pods)"
            for _, reason in bad_answers
        ]
        server.answer = (200, POD_YAML)  # the last good body again
        recovered = await receive(updates)
        assert recovered.pods == good and recovered.problems == []
        assert logged(logging.INFO)[-1].startswith(f"static pod URL {server.url}: resolved: ")
        nursery.cancel_scope.cancel()


async def test_a_first_failure_is_logged_and_not_sent() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}/pods"
    async with trio.open_nursery() as nursery:
        problem, updates = await first_problem(nursery, url)
        # trio names the address tried, then the OS's words
        assert ": cannot connect: " in problem and problem.endswith(": Connection refused")
        assert nothing_sent(updates)
        nursery.cancel_scope.cancel()


async def test_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as silent:  # accepts connections in the kernel, never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/pods"
        async with trio.open_nursery() as nursery:
            problem, _ = await first_problem(nursery, url, timeout=0.1)
            assert problem.endswith(": timed out waiting for the response (after 0.1 s)")
            nursery.cancel_scope.cancel()


async def test_a_body_too_large_is_refused(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest_url, "MAX_BODY_BYTES", 100)
    server.answer = (200, POD_YAML)
    async with trio.open_nursery() as nursery:
        problem, _ = await first_problem(nursery, server.url)
        assert problem.endswith(": response body is larger than 100 bytes")
        nursery.cancel_scope.cancel()


async def test_an_invalid_url_is_reported() -> None:
    async with trio.open_nursery() as nursery:
        problem, _ = await first_problem(nursery, "ftp://example.invalid/pods")
        assert problem.endswith(
            ": request failed: Request URL has an unsupported protocol 'ftp://'.")
        nursery.cancel_scope.cancel()


async def test_hostile_bodies_are_refused_off_the_event_loop_and_keep_the_last_good_set(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    real = manifest_url.parse_manifest

    def recording(raw: bytes, *args: Any, **kwargs: Any) -> ParsedManifest:
        threads.append(threading.current_thread().name)
        return real(raw, *args, **kwargs)

    monkeypatch.setattr(manifest_url, "parse_manifest", recording)
    deep = b'{"apiVersion":"v1","kind":"Pod","spec":' + b'{"a":' * 100_000 + b"1" + b"}" * 100_001
    async with trio.open_nursery() as nursery:
        updates = await start_source(nursery, server.url)
        good = (await receive(updates)).pods
        server.answer = (200, deep)
        kept = await receive(updates)
        assert kept.pods == good
        assert [p.reason for p in kept.problems] == [
            "spec.a.a.a.a.a.a.a.a.a.a.a...: nested deeper than 100 levels"]
        server.answer = (200, b"---\n" * 20_000)
        assert [p.reason for p in (await receive(updates)).problems] == [
            "more than 1000 documents"]
        nursery.cancel_scope.cancel()
    main = threading.main_thread().name
    assert threads[0] == main  # the small good body: parsed inline
    assert main not in threads[1:]  # the big ones: in a worker thread
