"""The node's own endpoints: /healthz, /pods, /spec, /configz, /metrics, /metrics/probes.

Three blueprints, by the servers that carry them (as the Go kubelet splits them):
``healthz`` (10250 and 10255; the healthz port's own server gives the same
answers, both from ``health.NodeHealth``), ``node_read_only`` (/pods, /spec, /metrics*: also
on the read-only port 10255) and ``node`` (/configz: only on the authenticated
port 10250). Handlers read published state only — the status store, the health
timestamps, the metrics registries and a machine description read once at start.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quart import Blueprint, Response, current_app, request

from trio_kubelet.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.model.pod import Pod
from trio_kubelet.node.machine_info import read_machine_spec
from trio_kubelet.server.app import plain_response
from trio_kubelet.server.health import HEALTHZ_PATH, NodeHealth
from trio_kubelet.server.view import NodeView
from trio_kubelet.status.store import PodStatusStore

__all__ = [
    "NodeBlueprints",
    "healthz_blueprint",
    "node_blueprints",
    "pod_list_json",
]


# --- /healthz --------------------------------------------------------------------------------


def healthz_blueprint(health: NodeHealth) -> Blueprint:
    """``/healthz`` (``?verbose``, ``?exclude=NAME``) and ``/healthz/{ping,syncloop,pleg}``."""
    blueprint = Blueprint("healthz", __name__)

    @blueprint.route(HEALTHZ_PATH)
    @blueprint.route(HEALTHZ_PATH + "/<name>")
    async def healthz(name: str | None = None) -> Response:
        answer = health.answer(request.path, request.query_string.decode("latin-1"))
        if answer is None:
            return plain_response(404, "404 page not found\n")
        return plain_response(*answer)

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

    healthz = healthz_blueprint(NodeHealth(view, started_at=started_at))
    return NodeBlueprints(read_only=[healthz, read_only], full=[healthz, read_only, full_only])
