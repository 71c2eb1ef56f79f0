"""The node's own endpoints: /healthz, /pods, /spec, /configz, /metrics, /metrics/probes.

Three blueprints, by the servers that carry them (as the Go kubelet splits them):
``healthz`` (all three servers), ``node_read_only`` (/pods, /spec, /metrics*: also
on the read-only port 10255) and ``node`` (/configz: only on the authenticated
port 10250). Handlers read published state only — the status store, the health
timestamps, the metrics registries and a machine description read once at start.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio
from quart import Blueprint, Response, current_app, request

from trio_kubelet.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.model.duration import format_duration
from trio_kubelet.model.pod import Pod
from trio_kubelet.node.machine_info import read_machine_spec
from trio_kubelet.server.app import plain_response
from trio_kubelet.server.view import PLEG_RELIST_THRESHOLD, NodeView
from trio_kubelet.status.store import PodStatusStore

log = logging.getLogger(__name__)

__all__ = [
    "NodeBlueprints",
    "healthz_blueprint",
    "healthz_report",
    "node_blueprints",
    "pleg_error",
    "pod_list_json",
    "syncloop_error",
]

# The Go kubelet's sync loop check allows max(2 * syncFrequency, 5 min) since the loop last ran.
SYNC_LOOP_MIN_THRESHOLD = 300.0

HealthCheck = Callable[[], "str | None"]


# --- health ----------------------------------------------------------------------------------


def syncloop_error(now: float, last_sync_loop: float | None, sync_frequency: float) -> str | None:
    """Why the sync loop is unhealthy, or None. Not run yet counts as healthy (as in Go)."""
    if last_sync_loop is None:
        return None
    threshold = max(2 * sync_frequency, SYNC_LOOP_MIN_THRESHOLD)
    if now - last_sync_loop > threshold:
        return (f"sync loop took longer than expected: last ran "
                f"{format_duration(round(now - last_sync_loop))} ago; threshold is "
                f"{format_duration(threshold)}")
    return None


def pleg_error(now: float, last_relist: float | None, started_at: float,
               threshold: float = PLEG_RELIST_THRESHOLD) -> str | None:
    """Why the PLEG is unhealthy, or None: no successful relist for ``threshold``.

    Before its first relist it is given ``threshold`` from ``started_at``.
    """
    if last_relist is None:
        if now - started_at > threshold:
            return "pleg has yet to be successful"
        return None
    elapsed = now - last_relist
    if elapsed > threshold:
        return (f"pleg was last seen active {format_duration(round(elapsed))} ago; threshold is "
                f"{format_duration(threshold)}")
    return None


def healthz_report(results: Sequence[tuple[str, str | None]], excluded: Sequence[str],
                   verbose: bool, name: str = "healthz") -> tuple[int, str]:
    """``(status, body)`` of /healthz as the apiserver's healthz handler writes them.

    Failures are always verbose and never show their reason (that is logged).
    """
    wanted_out = set(excluded)
    lines: list[str] = []
    failed = False
    for check, error in results:
        if check in wanted_out:
            wanted_out.discard(check)
            lines.append(f"[+]{check} excluded: ok")
        elif error is not None:
            failed = True
            lines.append(f"[-]{check} failed: reason withheld")
        else:
            lines.append(f"[+]{check} ok")
    if wanted_out:
        quoted = ",".join(f'"{c}"' for c in sorted(wanted_out))
        lines.append(f"warn: some health checks cannot be excluded: no matches for {quoted}")
    body = "".join(f"{line}\n" for line in lines)
    if failed:
        return 500, f"{body}{name} check failed\n"
    if not verbose:
        return 200, "ok"
    return 200, f"{body}{name} check passed\n"


class _Health:
    """The named checks of /healthz over the agent's view."""

    def __init__(self, view: NodeView, started_at: float) -> None:
        self.view = view
        self.started_at = started_at

    def checks(self) -> list[tuple[str, HealthCheck]]:
        return [("ping", lambda: None), ("syncloop", self.syncloop), ("pleg", self.pleg)]

    def syncloop(self) -> str | None:
        return syncloop_error(trio.current_time(), self.view.last_sync_loop(),
                              self.view.options.config.sync_frequency)

    def pleg(self) -> str | None:
        return pleg_error(trio.current_time(), self.view.last_relist(), self.started_at)


