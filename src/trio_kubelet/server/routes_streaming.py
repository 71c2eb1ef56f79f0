"""Exec, attach, port-forward and run: the CRI streaming calls behind ``kubectl exec`` and friends.

For ``/exec``, ``/attach`` and ``/portForward`` the kubelet asks the runtime (CRI Exec, Attach,
PortForward) for a one-time streaming URL and proxies the client's upgraded connection to it
both ways, as the Go kubelet does. Two kinds of upgrade arrive:

* websockets (clients talking to the kubelet directly): the subprotocol is
  negotiated per leg: the client is accepted with the protocol it asked for, the runtime is
  offered the protocol with the same framing it speaks (containerd 1.6 has no
  ``v5.channel.k8s.io``; v5 is v4 plus a client "close stdin" signal, which is dropped on the
  way). Frames are passed through untouched otherwise: the runtime writes the exit status.
* SPDY/3.1 (what the API server sends), as a plain GET/POST whose raw connection the server
  offers the view (``spdy_proxy``): the request goes on to the runtime's URL, and after its 101
  the connection is a byte splice.

``/run`` is the old synchronous form: ExecSync, and the combined output as the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from typing import TypeVar
from urllib.parse import urlsplit

import trio
import trio_websocket
from quart import Blueprint, Response, current_app, request, websocket
from quart.typing import ResponseReturnValue

from trio_kubelet.core.container_ids import runtime_id
from trio_kubelet.model.pod import Pod
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.crilog import go_quote
from trio_kubelet.runtime.errors import CRIError, CRINotFound, CRIResourceExhausted
from trio_kubelet.server.asgi_server import MAX_MESSAGE_BYTES
from trio_kubelet.server.idle import IdleTimer
from trio_kubelet.server.routes_logs import text_error
from trio_kubelet.server.spdy_proxy import RAW_UPGRADE, RawUpgrade, UpstreamError, dial_upgrade
from trio_kubelet.server.view import NodeView

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = [
    "PORTFORWARD_PROTOCOLS",
    "REMOTECOMMAND_PROTOCOLS",
    "StreamOptions",
    "StreamRequestError",
    "choose_protocol",
    "forwarded_ports",
    "stream_options",
    "streaming_blueprint",
]

# Client subprotocol -> the subprotocol offered to the runtime (same framing on both legs).
REMOTECOMMAND_PROTOCOLS: Mapping[str, str] = {
    "v5.channel.k8s.io": "v4.channel.k8s.io",  # + channel 255 (close stdin), dropped
    "v4.channel.k8s.io": "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io": "v4.base64.channel.k8s.io",
    "channel.k8s.io": "channel.k8s.io",
    "base64.channel.k8s.io": "base64.channel.k8s.io",
}
PORTFORWARD_PROTOCOLS: Mapping[str, str] = {
    "v4.channel.k8s.io": "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io": "v4.base64.channel.k8s.io",
    # The SPDY protocol name; over a websocket it can only mean the binary channel framing.
    "portforward.k8s.io": "v4.channel.k8s.io",
}
# A client offering no subprotocol gets the binary framing the Go streaming server gives "".
# (Offering "" upstream would not do: containerd echoes an empty header, which clients reject.)
_REMOTECOMMAND_DEFAULT = "channel.k8s.io"
_PORTFORWARD_DEFAULT = "v4.channel.k8s.io"
_V5_PROTOCOL = "v5.channel.k8s.io"
_V5_CLOSE_CHANNEL = 255

RUNTIME_CONNECT_TIMEOUT = 10.0
RUNTIME_DISCONNECT_TIMEOUT = 5.0

_SPDY_UNSUPPORTED = (
    "SPDY/3.1 upgrades are not supported on this connection: the kubelet takes them only as "
    "HTTP/1.1 requests without a body; send one so, or connect with a websocket, "
    "subprotocol {protocols}")
_UPGRADE_REQUIRED = "Upgrade request required"
# Headers of a runtime's refusal that describe its connection, not the answer.
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length",
                         b"upgrade"})


class StreamRequestError(ValueError):
    """A streaming request is unusable as asked; ``status`` is the HTTP answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# -- query parameters ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamOptions:
    """Which streams an exec or attach wants (remotecommand.Options)."""

    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


