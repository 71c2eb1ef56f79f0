"""kube_events: the correlator's rules (pure, time in the events) and the recorder's sender
against httpx's MockTransport."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import httpx
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.kubeconfig import Connection
from trio_kubelet.kube_events import EventRecorder, node_ref, pod_ref
from trio_kubelet.kube_events.correlator import (
    AGGREGATE_PREFIX,
    LRU,
    SPAM_BURST,
    Event,
    EventCorrelator,
    EventType,
    ObjectRef,
    Write,
    new_event,
)
from trio_kubelet.kube_events.recorder import QUEUE_SIZE, RETRY_SLEEP
from trio_kubelet.model.pod import Pod

T0 = 1_700_000_000.0
NODE = "node-a"
UID = "5d1f0c9e-2222-4000-8000-000000000001"
POD = Pod.model_validate({
    "metadata": {"name": "web", "namespace": "shop", "uid": UID, "resourceVersion": "42"},
    "spec": {
        "initContainers": [{"name": "setup", "image": "busybox:1.36"}],
        "containers": [{"name": "main", "image": "busybox:1.36"}],
        "ephemeralContainers": [{"name": "debug", "image": "busybox:1.36"}],
    },
})
MAIN = pod_ref(POD, "main")


def at(t: float, message: str = "Started container main", *, reason: str = "Started",
       ref: ObjectRef = MAIN, type: EventType = "Normal") -> Event:
    """An occurrence ``t`` seconds after T0."""
    return new_event(ref, type, reason, message, host=NODE, nanos=int((T0 + t) * 1e9))


# -- references and the Event object -------------------------------------------------------


def test_container_refs_name_the_container_by_its_kind_of_field() -> None:
    assert MAIN.to_api() == {"kind": "Pod", "namespace": "shop", "name": "web", "uid": UID,
                             "apiVersion": "v1", "resourceVersion": "42",
                             "fieldPath": "spec.containers{main}"}
    assert pod_ref(POD, "setup").field_path == "spec.initContainers{setup}"
    assert pod_ref(POD, "debug").field_path == "spec.ephemeralContainers{debug}"
    assert pod_ref(POD, "gone").field_path == ""  # still shown on the pod
    assert pod_ref(POD).field_path == ""
    assert node_ref(NODE).to_api() == {"kind": "Node", "name": NODE, "uid": NODE}


def test_an_event_is_written_as_the_go_kubelet_writes_it() -> None:
    event = at(0.5)
    assert event.to_api() == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"web.{int((T0 + 0.5) * 1e9):x}", "namespace": "shop"},
        "involvedObject": MAIN.to_api(),
        "reason": "Started",
        "message": "Started container main",
        "source": {"component": "kubelet", "host": NODE},
        "firstTimestamp": "2023-11-14T22:13:20Z",
        "lastTimestamp": "2023-11-14T22:13:20Z",
        "count": 1,
        "type": "Normal",
        "reportingComponent": "kubelet",
        "reportingInstance": NODE,
    }
    assert at(0, "OOM", ref=node_ref(NODE)).namespace == "default"


# -- the correlator ------------------------------------------------------------------------


def test_an_identical_event_updates_the_first_with_its_count() -> None:
    correlator = EventCorrelator()
    first = correlator.correlate(at(0))
    again = correlator.correlate(at(7))
    assert first == Write(at(0), update=False)
    assert again is not None and again.update
    assert (again.event.name, again.event.count) == (first.event.name, 2)
    assert again.event.first_timestamp == T0
    assert again.event.last_timestamp == T0 + 7
    assert again.event.update_patch() == {
        "count": 2, "lastTimestamp": "2023-11-14T22:13:27Z", "message": "Started container main"}


def test_events_differing_in_anything_but_time_are_distinct() -> None:
    correlator = EventCorrelator()
    writes = [correlator.correlate(event) for event in (
        at(0), at(1, ref=pod_ref(POD, "setup")), at(2, type="Warning"), at(3, reason="Other"))]
    assert all(w is not None and not w.update for w in writes)


def test_ten_similar_events_become_one_aggregate_that_later_ones_update() -> None:
    correlator = EventCorrelator()
    messages = [f"Error: exit {i}" for i in range(12)]
    writes = [correlator.correlate(at(i * 30, m, reason="Failed")) for i, m in enumerate(messages)]
    assert all(w is not None for w in writes)
    plain, aggregated = writes[:9], writes[9:]
    assert [w.event.message for w in plain if w] == messages[:9]
    first = aggregated[0]
    assert first is not None and not first.update
    assert first.event.message == AGGREGATE_PREFIX + messages[9]
    for count, w in enumerate(aggregated[1:], start=2):
        assert w is not None and w.update
        assert (w.event.name, w.event.count) == (first.event.name, count)
    assert aggregated[-1] is not None
    assert aggregated[-1].event.message == AGGREGATE_PREFIX + messages[11]


def test_similar_events_further_apart_than_ten_minutes_are_not_aggregated() -> None:
    correlator = EventCorrelator()
    writes = [correlator.correlate(at(i * 601, f"Error: exit {i}")) for i in range(15)]
    assert all(w is not None and not w.event.message.startswith(AGGREGATE_PREFIX)
               for w in writes)


def test_an_object_may_burst_25_events_then_one_every_five_minutes() -> None:
    correlator = EventCorrelator()
    writes = [correlator.correlate(at(0.001 * i)) for i in range(30)]
    assert [w is not None for w in writes] == [True] * SPAM_BURST + [False] * 5
    other = ObjectRef(kind="Pod", name="api", namespace="shop", uid="other")
    assert correlator.correlate(at(1, ref=other)) is not None  # a bucket per object
    assert correlator.correlate(at(200)) is None
    later = correlator.correlate(at(301))
    assert later is not None and later.update
    assert later.event.count == 32  # the dropped repeats still count


def test_memory_is_bounded_and_forgotten_events_start_over() -> None:
    correlator = EventCorrelator(cache_size=2)
    refs = [ObjectRef(kind="Node", name=f"n{i}", uid=f"n{i}") for i in range(3)]
    for i, ref in enumerate(refs):
        assert correlator.correlate(at(i, ref=ref)) is not None
    again = correlator.correlate(at(5, ref=refs[0]))
    assert again is not None and not again.update  # n0 fell out of the caches
    repeat = correlator.correlate(at(6, ref=refs[2]))
    assert repeat is not None and repeat.update


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 20)), max_size=300))
def test_lru_keeps_the_most_recently_used_keys(ops: list[tuple[str, int]]) -> None:
    lru: LRU[str, int] = LRU(size=3)
    recent: list[str] = []  # the model: keys, least recently used first
    for key, value in ops:
        if value % 2:
            lru.put(key, value)
        elif lru.get(key) is None:
            continue
        recent = [k for k in recent if k != key] + [key]
        recent = recent[-3:]
        assert len(lru) == len(recent) <= 3
    assert all(lru.get(k) is not None for k in recent)


@given(st.lists(st.tuples(st.sampled_from(["web", "api"]),
                          st.sampled_from(["Failed", "BackOff"]),
                          st.integers(0, 12),  # the message
                          st.floats(0.001, 400)),  # seconds since the previous event
                max_size=200))
def test_correlation_invariants(steps: list[tuple[str, str, int, float]]) -> None:
    """Counts only grow per Event, no object exceeds its rate, updates name known Events."""
    correlator = EventCorrelator()
    t = 0.0
    counts: dict[str, int] = {}
    named: set[str] = set()
    writes_per_object: dict[str, int] = {}
    for name, reason, message, gap in steps:
        t += gap
        ref = ObjectRef(kind="Pod", name=name, namespace="shop", uid=name)
        event = at(t, f"message {message}", reason=reason, ref=ref)
        named.add(event.name)
        write = correlator.correlate(event)
        if write is None:
            continue
        written = write.event
        assert written.name in named
        assert written.update_patch()["count"] > counts.get(written.name, 0)
        assert write.update == (written.count > 1)
        counts[written.name] = written.count
        writes_per_object[name] = writes_per_object.get(name, 0) + 1
        assert writes_per_object[name] <= SPAM_BURST + t / 300 + 1


# -- the recorder --------------------------------------------------------------------------


def recorder_for(handler: Callable[[httpx.Request], httpx.Response], *,
                 queue_size: int = QUEUE_SIZE, retry_sleep: float = RETRY_SLEEP
                 ) -> EventRecorder:
    client = APIClient(Connection(server="http://api.test", ssl_context=None, token=None),
                       transport=httpx.MockTransport(handler))
    return EventRecorder(NODE, client, clock=lambda: T0, queue_size=queue_size,
                         retry_sleep=retry_sleep)


def created(request: httpx.Request) -> httpx.Response:
    return httpx.Response(201, json=json.loads(request.content))


async def send_all(recorder: EventRecorder, requests: list[httpx.Request], n: int) -> None:
    """Run the sender until it has made ``n`` requests (virtual time)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(recorder.run)
        with trio.fail_after(600):
            while len(requests) < n:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_a_repeated_event_is_posted_then_patched_with_count_2(
    autojump_clock: trio.testing.MockClock,
) -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return created(request)

    recorder = recorder_for(handler)
    for _ in range(2):
        recorder.pod_event(POD, "Normal", "Pulled", "Container image \"busybox:1.36\" already "
                           "present on machine", "main")
    await send_all(recorder, requests, 2)

    post, patch = requests
    body = json.loads(post.content)
    name = body["metadata"]["name"]
    assert (post.method, post.url.path) == ("POST", "/api/v1/namespaces/shop/events")
    assert name == f"web.{int(T0 * 1e9):x}"
    assert body["involvedObject"]["fieldPath"] == "spec.containers{main}"
    assert (body["count"], body["source"]) == (1, {"component": "kubelet", "host": NODE})
    assert (patch.method, patch.url.path) == ("PATCH", f"/api/v1/namespaces/shop/events/{name}")
    assert patch.headers["Content-Type"] == "application/strategic-merge-patch+json"
    assert json.loads(patch.content)["count"] == 2


