"""Per-change rendering of the server's answers: /pods and /stats/summary follow the status
store's version, the request metrics reuse their label series."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_server_routes_node import Times, make_pod, make_view, serving
from tests.unit.test_stats import Latest, two_samples
from tests.unit.test_stats import make_pod as make_stats_pod
from tests.unit.test_stats import make_view as make_stats_view
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.model.pod import PodStatus
from trio_kubelet.server import routes_node
from trio_kubelet.server.app import create_app
from trio_kubelet.server.routes_stats import stats_blueprint
from trio_kubelet.status.store import PodStatusStore


def test_store_version_moves_only_on_changes() -> None:
    store = PodStatusStore()
    assert store.version == 0
    store.set(make_pod("web"), PodStatus(phase="Running"))
    assert store.version == 1
    store.set(make_pod("web"), PodStatus(phase="Running"))
    assert store.version == 1, "an identical status is no change"
    store.set(make_pod("web"), PodStatus(phase="Running"), stopped=True)
    assert store.version == 2
    store.remove("uid-nope")
    assert store.version == 2
    store.remove("uid-web")
    assert store.version == 3


async def test_pods_body_is_rendered_once_per_store_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    renders: list[int] = []
    render = routes_node.pod_list_json

    def counting(pods: Any) -> bytes:
        renders.append(len(pods))
        return render(pods)

    monkeypatch.setattr(routes_node, "pod_list_json", counting)
    store = PodStatusStore()
    store.set(make_pod("web"), PodStatus(phase="Running"))
    async with serving(make_view(Times(), store)) as client:
        bodies = {(await client.get(path)).content for path in ("/pods", "/pods/", "/pods")}
        assert len(bodies) == 1 and renders == [1]

        store.set(make_pod("db"), PodStatus(phase="Pending"))
        items = (await client.get("/pods")).json()["items"]
        assert [p["metadata"]["name"] for p in items] == ["db", "web"]
        store.set(make_pod("db"), PodStatus(phase="Running"))
        items = (await client.get("/pods")).json()["items"]
        assert items[0]["status"]["phase"] == "Running"
        await client.get("/pods")
        assert renders == [1, 2, 2]


async def test_summary_takes_the_pods_from_the_store_once_per_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    latest = Latest()
    _, latest.sample = two_samples()
    view = make_stats_view(latest)
    reads: list[int] = []
    pods = view.store.pods
    monkeypatch.setattr(view.store, "pods", lambda: reads.append(1) or pods())
    client = create_app(view, [stats_blueprint(view)]).test_client()

    first = await (await client.get("/stats/summary")).get_data()
    assert first == await (await client.get("/stats/summary")).get_data()
    assert len(reads) == 1
    assert "ephemeral-storage" not in (await (await client.get("/stats/summary")).get_json()
                                       )["pods"][0], "only the agent's own pods have it"

    view.store.set(make_stats_pod(), PodStatus(phase="Running"))
    summary = await (await client.get("/stats/summary")).get_json()
    assert "ephemeral-storage" in summary["pods"][0]
    assert len(reads) == 2


async def test_request_metrics_count_every_request_on_reused_series() -> None:
    metrics = AgentMetrics()
    async with serving(make_view(Times()), metrics) as client:
        for path in ("/healthz", "/healthz", "/healthz", "/pods", "/pods"):
            assert (await client.get(path)).status_code == 200
    families = {family.name: family
                for family in text_string_to_metric_families(metrics.render().decode())}
    counts = {s.labels["path"]: s.value for s in families["kubelet_http_requests"].samples
              if s.name == "kubelet_http_requests_total"}
    assert counts == {"healthz": 3, "pods": 2}
    assert {s.value for s in families["kubelet_http_inflight_requests"].samples} == {0}
    durations = {s.labels["path"]: s.value
                 for s in families["kubelet_http_requests_duration_seconds"].samples
                 if s.name.endswith("_count")}
    assert durations == {"healthz": 3, "pods": 2}
