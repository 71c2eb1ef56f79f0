"""The log endpoints: ``/containerLogs/{namespace}/{pod}/{container}`` and the node's ``/logs/``.

`logs_blueprint(view)` makes the blueprint (named ``logs``). Both endpoints stream files block by
block (`crilog.read_log`, `_stream_file`), never loading one whole. They belong on the
authenticated port only: the Go kubelet serves neither on the read-only port.
"""

from __future__ import annotations

import html
import mimetypes
import os
import stat
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

import trio
from quart import Blueprint, Response, current_app, redirect, request
from quart.typing import ResponseReturnValue

from trio_kubelet.core.container_ids import runtime_id
from trio_kubelet.model.pod import ContainerStatus, Pod
from trio_kubelet.runtime.configs import container_log_path, pod_log_directory
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.crilog import (
    BLOCK_SIZE,
    LogQueryError,
    go_quote,
    log_options_from_query,
    open_log,
    read_log,
)
from trio_kubelet.runtime.errors import CRIError, CRINotFound
from trio_kubelet.server.view import NodeView

__all__ = ["logs_blueprint", "text_error"]

_TEXT = "text/plain; charset=utf-8"
_NOT_FOUND = "404 page not found\n"


def logs_blueprint(view: NodeView) -> Blueprint:
    """``/containerLogs/…`` and ``/logs/…`` over ``view`` (GET and HEAD only)."""
    logs = Blueprint("logs", __name__)

    @logs.get("/containerLogs/<namespace>/<pod_name>/<container>")
    async def container_logs(namespace: str, pod_name: str, container: str) -> ResponseReturnValue:
        return await serve_container_logs(view, namespace, pod_name, container)

    @logs.get("/logs/")
    @logs.get("/logs/<path:subpath>")
    async def node_logs(subpath: str = "") -> ResponseReturnValue:
        return await serve_node_logs(view.node_logs_dir, subpath)

    return logs


def text_error(message: str, status: int) -> Response:
    """A plain-text error, as the Go kubelet writes them."""
    response: Response = current_app.response_class(message, status=status, content_type=_TEXT)
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


# -- /containerLogs ----------------------------------------------------------------------------


class _LogsUnavailable(Exception):
    """The container exists in the spec, but there is no log to show (the Go kubelet's 400s)."""


@dataclass(frozen=True)
class _Instance:
    """The container instance whose log was asked for."""

    container_id: str  # the runtime's id
    restart_count: int  # for finding its file when the runtime has forgotten the container


async def serve_container_logs(view: NodeView, namespace: str, pod_name: str,
                               container: str) -> ResponseReturnValue:
    """``kubectl logs``: stream one container instance's log, optionally following it."""
    try:
        options = log_options_from_query(request.args.to_dict(flat=False), time.time_ns())
    except LogQueryError as error:
        return text_error(str(error), 400)
    c, p = go_quote(container), go_quote(pod_name)
    pod = view.find_pod(namespace, pod_name)
    if pod is None:
        return text_error(f"pod {p} in namespace {go_quote(namespace)} not found", 404)
    if not _in_spec(pod, container):
        return text_error(f"container {c} not found in pod {p}", 404)
    try:
        instance = _log_instance(pod, container, options.previous)
        path = await _log_path(view, pod, container, instance)
        if request.method == "HEAD":  # Quart would still run the body: a followed log forever
            head: Response = current_app.response_class(b"", content_type=_TEXT)
            return head
        file = await open_log(path)
    except _LogsUnavailable as error:
        return text_error(str(error), 400)
    except OSError as error:
        return text_error(f"failed to open the log of container {c} in pod {p}: "
                          f"{error.strerror}", 400)

    async def is_running() -> bool:
        try:
            reply = await view.client.container_status(instance.container_id)
        except CRIError:
            return False
        status = reply.status
        return status is not None and status.state == v1.ContainerState.CONTAINER_RUNNING

    body = read_log(file, options, is_running=is_running if options.follow else None)
    response: Response = current_app.response_class(body, content_type=_TEXT)
    return response


def _in_spec(pod: Pod, container: str) -> bool:
    spec = pod.spec
    return any(c.name == container
               for c in (*spec.init_containers, *spec.containers, *spec.ephemeral_containers))


def _status(pod: Pod, container: str) -> ContainerStatus | None:
    status = pod.status
    for candidate in (*status.container_statuses, *status.init_container_statuses,
                      *status.ephemeral_container_statuses):
        if candidate.name == container:
            return candidate
    return None


