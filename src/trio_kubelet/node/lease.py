"""The node's heartbeat: the Lease ``kube-node-lease/<node>``, renewed every leaseDuration/4.

The node lifecycle controller reads the Lease's renewTime to decide whether the node is
alive; a Lease is small, so renewing it every 10 s is cheap where a full node status would
not be. Behaviour follows the Go lease controller (component-helpers lease/controller.go):
renew with an update based on the last Lease written (no GET while all goes well); on a
failure fall back to GET-or-create, retried with backoff (200 ms doubling to 7 s) for as
long as the API server is away; a conflict re-reads the Lease first. Between rounds it
waits the renew interval plus up to 4 % more, at random (Go's JitterUntil, sliding), so
nodes started together drift apart instead of renewing in the same instant forever.
"""

from __future__ import annotations

import copy
import datetime
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import trio

from trio_kubelet.apiserver.client import JSON, APIClient
from trio_kubelet.apiserver.errors import APIError, Conflict, NotFound

log = logging.getLogger("trio_kubelet.node.lease")

LEASE_NAMESPACE = "kube-node-lease"
RENEW_INTERVAL_FRACTION = 0.25
RENEW_JITTER = 0.04  # fraction of the interval added at random to each wait
MAX_UPDATE_RETRIES = 5
FIRST_BACKOFF = 0.1  # doubled before the first wait: 200 ms
MAX_BACKOFF = 7.0


def format_micro_time(epoch: float) -> str:
    """A metav1.MicroTime: RFC 3339 in UTC with microseconds."""
    moment = datetime.datetime.fromtimestamp(epoch, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_object(
    node_name: str,
    *,
    duration_seconds: int,
    renew_time: float,
    node_uid: str | None,
    base: Mapping[str, Any] | None = None,
) -> JSON:
    """The Lease to create (``base`` None) or to write back over ``base`` with a new renewTime.

    The Lease is owned by the Node, so deleting the Node garbage-collects it; the owner
    reference is added as soon as the Node's UID is known.
    """
    if base is None:
        lease: JSON = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node_name, "namespace": LEASE_NAMESPACE},
            "spec": {"holderIdentity": node_name, "leaseDurationSeconds": duration_seconds},
        }
    else:
        lease = copy.deepcopy(dict(base))
    lease.setdefault("spec", {})["renewTime"] = format_micro_time(renew_time)
    metadata = lease.setdefault("metadata", {})
    if node_uid and not metadata.get("ownerReferences"):
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
        ]
    return lease


class LeaseController:
    """Creates the node's Lease once the Node exists and keeps renewing it."""

    def __init__(
        self,
        client: APIClient,
        node_name: str,
        *,
        duration_seconds: int,
        wall_clock: Callable[[], float],
        node_uid: Callable[[], str | None],
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.duration_seconds = duration_seconds
        self.renew_interval = duration_seconds * RENEW_INTERVAL_FRACTION
        self.wall_clock = wall_clock
        self.node_uid = node_uid
        self.jitter = jitter  # a number in [0, 1)
        self.latest: JSON | None = None  # the Lease as last written or read
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node_name}"

    async def run(self) -> NoReturn:
        while True:
            await self.sync()
            await trio.sleep(self.renew_interval * (1 + RENEW_JITTER * self.jitter()))

    async def sync(self) -> None:
        """One renewal round; returns once the Lease is renewed or this round gave up."""
        if self.latest is not None:
            try:
                await self._retry_update(self.latest)
                return
            except APIError as err:
                log.info("Failed to update lease using latest lease, fallback to ensure: %s", err)
        lease, created = await self._backoff_ensure()
        self.latest = lease
        if lease is not None and not created:
            try:
                await self._retry_update(lease)
            except APIError as err:
                log.error("%s; will retry in %ss", err, self.renew_interval)

    async def _backoff_ensure(self) -> tuple[JSON | None, bool]:
        """GET the Lease or create it, until the API server answers; (lease, created)."""
        delay = FIRST_BACKOFF
        while True:
            try:
                return await self._ensure()
            except APIError as err:
                delay = min(2 * delay, MAX_BACKOFF)
                wait = max(delay, err.retry_after or 0.0)
                log.error("Failed to ensure lease exists, will retry in %.1fs: %s", wait, err)
                await trio.sleep(wait)

    async def _ensure(self) -> tuple[JSON | None, bool]:
        try:
            return await self.client.get(self.path), False
        except NotFound:
            pass
        uid = self.node_uid()
        if uid is None:
            # As in Go, the Lease is created only with its owner: the Node must exist first.
            log.info("Node %s is not registered yet; creating its lease later", self.node_name)
            return None, False
        lease = lease_object(
            self.node_name,
            duration_seconds=self.duration_seconds,
            renew_time=self.wall_clock(),
            node_uid=uid,
        )
        created = await self.client.create(self.path.rsplit("/", 1)[0], lease)
        log.info("Created lease %s/%s", LEASE_NAMESPACE, self.node_name)
        return created, True

    async def _retry_update(self, base: JSON) -> None:
        """PUT a renewed copy of ``base``, up to 5 times; a conflict re-reads the Lease."""
        for _ in range(MAX_UPDATE_RETRIES):
            lease = lease_object(
                self.node_name,
                duration_seconds=self.duration_seconds,
                renew_time=self.wall_clock(),
                node_uid=self.node_uid(),
                base=base,
            )
            try:
                self.latest = await self.client.replace(self.path, lease)
                return
            except Conflict as err:
                log.error("Failed to update lease: %s", err)
                fresh, _ = await self._backoff_ensure()
                if fresh is None:
                    break
                base = fresh
            except APIError as err:
                log.error("Failed to update lease: %s", err)
        raise APIError(
            0, "LeaseNotRenewed", f"failed {MAX_UPDATE_RETRIES} attempts to update lease"
        )