def stream_options(query: Mapping[str, Sequence[str]]) -> StreamOptions:
    """The streams of an exec/attach request, from the Go kubelet's parameter names.

    The API server sends ``input``/``output``/``error``/``tty`` set to ``1``; the PodExecOptions
    names (``stdin``, ``stdout``, ``stderr``) and ``true`` are accepted too. A tty has no
    separate stderr. At least one of stdin, stdout and stderr is required.
    """

    def flag(*names: str) -> bool:
        return any((query.get(name) or [""])[0].lower() in ("1", "true") for name in names)

    tty = flag("tty")
    options = StreamOptions(stdin=flag("input", "stdin"), stdout=flag("output", "stdout"),
                            stderr=flag("error", "stderr") and not tty, tty=tty)
    if not (options.stdin or options.stdout or options.stderr):
        raise StreamRequestError("you must specify at least 1 of stdin, stdout, stderr")
    return options


def forwarded_ports(query: Mapping[str, Sequence[str]]) -> list[int]:
    """The ``port`` parameters of a websocket port-forward (portforward.NewV4Options)."""
    values = query.get("port") or []
    if not values:
        raise StreamRequestError('query parameter "port" is required')
    ports: list[int] = []
    for value in values:
        if not value:
            raise StreamRequestError('query parameter "port" cannot be empty')
        for item in value.split(","):
            if not item.isdigit() or int(item) > 65535:
                raise StreamRequestError(f"unable to parse {go_quote(value)} as a port")
            if int(item) < 1:
                raise StreamRequestError(f"port {go_quote(value)} must be > 0")
            ports.append(int(item))
    return ports


def choose_protocol(offered: Sequence[str], table: Mapping[str, str],
                    default: str) -> tuple[str | None, str]:
    """``(protocol to accept the client with, protocol to offer the runtime)``.

    The client's first offer that ``table`` knows wins; no offer at all means the default
    framing with no subprotocol header. Offers of nothing known are refused.
    """
    if not offered:
        return None, default
    for protocol in offered:
        if protocol in table:
            return protocol, table[protocol]
    raise StreamRequestError(
        f"none of the requested subprotocols {', '.join(offered)} is supported; "
        f"supported: {', '.join(table)}")


# -- the blueprint ------------------------------------------------------------------------------


def streaming_blueprint(view: NodeView) -> Blueprint:
    """``/exec``, ``/attach``, ``/portForward`` (websockets, and SPDY upgrades as plain GET/POST),
    ``/run``. Each streaming path also has its ``…/{uid}/…`` form, checked against the pod's uid.
    """
    streaming = Blueprint("streaming", __name__)
    for kind in ("exec", "attach"):
        for suffix in ("<namespace>/<pod_name>/<container>",
                       "<namespace>/<pod_name>/<uid>/<container>"):
            rule = f"/{kind}/{suffix}"
            endpoint = f"{kind}_{suffix.count('/')}"
            streaming.add_websocket(rule, f"{endpoint}_ws", _remotecommand_view(view, kind))
            streaming.add_url_rule(rule, endpoint, _spdy_view(view, kind),
                                   methods=["GET", "POST"])
    for suffix in ("<namespace>/<pod_name>", "<namespace>/<pod_name>/<uid>"):
        rule = f"/portForward/{suffix}"
        endpoint = f"portforward_{suffix.count('/')}"
        streaming.add_websocket(rule, f"{endpoint}_ws", _portforward_view(view))
        streaming.add_url_rule(rule, endpoint, _spdy_view(view, "portForward"),
                               methods=["GET", "POST"])
    for suffix in ("<namespace>/<pod_name>/<container>",
                   "<namespace>/<pod_name>/<uid>/<container>"):
        streaming.add_url_rule(f"/run/{suffix}", f"run_{suffix.count('/')}", _run_view(view),
                               methods=["POST"])
    return streaming


HTTPView = Callable[..., Awaitable[ResponseReturnValue]]
WebsocketView = Callable[..., Awaitable[ResponseReturnValue | None]]