async def test_names_stay_unique_when_the_clock_stands_still(
    autojump_clock: trio.testing.MockClock,
) -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return created(request)

    recorder = recorder_for(handler)
    recorder.pod_event(POD, "Normal", "Created", "Created container: main", "main")
    recorder.pod_event(POD, "Normal", "Started", "Started container main", "main")
    await send_all(recorder, requests, 2)
    names = {json.loads(r.content)["metadata"]["name"] for r in requests}
    assert len(names) == 2


async def test_a_patch_of_an_expired_event_creates_it_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if request.method == "PATCH":
            return httpx.Response(404, json={"kind": "Status", "reason": "NotFound"})
        return created(request)

    recorder = recorder_for(handler)
    recorder.node_event(NODE, "Warning", "OOMKilling", "Memory cgroup out of memory")
    recorder.node_event(NODE, "Warning", "OOMKilling", "Memory cgroup out of memory")
    await send_all(recorder, requests, 3)
    assert [r.method for r in requests] == ["POST", "PATCH", "POST"]
    assert requests[2].url.path == "/api/v1/namespaces/default/events"
    assert json.loads(requests[2].content)["count"] == 2


async def test_transient_failures_are_retried_and_rejections_are_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        reason = json.loads(request.content)["reason"]
        if reason == "Forbidden":
            return httpx.Response(403, json={"kind": "Status", "reason": "Forbidden"})
        if len(requests) <= 3:
            return httpx.Response(503, json={"kind": "Status"})
        return created(request)

    recorder = recorder_for(handler)
    recorder.pod_event(POD, "Normal", "Retried", "once the server is back")
    recorder.pod_event(POD, "Normal", "Forbidden", "not retried")
    recorder.pod_event(POD, "Normal", "Last", "after the rejection")
    start = trio.current_time()
    await send_all(recorder, requests, 6)
    reasons = [json.loads(r.content)["reason"] for r in requests]
    assert reasons == ["Retried"] * 4 + ["Forbidden", "Last"]
    assert 20 <= trio.current_time() - start <= 30  # a random first sleep, then 10 s twice