def _log_instance(pod: Pod, container: str, previous: bool) -> _Instance:
    """Which instance's log to show: the Go kubelet's validateContainerLogStatus, same words."""
    c, p = go_quote(container), go_quote(pod.metadata.name)
    status = _status(pod, container)
    if status is None:
        raise _LogsUnavailable(f"container {c} in pod {p} is not available")
    last = status.last_state.terminated
    state = status.state
    if previous:
        if last is None or not last.container_id:
            raise _LogsUnavailable(
                f"previous terminated container {c} in pod {p} not found")
        return _Instance(runtime_id(last.container_id), max(status.restart_count - 1, 0))
    if state.running is not None and status.container_id:
        return _Instance(runtime_id(status.container_id), status.restart_count)
    if state.terminated is not None:
        # When the next instance did not start, the terminated state may carry no id.
        if state.terminated.container_id:
            return _Instance(runtime_id(state.terminated.container_id), status.restart_count)
        if last is not None and last.container_id:
            return _Instance(runtime_id(last.container_id), max(status.restart_count - 1, 0))
        raise _LogsUnavailable(f"container {c} in pod {p} is terminated")
    if last is not None:
        if not last.container_id:
            raise _LogsUnavailable(f"container {c} in pod {p} is terminated")
        return _Instance(runtime_id(last.container_id), max(status.restart_count - 1, 0))
    if state.waiting is not None:
        reason = state.waiting.reason or ""
        if reason == "ErrImagePull":
            detail = "image can't be pulled"
        elif reason == "ImagePullBackOff":
            detail = "trying and failing to pull image"
        else:
            detail = reason
        raise _LogsUnavailable(f"container {c} in pod {p} is waiting to start: {detail}")
    raise _LogsUnavailable(
        f"container {c} in pod {p} is waiting to start - no logs yet")


async def _log_path(view: NodeView, pod: Pod, container: str, instance: _Instance) -> Path:
    """The instance's log file: the runtime's ContainerStatus.log_path, as the Go kubelet reads.

    When the runtime no longer knows the container, the file the agent asked it to write
    (``<podLogsDir>/<ns>_<pod>_<uid>/<container>/<restartCount>.log``) is used if it exists.
    """
    c, p = go_quote(container), go_quote(pod.metadata.name)
    try:
        reply = await view.client.container_status(instance.container_id)
    except CRINotFound:
        fallback = pod_log_directory(view.pod_logs_dir, pod) / container_log_path(
            container, instance.restart_count)
        if fallback.is_file():
            return fallback
        raise _LogsUnavailable(
            f"container {c} in pod {p} is gone and so is its log file {fallback.name}") from None
    except CRIError as error:
        raise _LogsUnavailable(
            f"failed to get the status of container {c} in pod {p}: {error}") from None
    if reply.status is None or not reply.status.log_path:
        raise _LogsUnavailable(
            f"container {c} in pod {p} has no log file")
    return Path(reply.status.log_path)


# -- /logs/ ------------------------------------------------------------------------------------


async def serve_node_logs(logs_dir: Path, subpath: str) -> ResponseReturnValue:
    """The node's log directory, like Go's http.FileServer: listings and files, never outside.

    ``..`` anywhere (also %2e%2e, already decoded by the server) is a 400; a path that resolves
    outside the directory (a symlink, an absolute path) or is not a regular file or directory is
    a 404 -- checked again on the opened file descriptor, so swapping a symlink in between the
    check and the open does not help.
    """
    parts = subpath.split("/")
    if ".." in parts or "\x00" in subpath or "\\" in subpath:
        return text_error("invalid URL path\n", 400)
    root = logs_dir.resolve()
    try:
        target = (root / subpath).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        return text_error(_NOT_FOUND, 404)
    if not target.is_relative_to(root):
        return text_error(_NOT_FOUND, 404)
    if target.is_dir():
        if subpath and not subpath.endswith("/"):
            return redirect(quote(parts[-1]) + "/", 301)
        return await _listing(target)
    return await _file(root, target)


async def _listing(directory: Path) -> ResponseReturnValue:
    def entries() -> list[str]:
        with os.scandir(directory) as scan:
            return sorted(e.name + ("/" if e.is_dir() else "") for e in scan)

    names = await trio.to_thread.run_sync(entries)
    rows = "".join(f'<a href="{quote(name)}">{html.escape(name)}</a>\n' for name in names)
    page = ('<!doctype html>\n<meta name="viewport" content="width=device-width">\n'
            f"<pre>\n{rows}</pre>\n")
    return page, 200, {"Content-Type": "text/html; charset=utf-8"}


async def _file(root: Path, target: Path) -> ResponseReturnValue:
    def open_inside() -> tuple[BinaryIO, int] | None:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(target, flags)
        except OSError:
            return None
        info = os.fstat(fd)
        opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if not stat.S_ISREG(info.st_mode) or not opened.is_relative_to(root):
            os.close(fd)
            return None
        return os.fdopen(fd, "rb"), info.st_size

    opened = await trio.to_thread.run_sync(open_inside)
    if opened is None:
        return text_error(_NOT_FOUND, 404)
    file, size = opened
    content_type = await trio.to_thread.run_sync(_content_type, file, target.name)
    response: Response = current_app.response_class(_stream_file(file, size),
                                                    content_type=content_type)
    response.headers["Content-Length"] = str(size)
    return response


def _content_type(file: BinaryIO, name: str) -> str:
    guessed, _ = mimetypes.guess_type(name)
    if guessed is not None:
        return guessed
    head = file.read(512)
    file.seek(0)
    return "application/octet-stream" if b"\x00" in head else _TEXT


async def _stream_file(file: BinaryIO, size: int) -> AsyncIterator[bytes]:
    """The file's first ``size`` bytes: what Content-Length promised, even if it grows meanwhile."""
    try:
        while size > 0:
            data = await trio.to_thread.run_sync(file.read, min(size, BLOCK_SIZE))
            if not data:
                break
            size -= len(data)
            yield data
    finally:
        file.close()