def healthz_blueprint(view: NodeView, *, started_at: float | None = None) -> Blueprint:
    """``/healthz`` (``?verbose``, ``?exclude=NAME``) and ``/healthz/{ping,syncloop,pleg}``."""
    health = _Health(view, trio.current_time() if started_at is None else started_at)
    checks = dict(health.checks())
    failing: dict[str, str] = {}  # as last seen: a check that stays failed is logged once
    blueprint = Blueprint("healthz", __name__)

    def note(results: list[tuple[str, str | None]]) -> None:
        now_failing = {name: error for name, error in results if error is not None}
        for name, error in now_failing.items():
            if name not in failing:
                log.warning("healthz check %s failed: %s", name, error)
        for name in failing.keys() - now_failing.keys():
            log.info("healthz check %s passes again", name)
        failing.clear()
        failing.update(now_failing)

    @blueprint.route("/healthz")
    async def healthz() -> Response:
        results = [(name, check()) for name, check in checks.items()]
        note(results)
        status, body = healthz_report(results, request.args.getlist("exclude"),
                                      "verbose" in request.args)
        return plain_response(status, body)

    @blueprint.route("/healthz/<name>")
    async def healthz_check(name: str) -> Response:
        check = checks.get(name)
        if check is None:
            return plain_response(404, "404 page not found\n")
        error = check()
        if error is not None:
            return plain_response(500, f"internal server error: {error}\n")
        return plain_response(200, "ok")

    return blueprint


# --- /pods -----------------------------------------------------------------------------------


def pod_list_json(pods: Sequence[Pod]) -> bytes:
    """A v1 PodList of ``pods`` (with their status), serialised as the API server would."""
    items = ",".join(pod.model_dump_json(by_alias=True, exclude_none=True) for pod in pods)
    return ('{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[' + items + "]}").encode()


class _PodListCache:
    """The last /pods body, rendered again only when the status store's version moves
    (every change to a pod, its status included, bumps it): fifty clients polling an
    unchanged node share one serialisation, and no request sorts the pods."""

    def __init__(self, store: PodStatusStore) -> None:
        self._store = store
        self._version = -1
        self._body = b""

    def body(self) -> bytes:
        version = self._store.version
        if version != self._version:
            self._body = pod_list_json(self._store.pods())
            self._version = version
        return self._body


# --- the blueprints --------------------------------------------------------------------------


def _json_response(body: bytes) -> Response:
    response: Response = current_app.response_class(body, content_type="application/json")
    return response


@dataclass(frozen=True)
class NodeBlueprints:
    """``read_only`` goes on 10255 (and 10250); ``full`` = ``read_only`` + the rest, for 10250."""

    read_only: list[Blueprint]
    full: list[Blueprint]


def node_blueprints(view: NodeView, metrics: AgentMetrics, *,
                    machine_info: dict[str, Any] | None = None,
                    started_at: float | None = None) -> NodeBlueprints:
    """The node endpoints over ``view``. Reads the machine description now (blocking,
    ~ms) unless ``machine_info`` is given."""
    machine = json.dumps(machine_info if machine_info is not None else read_machine_spec()
                         ).encode()
    configz = json.dumps({"kubeletconfig": view.options.config.to_wire()}).encode()
    pod_lists = _PodListCache(view.store)

    read_only = Blueprint("node_read_only", __name__)

    @read_only.route("/pods")
    @read_only.route("/pods/")
    async def pods() -> Response:
        return _json_response(pod_lists.body())

    @read_only.route("/spec")
    @read_only.route("/spec/")
    async def spec() -> Response:
        return _json_response(machine)

    @read_only.route("/metrics")
    async def agent_metrics() -> Response:
        response: Response = current_app.response_class(metrics.render(),
                                                        content_type=METRICS_CONTENT_TYPE)
        return response

    @read_only.route("/metrics/probes")
    async def probe_metrics() -> Response:
        response: Response = current_app.response_class(metrics.render_probes(),
                                                        content_type=METRICS_CONTENT_TYPE)
        return response

    full_only = Blueprint("node", __name__)

    @full_only.route("/configz")
    async def config() -> Response:
        return _json_response(configz)

    healthz = healthz_blueprint(view, started_at=started_at)
    return NodeBlueprints(read_only=[healthz, read_only], full=[healthz, read_only, full_only])
