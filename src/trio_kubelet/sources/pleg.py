"""The pod lifecycle event generator: runtime changes as events on the sync loop's channel.

It relists the runtime every second, as the Go kubelet's generic PLEG does. Where the
runtime streams its container events (CRI GetContainerEvents: containerd 2.x) it also keeps
that stream open and tells each change the moment it arrives; the relist is then a safety
net that runs every `EVENTED_RELIST_PERIOD`, and one `RELIST_PERIOD` after anything the
stream told (so the OOM watcher learns new containers as soon as it would without the
stream). While the stream is down or not yet proven, and on a runtime without it
(containerd 1.6 answers UNIMPLEMENTED), relists run every second exactly as without it.
`core.pleg.PlegRecords` merges both inputs, so each change is told once whichever input
sees it first, across reconnects too: a reopened stream is followed by a relist one period
later, which finds whatever changed while no stream was open.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import trio

from trio_kubelet.core.observed import RuntimePodStatus
from trio_kubelet.core.pleg import Lifecycle, PlegRecords, RuntimeEvent, snapshot
from trio_kubelet.events import (
    ContainerEventStream,
    Event,
    PodLifecycleEvent,
    RelistDone,
    StreamState,
)
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.errors import CRIError, CRIUnimplemented
from trio_kubelet.runtime.inspect import relist, runtime_event

log = logging.getLogger("trio_kubelet.pleg")

RELIST_PERIOD = 1.0
#: The relist period while the event stream is up and nothing happens (Go's evented PLEG
#: relists every 300 s; this stays well inside the health check's 3 min).
EVENTED_RELIST_PERIOD = 30.0
#: Reopening a stream that failed: after 1 s, doubling to 30 s while it keeps failing.
STREAM_RETRY, STREAM_RETRY_MAX = 1.0, 30.0
#: A runtime that answered UNIMPLEMENTED is asked again this much later (it may have been
#: upgraded and restarted meanwhile).
STREAM_UNSUPPORTED_RETRY = 300.0


@dataclass(frozen=True, slots=True)
class _Opened:
    """The event stream was opened (the request is sent; the runtime may not have it yet)."""


@dataclass(frozen=True, slots=True)
class _Closed:
    error: CRIError


_StreamNews = _Opened | _Closed | RuntimeEvent


#: The agent's metrics and the wall clock the relist gauges read.
PlegMetrics = tuple[AgentMetrics, Callable[[], float]]


def _report(
    metrics: AgentMetrics,
    pods: Mapping[str, RuntimePodStatus],
    duration: float,
    interval: float | None,
    wall_time: float,
) -> None:
    by_state: Counter[str] = Counter()
    running_pods = 0
    for pod in pods.values():
        states = [c.state.value for c in pod.containers]
        by_state.update(states)
        running_pods += "running" in states
    metrics.record_relist(
        duration=duration,
        interval=interval,
        wall_time=wall_time,
        running_pods=running_pods,
        containers_by_state=by_state,
    )


async def watch_container_events(client: CRIClient,
                                 news: trio.MemorySendChannel[_StreamNews]) -> None:
    """Keep a GetContainerEvents stream open and pass on what it says, reopening it when it
    fails: `STREAM_RETRY` later, doubling while it keeps failing at once (a stream that
    lasted longer than the wait starts over), `STREAM_UNSUPPORTED_RETRY` after UNIMPLEMENTED."""
    retry = STREAM_RETRY
    async with news:
        while True:
            opened = trio.current_time()
            try:
                async with client.container_events() as stream:
                    await news.send(_Opened())
                    async for message in stream:
                        event = runtime_event(message)
                        if event is not None:
                            await news.send(event)
            except CRIError as error:
                await news.send(_Closed(error))
                if isinstance(error, CRIUnimplemented):
                    await trio.sleep(STREAM_UNSUPPORTED_RETRY)
                    continue
                if trio.current_time() - opened > retry:
                    retry = STREAM_RETRY
                await trio.sleep(retry)
                retry = min(retry * 2, STREAM_RETRY_MAX)


class _Pleg:
    """One PLEG's state: the records, the stream's state, when the next relist is due.

    Everything runs in one task, so no event is applied while a relist is in flight (what
    `PlegRecords` relies on): the stream's news waits in its channel meanwhile.
    """

    def __init__(self, send: trio.MemorySendChannel[Event], client: CRIClient, *,
                 period: float, evented_period: float, metrics: PlegMetrics | None,
                 on_relist: Callable[[Mapping[str, RuntimePodStatus]], None] | None) -> None:
        self.send = send
        self.client = client
        self.period = period
        self.evented_period = evented_period
        self.metrics = metrics
        self.on_relist = on_relist
        self.records = PlegRecords()
        self.failing = False
        self.last_start: float | None = None
        self.stream_opened: float | None = None  # when the open stream was opened
        self.stream_heard = False  # the open stream has delivered an event
        self.covered = False  # the stream was proven open when the last relist began
        self.changed_at = math.inf  # the first news since the last relist began
        self.told_open = False  # the sync loop was told the stream is open (and no more)
        self.told_unsupported = False

    def relist_due(self) -> float:
        if self.last_start is None:
            return -math.inf
        if self.covered and self.stream_opened is not None and not self.failing:
            return min(self.last_start + self.evented_period, self.changed_at + self.period)
        return self.last_start + self.period

    async def on_news(self, news: _StreamNews) -> None:
        self.changed_at = min(self.changed_at, trio.current_time())
        if isinstance(news, RuntimeEvent):
            self.stream_heard = True
            await self._tell_stream("open")
            self.records, changes = self.records.on_event(news)
            await self._tell(changes, "stream")
        elif isinstance(news, _Opened):
            self.stream_opened, self.stream_heard = trio.current_time(), False
        else:
            self.stream_opened = None
            if isinstance(news.error, CRIUnimplemented):
                if not self.told_unsupported:
                    log.info("The runtime has no container event stream; relisting every %gs",
                             self.period)
                    await self._tell_stream("unsupported", news.error)
                    self.told_unsupported = True
            elif self.told_open:
                log.warning("Container event stream lost: %s", news.error)
                await self._tell_stream("closed", news.error)

    async def _tell_stream(self, state: StreamState, error: CRIError | None = None) -> None:
        """Tell the sync loop (and so the recording) that the stream is proven open, lost
        after that, or not offered; each once per change."""
        if state == "open":
            if self.told_open:
                return
            log.info("Container event stream open; relisting every %gs while it stays quiet",
                     self.evented_period)
        self.told_open = state == "open"
        await self.send.send(ContainerEventStream(state=state,
                                                  error=str(error) if error else ""))

    async def relist(self) -> None:
        started = trio.current_time()
        opened = self.stream_opened
        # The stream covers this relist's period if the runtime surely had it before the
        # relist began: it delivered an event, or it was opened a whole period ago.
        self.covered = opened is not None and (self.stream_heard
                                               or started - opened >= self.period)
        if self.covered:
            await self._tell_stream("open")
        self.changed_at = math.inf
        try:
            pods = await relist(self.client)
        except CRIError as err:
            if not self.failing:
                log.warning("PLEG relist failed: %s", err)
            self.failing = True
            await self.send.send(RelistDone(ok=False, error=str(err)))
        else:
            if self.failing:
                log.info("PLEG relist recovered")
            self.failing = False
            if self.on_relist is not None:
                self.on_relist(pods)
            self.records, changes = self.records.relisted(snapshot(pods.values()))
            await self._tell(changes, "relist")
            duration = trio.current_time() - started
            if self.metrics is not None:
                interval = started - self.last_start if self.last_start is not None else None
                metrics, wall_clock = self.metrics
                _report(metrics, pods, duration, interval, wall_clock())
            await self.send.send(RelistDone(ok=True, duration=duration))
        self.last_start = started

    async def _tell(self, changes: list[Lifecycle], via: str) -> None:
        for change in changes:
            await self.send.send(PodLifecycleEvent(pod_uid=change.pod_uid, type=change.type,
                                                   container_id=change.container_id, via=via))


async def run_pleg(
    send: trio.MemorySendChannel[Event],
    client: CRIClient,
    *,
    period: float = RELIST_PERIOD,
    evented_period: float = EVENTED_RELIST_PERIOD,
    container_events: bool = True,
    metrics: PlegMetrics | None = None,
    on_relist: Callable[[Mapping[str, RuntimePodStatus]], None] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Send one event per container or sandbox state change, from relists and the stream.

    A failed relist keeps the previous records, so the changes it hid are reported by the
    next successful relist instead of being lost. ``on_relist`` is given each successful
    relist's pods (the OOM watcher's `update`), so no one else lists the runtime for the
    same answer; it must return at once. ``container_events=False`` relists only (every
    ``period``), as the Go kubelet does without its EventedPLEG feature gate. ``metrics``:
    where each relist is reported, with the wall clock its last-seen gauge reads.
    """
    pleg = _Pleg(send, client, period=period, evented_period=evented_period,
                 metrics=metrics, on_relist=on_relist)
    task_status.started()
    news_send, news = trio.open_memory_channel[_StreamNews](0)
    async with send, news, trio.open_nursery() as nursery:
        if container_events:
            nursery.start_soon(watch_container_events, client, news_send)
        else:
            news_send.close()
        while True:
            with trio.move_on_at(pleg.relist_due()):
                try:
                    await pleg.on_news(await news.receive())
                except trio.EndOfChannel:
                    await trio.sleep_forever()
                continue
            await pleg.relist()