def _remotecommand_view(view: NodeView, kind: str) -> WebsocketView:
    async def serve(namespace: str, pod_name: str, container: str,
                    uid: str | None = None) -> ResponseReturnValue | None:
        try:
            cri_request = _remotecommand_request(view, kind, namespace, pod_name, container, uid,
                                                 websocket.args.to_dict(flat=False))
            protocols = choose_protocol(websocket.requested_subprotocols,
                                        REMOTECOMMAND_PROTOCOLS, _REMOTECOMMAND_DEFAULT)
            url = await _remotecommand_url(view, cri_request)
        except StreamRequestError as error:
            return text_error(str(error), error.status)
        return await _proxy(url, *protocols, idle_timeout=_idle_timeout(view))

    return serve


def _portforward_view(view: NodeView) -> WebsocketView:
    async def serve(namespace: str, pod_name: str,
                    uid: str | None = None) -> ResponseReturnValue | None:
        try:
            ports = forwarded_ports(websocket.args.to_dict(flat=False))
            pod = _find_pod(view, namespace, pod_name, uid)
            protocols = choose_protocol(websocket.requested_subprotocols, PORTFORWARD_PROTOCOLS,
                                        _PORTFORWARD_DEFAULT)
            url = await _portforward_url(view, pod, ports)
        except StreamRequestError as error:
            return text_error(str(error), error.status)
        return await _proxy(url, *protocols, idle_timeout=_idle_timeout(view))

    return serve


def _spdy_view(view: NodeView, kind: str) -> HTTPView:
    """A plain GET/POST on a streaming path: an SPDY/3.1 upgrade is proxied to the runtime when
    the server offers its connection (``spdy_proxy``); anything else is validated like the Go
    kubelet does, then refused."""

    async def serve(namespace: str, pod_name: str, container: str | None = None,
                    uid: str | None = None) -> ResponseReturnValue:
        query = request.args.to_dict(flat=False)
        try:
            ask_runtime: Callable[[], Awaitable[str]]
            if kind == "portForward":
                # SPDY port-forward names its ports in stream headers, not in the query.
                ask_runtime = partial(_portforward_url, view,
                                      _find_pod(view, namespace, pod_name, uid), [])
            else:
                ask_runtime = partial(_remotecommand_url, view, _remotecommand_request(
                    view, kind, namespace, pod_name, container or "", uid, query))
            raw = _spdy_connection(kind)
            url = await ask_runtime()
        except StreamRequestError as error:
            return text_error(str(error), error.status)
        where = "/".join(name for name in (namespace, pod_name, container) if name)
        return await _proxy_spdy(raw, url, f"{kind} {where}", _idle_timeout(view))

    return serve


def _spdy_connection(kind: str) -> RawUpgrade:
    """The connection of this SPDY upgrade request, or why it cannot be proxied.

    The server offers it (``RAW_UPGRADE``) only for an SPDY upgrade that opened its connection.
    """
    raw = (request.scope.get("extensions") or {}).get(RAW_UPGRADE)
    if isinstance(raw, RawUpgrade):
        return raw
    if "spdy/" in request.headers.get("Upgrade", "").lower():
        protocols = PORTFORWARD_PROTOCOLS if kind == "portForward" else REMOTECOMMAND_PROTOCOLS
        raise StreamRequestError(_SPDY_UNSUPPORTED.format(protocols=", ".join(protocols)))
    raise StreamRequestError(_UPGRADE_REQUIRED)


def _run_view(view: NodeView) -> HTTPView:
    async def serve(namespace: str, pod_name: str, container: str,
                    uid: str | None = None) -> ResponseReturnValue:
        """ExecSync of ``cmd`` (split at spaces, as Go does); 200 + stdout then stderr."""
        command = (request.args.get("cmd") or "").split()
        try:
            if not command:
                raise StreamRequestError('query parameter "cmd" is required')
            pod = _find_pod(view, namespace, pod_name, uid)
            container_id = _running_container(pod, container)
            reply = await _runtime_call(view.client.exec_sync(container_id, command, 0))
        except StreamRequestError as error:
            return text_error(str(error), error.status)
        if reply.exit_code != 0:
            return text_error(f"command '{' '.join(command)}' exited with {reply.exit_code}: "
                              f"{reply.stderr.decode(errors='replace')}", 500)
        response: Response = current_app.response_class(
            reply.stdout + reply.stderr, content_type="text/plain; charset=utf-8")
        return response

    return serve


# -- resolving what to stream to ----------------------------------------------------------------


