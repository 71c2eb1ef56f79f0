"""The kubelet's event recorder: reporting never waits, one sender task writes to the API server.

Like client-go's broadcaster, reports go through a bounded queue (1000) that drops
when full, so a slow or absent API server never holds up a pod worker; the sender
correlates each event (``correlator.py``) and writes it with client-go's persistence.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable

import trio

from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.errors import (
    AlreadyExists,
    APIError,
    NotFound,
    ServerError,
    TooManyRequests,
    Unreachable,
)
from trio_kubelet.kube_events.correlator import (
    Event,
    EventCorrelator,
    EventType,
    ObjectRef,
    Write,
    new_event,
    node_ref,
    pod_ref,
)
from trio_kubelet.model.pod import Pod

log = logging.getLogger("trio_kubelet.kube_events")

QUEUE_SIZE = 1000  # client-go's maxQueuedEvents
MAX_TRIES = 12  # client-go's maxTriesPerEvent...
RETRY_SLEEP = 10.0  # ...and its sleep between tries (the first one randomised)
DROP_LOG_INTERVAL = 60.0  # seconds between two reports of dropped events
_TRANSIENT = (Unreachable, ServerError, TooManyRequests)


class EventRecorder:
    """Shared by everything that reports events; ``run`` is the sender task.

    Without an API client (a standalone node) events are only logged, at debug level.
    """

    def __init__(
        self,
        node_name: str = "",
        client: APIClient | None = None,
        *,
        clock: Callable[[], float] = time.time,
        queue_size: int = QUEUE_SIZE,
        retry_sleep: float = RETRY_SLEEP,
    ) -> None:
        self.node_name = node_name
        self.dropped = 0  # events lost to a full queue
        self._client = client
        self._clock = clock
        self._retry_sleep = retry_sleep
        self._queue_size = queue_size
        self._send, self._receive = trio.open_memory_channel[Event](queue_size)
        self._last_nanos = 0
        self._drop_logged_at = -math.inf

    # -- reporting (never awaits) -------------------------------------------------------------

    def event(
        self,
        ref: ObjectRef,
        type: EventType,
        reason: str,
        message: str,
        *,
        logged: bool = False,
    ) -> None:
        """Report an event; ``logged`` says the caller already wrote it to the log."""
        sending = self._client is not None
        if logged or not sending:
            level = logging.DEBUG
        else:
            level = logging.INFO if type == "Normal" else logging.WARNING
        log.log(level, "Event %s %s %s: %s", type, _describe(ref), reason, message)
        if not sending:
            return
        now = self._clock()
        # Unique names even when the clock stands still (a MockClock, a coarse clock).
        nanos = self._last_nanos = max(int(now * 1e9), self._last_nanos + 1)
        event = new_event(ref, type, reason, message, host=self.node_name, nanos=nanos)
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            self._dropped(event, now)

    def pod_event(
        self,
        pod: Pod,
        type: EventType,
        reason: str,
        message: str,
        container: str | None = None,
        *,
        logged: bool = False,
    ) -> None:
        """An event about a pod, or about one of its containers when ``container`` is named."""
        self.event(pod_ref(pod, container), type, reason, message, logged=logged)

    def node_event(self, node_name: str, type: EventType, reason: str, message: str) -> None:
        self.event(node_ref(node_name), type, reason, message)

    def _dropped(self, event: Event, now: float) -> None:
        self.dropped += 1
        if now - self._drop_logged_at >= DROP_LOG_INTERVAL:
            self._drop_logged_at = now
            log.warning(
                "Dropped %d events so far: %d are waiting to be sent (this one: %s %s)",
                self.dropped,
                self._queue_size,
                event.reason,
                _describe(event.involved),
            )

    # -- sending ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Send the queued events, one at a time and in order, until cancelled."""
        client = self._client
        if client is None:
            return
        correlator = EventCorrelator()
        async for event in self._receive:
            write = correlator.correlate(event)
            if write is not None:
                await self._write(client, write)

    async def _write(self, client: APIClient, write: Write) -> None:
        """Retry transient failures (12 tries, ~10 s apart); a rejection is final."""
        event = write.event
        for attempt in range(1, MAX_TRIES + 1):
            try:
                await _send(client, write)
                return
            except _TRANSIENT as err:
                if attempt == MAX_TRIES:
                    log.warning(
                        "Unable to write event %s after %d tries, giving up: %s",
                        event.name,
                        MAX_TRIES,
                        err,
                    )
                    return
                delay = err.retry_after
                if delay is None:  # the first sleep randomised, so nodes do not retry in step
                    delay = self._retry_sleep * (random.random() if attempt == 1 else 1.0)
                log.debug("Unable to write event %s, retrying in %.1fs: %s", event.name, delay, err)
                await trio.sleep(delay)
            except APIError as err:
                level = logging.DEBUG if isinstance(err, AlreadyExists) else logging.WARNING
                log.log(level, "The API server rejected event %s: %s", event.name, err)
                return


async def _send(client: APIClient, write: Write) -> None:
    """PATCH the Event for a repeat, POST it when new or when the old one is gone (1 h TTL)."""
    event = write.event
    path = f"/api/v1/namespaces/{event.namespace}/events"
    if write.update:
        try:
            await client.patch(f"{path}/{event.name}", event.update_patch())
            return
        except NotFound:
            pass
    await client.create(path, event.to_api())


def _describe(ref: ObjectRef) -> str:
    name = f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name
    return f"{ref.kind} {name} {ref.field_path}" if ref.field_path else f"{ref.kind} {name}"
