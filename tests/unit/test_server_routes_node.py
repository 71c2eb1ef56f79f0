"""server.routes_node: /healthz, /pods, /spec, /configz, /metrics over a real socket."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import cast

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.model.pod import Pod, PodStatus
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.server.app import create_app
from trio_kubelet.server.health import healthz_report, pleg_error, syncloop_error
from trio_kubelet.server.routes_node import node_blueprints, pod_list_json
from trio_kubelet.server.serve import serve_app
from trio_kubelet.server.view import NodeView
from trio_kubelet.status.store import PodStatusStore

MACHINE = {"num_cores": 4, "machine_id": "m-1"}


class Times:
    """The health timestamps the agent would publish."""

    def __init__(self) -> None:
        self.relist: float | None = None
        self.sync_loop: float | None = None


def make_pod(name: str, namespace: str = "default") -> Pod:
    return Pod.model_validate({
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    })


def make_view(times: Times, store: PodStatusStore | None = None) -> NodeView:
    options = AgentOptions(config=KubeletConfiguration(), node_name="node-a",
                           root_dir=Path("/nonexistent"))
    return NodeView(options=options, store=store or PodStatusStore(),
                    client=cast(CRIClient, object()),
                    last_relist=lambda: times.relist, last_sync_loop=lambda: times.sync_loop)


@asynccontextmanager
async def serving(view: NodeView, metrics: AgentMetrics | None = None,
                  started_at: float | None = None) -> AsyncIterator[httpx.AsyncClient]:
    blueprints = node_blueprints(view, metrics or AgentMetrics(), machine_info=MACHINE,
                                 started_at=started_at)
    app = create_app(view, blueprints.full, metrics=metrics)
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(partial(serve_app, app, "127.0.0.1", 0))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            yield client
        nursery.cancel_scope.cancel()


# --- pure parts ------------------------------------------------------------------------------


def test_syncloop_error_uses_twice_the_sync_frequency_but_at_least_five_minutes() -> None:
    assert syncloop_error(1000.0, None, 60.0) is None
    assert syncloop_error(1000.0, 1000.0 - 299, 60.0) is None
    assert syncloop_error(1000.0, 1000.0 - 300.6, 60.0) == (
        "sync loop took longer than expected: last ran 5m1s ago; threshold is 5m0s")
    assert syncloop_error(1000.0, 1000.0 - 301, 200.0) is None


def test_pleg_error_after_three_minutes_without_a_relist() -> None:
    assert pleg_error(1000.0, 1000.0 - 179, started_at=0.0) is None
    assert pleg_error(1000.0, 1000.0 - 181, started_at=0.0) == (
        "pleg was last seen active 3m1s ago; threshold is 3m0s")
    assert pleg_error(1000.0, None, started_at=1000.0 - 60) is None
    assert pleg_error(1000.0, None, started_at=1000.0 - 181) == "pleg has yet to be successful"


def test_healthz_report_has_the_apiserver_shape() -> None:
    ok = [("ping", None), ("pleg", None)]
    assert healthz_report(ok, [], verbose=False) == (200, "ok")
    assert healthz_report(ok, [], verbose=True) == (
        200, "[+]ping ok\n[+]pleg ok\nhealthz check passed\n")
    failing = [("ping", None), ("pleg", "stale")]
    assert healthz_report(failing, [], verbose=False) == (
        500, "[+]ping ok\n[-]pleg failed: reason withheld\nhealthz check failed\n")
    assert healthz_report(failing, ["pleg", "nope"], verbose=True) == (
        200, '[+]ping ok\n[+]pleg excluded: ok\nwarn: some health checks cannot be excluded: '
             'no matches for "nope"\nhealthz check passed\n')


def test_pod_list_json_is_a_v1_pod_list() -> None:
    pod = make_pod("web").model_copy(update={"status": PodStatus(phase="Running")})
    decoded = json.loads(pod_list_json([pod]))
    assert decoded["kind"] == "PodList" and decoded["apiVersion"] == "v1"
    assert decoded["metadata"] == {}
    assert decoded["items"][0]["metadata"]["name"] == "web"
    assert decoded["items"][0]["status"]["phase"] == "Running"
    assert json.loads(pod_list_json([]))["items"] == []


# --- over HTTP -------------------------------------------------------------------------------


async def test_healthz_ok_then_unhealthy_when_pleg_is_stale(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trio_kubelet.server")
    times = Times()
    view = make_view(times)
    async with serving(view) as client:
        times.relist = trio.current_time()
        times.sync_loop = trio.current_time()
        response = await client.get("/healthz")
        assert (response.status_code, response.text) == (200, "ok")
        assert response.headers["content-type"] == "text/plain; charset=utf-8"
        verbose = await client.get("/healthz", params={"verbose": ""})
        assert verbose.text == "[+]ping ok\n[+]syncloop ok\n[+]pleg ok\nhealthz check passed\n"
        assert (await client.get("/healthz/pleg")).text == "ok"

        times.relist = trio.current_time() - 200
        response = await client.get("/healthz")
        assert response.status_code == 500
        assert response.text == ("[+]ping ok\n[+]syncloop ok\n[-]pleg failed: reason withheld\n"
                                 "healthz check failed\n")
        check = await client.get("/healthz/pleg")
        assert check.status_code == 500
        assert check.text == ("internal server error: pleg was last seen active 3m20s ago; "
                              "threshold is 3m0s\n")
        assert (await client.get("/healthz/ping")).text == "ok"
        assert (await client.get("/healthz", params={"exclude": "pleg"})).status_code == 200
        assert (await client.get("/healthz/nope")).status_code == 404
        await client.get("/healthz")
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
            "healthz check pleg failed: pleg was last seen active 3m20s ago; threshold is 3m0s"]


async def test_healthz_pleg_never_relisted_is_unhealthy_after_the_threshold() -> None:
    times = Times()
    async with serving(make_view(times), started_at=trio.current_time() - 181) as client:
        response = await client.get("/healthz/pleg")
        assert response.status_code == 500
        assert response.text == "internal server error: pleg has yet to be successful\n"
        times.sync_loop = trio.current_time() - 400
        assert (await client.get("/healthz/syncloop")).status_code == 500


async def test_pods_is_the_store_as_a_pod_list_and_follows_changes() -> None:
    store = PodStatusStore()
    store.set(make_pod("web"), PodStatus(phase="Running", pod_ip="10.88.0.2"))
    store.set(make_pod("db", "data"), PodStatus(phase="Pending"))
    async with serving(make_view(Times(), store)) as client:
        response = await client.get("/pods")
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        body = response.json()
        assert (body["kind"], body["apiVersion"], body["metadata"]) == ("PodList", "v1", {})
        assert [(p["metadata"]["namespace"], p["metadata"]["name"], p["status"]["phase"])
                for p in body["items"]] == [("data", "db", "Pending"),
                                            ("default", "web", "Running")]
        assert body["items"][1]["status"]["podIP"] == "10.88.0.2"
        assert body["items"][1]["spec"]["containers"][0]["image"] == "busybox:1.36"
        assert (await client.get("/pods/")).json() == body

        store.set(make_pod("web"), PodStatus(phase="Succeeded"))
        store.remove("uid-db")
        after = (await client.get("/pods")).json()
        assert [p["status"]["phase"] for p in after["items"]] == ["Succeeded"]


async def test_configz_spec_and_head() -> None:
    view = make_view(Times())
    async with serving(view) as client:
        configz = (await client.get("/configz")).json()
        assert configz == {"kubeletconfig": view.options.config.to_wire()}
        assert configz["kubeletconfig"]["syncFrequency"] == "1m0s"
        assert (await client.get("/spec/")).json() == MACHINE
        head = await client.head("/pods")
        assert head.status_code == 200 and head.content == b""


async def test_metrics_parse_and_count_the_requests() -> None:
    metrics = AgentMetrics("node-a")
    async with serving(make_view(Times()), metrics) as client:
        await client.get("/pods")
        await client.get("/nope")
        response = await client.get("/metrics")
        assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        found = {f.name: f for f in text_string_to_metric_families(response.text)}
        requests = {(s.labels["method"], s.labels["path"]): s.value
                    for s in found["kubelet_http_requests"].samples}
        assert requests[("GET", "pods")] == 1.0
        assert requests[("GET", "other")] == 1.0
        assert requests[("GET", "metrics")] == 1.0
        assert {s.labels["server_type"] for s in found["kubelet_http_requests"].samples} == \
            {"readwrite"}
        inflight = {s.labels["path"]: s.value
                    for s in found["kubelet_http_inflight_requests"].samples}
        assert inflight == {"pods": 0.0, "other": 0.0, "metrics": 1.0}
        probes = await client.get("/metrics/probes")
        assert (probes.status_code, probes.text) == (200, "")


async def test_read_only_blueprints_leave_out_configz() -> None:
    view = make_view(Times())
    blueprints = node_blueprints(view, AgentMetrics(), machine_info=MACHINE)
    app = create_app(view, blueprints.read_only)
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(partial(serve_app, app, "127.0.0.1", 0))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/configz")).status_code == 404
            assert (await client.get("/pods")).status_code == 200
            assert (await client.get("/healthz")).status_code == 200
        nursery.cancel_scope.cancel()