def _find_pod(view: NodeView, namespace: str, name: str, uid: str | None) -> Pod:
    where = f"pod {go_quote(name)} in namespace {go_quote(namespace)}"
    pod = view.find_pod(namespace, name)
    if pod is None:
        raise StreamRequestError(f"{where} not found", 404)
    if uid and pod.metadata.uid != uid:
        raise StreamRequestError(f"{where} has no uid {go_quote(uid)}", 404)
    return pod


def _running_container(pod: Pod, name: str) -> str:
    """The runtime id of the running instance of container ``name``."""
    spec = pod.spec
    if not any(c.name == name
               for c in (*spec.init_containers, *spec.containers, *spec.ephemeral_containers)):
        raise StreamRequestError(
            f"container {go_quote(name)} not found in pod {go_quote(pod.metadata.name)}", 404)
    status = pod.status
    for candidate in (*status.container_statuses, *status.init_container_statuses,
                      *status.ephemeral_container_statuses):
        if candidate.name == name and candidate.state.running is not None \
                and candidate.container_id:
            return runtime_id(candidate.container_id)
    raise StreamRequestError(
        f"container {go_quote(name)} in pod {go_quote(pod.metadata.name)} is not running", 400)


def _remotecommand_request(view: NodeView, kind: str, namespace: str, pod_name: str,
                           container: str, uid: str | None,
                           query: Mapping[str, Sequence[str]]
                           ) -> v1.ExecRequest | v1.AttachRequest:
    """The CRI request of an exec or attach, checked before the runtime is asked anything."""
    options = stream_options(query)
    command = list(query.get("command") or [])
    if kind == "exec" and not command:
        raise StreamRequestError('query parameter "command" is required')
    container_id = _running_container(_find_pod(view, namespace, pod_name, uid), container)
    if kind == "exec":
        return v1.ExecRequest(container_id=container_id, cmd=command, tty=options.tty,
                              stdin=options.stdin, stdout=options.stdout, stderr=options.stderr)
    return v1.AttachRequest(container_id=container_id, tty=options.tty, stdin=options.stdin,
                            stdout=options.stdout, stderr=options.stderr)


async def _remotecommand_url(view: NodeView, cri_request: v1.ExecRequest | v1.AttachRequest
                             ) -> str:
    if isinstance(cri_request, v1.ExecRequest):
        return await _runtime_call(view.client.exec(cri_request))
    return await _runtime_call(view.client.attach(cri_request))


async def _portforward_url(view: NodeView, pod: Pod, ports: list[int]) -> str:
    state = v1.PodSandboxStateValue(state=v1.PodSandboxState.SANDBOX_READY)
    sandboxes = await _runtime_call(view.client.list_pod_sandbox(v1.PodSandboxFilter(
        label_selector={labels.POD_UID: pod.metadata.uid}, state=state)))
    if not sandboxes:
        raise StreamRequestError(f"pod {go_quote(pod.metadata.name)} in namespace "
                                 f"{go_quote(pod.metadata.namespace)} has no ready sandbox", 404)
    sandbox = max(sandboxes, key=lambda sandbox: sandbox.created_at)
    return await _runtime_call(view.client.port_forward(
        v1.PortForwardRequest(pod_sandbox_id=sandbox.id, port=ports)))


async def _runtime_call(call: Awaitable[T]) -> T:
    """A CRI call, its failure as the Go streaming.WriteError status (404, 429 or 500)."""
    try:
        return await call
    except CRINotFound as error:
        raise StreamRequestError(error.message or str(error), 404) from None
    except CRIResourceExhausted as error:
        raise StreamRequestError(error.message or str(error), 429) from None
    except CRIError as error:
        raise StreamRequestError(str(error), 500) from None


# -- the proxy ----------------------------------------------------------------------------------


def _idle_timeout(view: NodeView) -> float:
    return view.options.config.streaming_connection_idle_timeout