async def test_an_event_is_given_up_after_12_tries(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if json.loads(request.content)["reason"] == "Doomed":
            raise httpx.ConnectError("connection refused")
        return created(request)

    recorder = recorder_for(handler, retry_sleep=1.0)
    recorder.pod_event(POD, "Normal", "Doomed", "never written")
    recorder.pod_event(POD, "Normal", "Next", "written")
    await send_all(recorder, requests, 13)
    assert [json.loads(r.content)["reason"] for r in requests] == ["Doomed"] * 12 + ["Next"]
    assert "after 12 tries" in caplog.text


async def test_a_full_queue_drops_without_blocking(caplog: pytest.LogCaptureFixture) -> None:
    recorder = recorder_for(created, queue_size=3)  # nothing sends: the queue only fills
    with trio.fail_after(1):
        for i in range(10):
            recorder.pod_event(POD, "Normal", "Spam", f"event {i}")
    assert recorder.dropped == 7
    drops = [r for r in caplog.records if r.message.startswith("Dropped")]
    assert len(drops) == 1  # not once per drop


async def test_events_are_logged_once_at_a_level_fitting_the_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="trio_kubelet.kube_events")
    sending = recorder_for(created)
    sending.pod_event(POD, "Normal", "Pulled", "present", "main")
    sending.pod_event(POD, "Warning", "BackOff", "restarting", "main")
    sending.pod_event(POD, "Normal", "Started", "already in the worker's log", logged=True)
    standalone = EventRecorder(NODE)
    standalone.pod_event(POD, "Warning", "Failed", "nobody to tell")
    levels = [(r.levelno, r.message) for r in caplog.records]
    assert levels == [
        (logging.INFO, "Event Normal Pod shop/web spec.containers{main} Pulled: present"),
        (logging.WARNING, "Event Warning Pod shop/web spec.containers{main} BackOff: restarting"),
        (logging.DEBUG, "Event Normal Pod shop/web Started: already in the worker's log"),
        (logging.DEBUG, "Event Warning Pod shop/web Failed: nobody to tell"),
    ]
    with trio.fail_after(1):
        await standalone.run()  # nothing to send to: returns at once
