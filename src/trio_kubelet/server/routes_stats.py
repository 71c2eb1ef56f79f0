"""The resource endpoints: /stats/summary, /metrics/cadvisor and /metrics/resource.

All three are rendered from the sampler's latest sample (``view.latest_sample()``)
by the pure builders of ``core/stats.py``, once per sample: a scrape never
touches the file system, and fifty clients scraping one sample share one
rendering. They are read-only endpoints, so the blueprint goes on 10250 and on
the read-only port alike.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable

from quart import Blueprint, Response, current_app, request

from trio_kubelet.core.stats import (
    PROMETHEUS_CONTENT_TYPE,
    Sample,
    build_cadvisor_metrics,
    build_resource_metrics,
    summary_json,
)
from trio_kubelet.model.pod import Pod
from trio_kubelet.server.app import plain_response
from trio_kubelet.server.view import NodeView
from trio_kubelet.status.store import PodStatusStore

__all__ = ["stats_blueprint"]

# What the Go kubelet answers while cAdvisor has no figures yet (handleError: 500).
NO_SAMPLE_YET = "Internal Error: failed to get node stats: no resource sample taken yet\n"


def _latest(view: NodeView) -> Sample | None:
    sample = view.latest_sample()
    return sample if isinstance(sample, Sample) else None


class _SummaryPods:
    """The pods a summary covers, with their UIDs as its cache key, taken from the status
    store again only when its version moves: a request neither sorts nor walks the pods."""

    def __init__(self, store: PodStatusStore) -> None:
        self._store = store
        self._version = -1
        self._pods: list[Pod] = []
        self._uids: tuple[str, ...] = ()

    def current(self) -> tuple[list[Pod], tuple[str, ...]]:
        version = self._store.version
        if version != self._version:
            self._pods = self._store.pods()
            self._uids = tuple(pod.metadata.uid for pod in self._pods)
            self._version = version
        return self._pods, self._uids


def _metrics_response(
    sample: Sample | None, key: str, build: Callable[[Sample | None], str]
) -> Response:
    """Prometheus text, gzipped when the scraper accepts it (as promhttp does)."""
    if sample is None:
        return _text(build(None).encode())
    text = sample.rendered(key, lambda: build(sample).encode())
    if not _accepts_gzip(request.headers.get("Accept-Encoding", "")):
        return _text(text)
    # Level 1: ~2 ms for the ~1 MB of 110 pods' cAdvisor text, 20x smaller; once per sample.
    response = _text(sample.rendered((key, "gzip"), lambda: gzip.compress(text, compresslevel=1)))
    response.headers["Content-Encoding"] = "gzip"
    response.headers["Vary"] = "Accept-Encoding"
    return response


def _accepts_gzip(header: str) -> bool:
    for part in header.split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() == "gzip":
            return params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


def _text(body: bytes) -> Response:
    response: Response = current_app.response_class(body, content_type=PROMETHEUS_CONTENT_TYPE)
    return response


def stats_blueprint(view: NodeView) -> Blueprint:
    """The ``stats`` blueprint over ``view``: for both the full and the read-only server."""
    blueprint = Blueprint("stats", __name__)
    summary_pods = _SummaryPods(view.store)

    @blueprint.route("/stats/summary", methods=["GET", "POST"])
    async def summary() -> Response:
        sample = _latest(view)
        if sample is None:
            return plain_response(500, NO_SAMPLE_YET)
        # Go: exactly one only_cpu_and_memory value, "true" (query or form).
        values = request.args.getlist("only_cpu_and_memory")
        if request.method == "POST":
            values += (await request.form).getlist("only_cpu_and_memory")
        cpu_and_memory_only = values == ["true"]
        pods, uids = summary_pods.current()
        node_name = view.options.node_name
        key = ("summary", cpu_and_memory_only, node_name, uids)
        body = sample.rendered(key, lambda: summary_json(
            sample, node_name, pods, cpu_and_memory_only=cpu_and_memory_only))
        response: Response = current_app.response_class(body, content_type="application/json")
        return response

    @blueprint.route("/metrics/cadvisor")
    async def cadvisor() -> Response:
        return _metrics_response(_latest(view), "cadvisor", build_cadvisor_metrics)

    @blueprint.route("/metrics/resource")
    async def resource() -> Response:
        return _metrics_response(_latest(view), "resource", build_resource_metrics)

    return blueprint