async def _proxy(url: str, client_protocol: str | None, runtime_protocol: str, *,
                 idle_timeout: float) -> ResponseReturnValue | None:
    """Dial the runtime's streaming URL, then accept the client and pump frames both ways.

    Dialling first means a runtime that refuses still gets the client a real HTTP answer. The
    session ends when either side closes: the runtime's close (after it sent the exit status) is
    passed on to the client; the client going away cancels this handler, which closes the
    runtime's connection and so ends the command's streams; so does ``idle_timeout`` seconds
    without a frame either way.
    """
    target = urlsplit(url)
    resource = target.path + (f"?{target.query}" if target.query else "")
    async with AsyncExitStack() as stack:
        try:
            runtime = await stack.enter_async_context(trio_websocket.open_websocket(
                target.hostname or "127.0.0.1", target.port or (443 if target.scheme == "https"
                                                                else 80),
                resource, use_ssl=target.scheme == "https", subprotocols=[runtime_protocol],
                max_message_size=MAX_MESSAGE_BYTES, connect_timeout=RUNTIME_CONNECT_TIMEOUT,
                disconnect_timeout=RUNTIME_DISCONNECT_TIMEOUT))
        except (trio_websocket.HandshakeError, OSError) as error:
            return _unreachable(target.netloc, _describe(error))
        await websocket.accept(subprotocol=client_protocol)
        idle = IdleTimer(idle_timeout)
        code = await _pump(runtime, idle, drop_close_signals=client_protocol == _V5_PROTOCOL)
        if idle.expired:
            log.info("streaming: closing %s after %.0f s without data", target.path, idle_timeout)
        await websocket.close(code)
    return None


def _unreachable(where: str, reason: str) -> Response:
    log.warning("streaming: cannot reach the runtime at %s: %s", where, reason)
    return text_error(f"error dialing the runtime's streaming server: {reason}", 500)


async def _proxy_spdy(raw: RawUpgrade, url: str, what: str,
                      idle_timeout: float) -> ResponseReturnValue:
    """Send the client's upgrade request on to the runtime's URL; splice after its 101.

    A runtime that refuses (say, 403 for protocol versions it does not speak) has its answer
    passed on, as the Go proxy does. The app's return value after the splice goes nowhere: the
    connection then belonged to the runtime's protocol.
    """
    try:
        answer = await dial_upgrade(url, raw.method, raw.headers,
                                    timeout=RUNTIME_CONNECT_TIMEOUT)
    except UpstreamError as error:
        return _unreachable(urlsplit(url).netloc, str(error))
    if answer.stream is None:
        response: Response = current_app.response_class(answer.body, status=answer.status)
        for name, value in answer.headers:
            if name.lower() not in _HOP_BY_HOP:
                response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
        return response
    began = trio.current_time()
    idle = IdleTimer(idle_timeout)
    sent, received = await raw.splice(answer, idle)
    log.info("%s: SPDY session ended after %.1f s (%d bytes in, %d bytes out)%s", what,
             trio.current_time() - began, sent, received,
             " for lack of data" if idle.expired else "")
    return current_app.response_class(status=101)


async def _pump(runtime: trio_websocket.WebSocketConnection, idle: IdleTimer, *,
                drop_close_signals: bool) -> int:
    """Copy frames between the client and the runtime until the runtime closes; its close code.

    When ``idle`` expires the session ends with 1000 (normal closure), as a runtime's
    own idle timeout would end it.
    """
    code = 1000

    async def client_to_runtime() -> None:
        while True:
            message = await websocket.receive()
            idle.touch()
            if drop_close_signals and isinstance(message, bytes) \
                    and message[:1] == bytes([_V5_CLOSE_CHANNEL]):
                continue  # v4 has no way to close stdin alone
            await runtime.send_message(message)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client_to_runtime)
        nursery.start_soon(idle.watch, nursery.cancel_scope)
        try:
            while True:
                message = await runtime.get_message()
                idle.touch()
                await websocket.send(message)
        except trio_websocket.ConnectionClosed as closed:
            reason = closed.reason.code if closed.reason is not None else 1000
            code = reason if reason in (1000, 1001, 1008, 1011) else 1011
        nursery.cancel_scope.cancel()
    return code


def _describe(error: BaseException) -> str:
    if isinstance(error, trio_websocket.ConnectionRejected):
        body = (error.body or b"").decode(errors="replace").strip()
        return f"rejected with HTTP {error.status_code}" + (f": {body}" if body else "")
    if isinstance(error, trio_websocket.ConnectionTimeout):
        return "no websocket handshake within the timeout (subprotocol not supported?)"
    return str(error) or type(error).__name__
