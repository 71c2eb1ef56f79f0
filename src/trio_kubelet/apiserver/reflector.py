"""List, then watch from the list's resourceVersion, forever (client-go's Reflector).

The handler sees one complete list first (and again after every relist), then each
watch event. Expired resourceVersions (410 Gone) lead to a relist; lost connections
and server errors to a reconnect with backoff, so a restarted API server is picked up
without a hot loop and without losing events.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any, Protocol

import trio

from trio_kubelet.apiserver.client import JSON, APIClient, WatchEvent
from trio_kubelet.apiserver.errors import APIError, Forbidden, Gone, Unauthorized

log = logging.getLogger("trio_kubelet.apiserver")

BACKOFF_INITIAL = 0.8
BACKOFF_MAX = 30.0
# The server ends each watch after this long (randomised as client-go does, 5 to 10 min)
# so that load spreads over API servers.
WATCH_TIMEOUT = 300


class Handler(Protocol):
    async def replace(self, items: list[JSON]) -> None:
        """The complete collection, after a list."""

    async def apply(self, event: WatchEvent) -> None:
        """One change (ADDED, MODIFIED, DELETED); bookmarks are not passed on."""


class Reflector:
    def __init__(
        self,
        client: APIClient,
        path: str,
        handler: Handler,
        *,
        params: Mapping[str, str] | None = None,
        what: str = "",
    ) -> None:
        self.client = client
        self.path = path
        self.handler = handler
        self.params = dict(params or {})
        self.what = what or path
        self.resource_version = ""
        self.listed = trio.Event()  # set after the first successful list

    async def run(self) -> None:
        delay = BACKOFF_INITIAL
        while True:
            try:
                if not self.resource_version:
                    await self.list_all()
                    delay = BACKOFF_INITIAL
                await self._watch()
                delay = BACKOFF_INITIAL
            except Gone:
                log.info(
                    "Watch of %s expired (resourceVersion %s): listing again",
                    self.what,
                    self.resource_version,
                )
                self.resource_version = ""
            except APIError as err:
                wait = err.retry_after if err.retry_after is not None else delay
                if isinstance(err, (Forbidden, Unauthorized)):
                    wait = BACKOFF_MAX  # asking again soon will not change the answer
                log.warning("Cannot list/watch %s: %s; retrying in %.1fs", self.what, err, wait)
                await trio.sleep(wait * random.uniform(1.0, 1.2))
                delay = min(delay * 2, BACKOFF_MAX)

    async def list_all(self) -> None:
        """List the collection and hand it to the handler (subclasses may wrap this)."""
        answer = await self.client.get(self.path, self.params)
        items = answer.get("items") or []
        self.resource_version = str(_metadata(answer).get("resourceVersion", ""))
        await self.handler.replace([i for i in items if isinstance(i, dict)])
        if not self.listed.is_set():
            log.info("Listed %s: %d items", self.what, len(items))
        self.listed.set()

    async def _watch(self) -> None:
        params = {
            **self.params,
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(int(WATCH_TIMEOUT * random.uniform(1.0, 2.0))),
        }
        async with self.client.watch(self.path, params) as events:
            async for event in events:
                version = _metadata(event.object).get("resourceVersion")
                if version:
                    self.resource_version = str(version)
                if event.type != "BOOKMARK":
                    await self.handler.apply(event)


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}
