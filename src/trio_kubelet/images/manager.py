"""Making a container's image present: pull policy, node-wide pull limit, credentials, backoff.

One `ImageManager` is shared by every pod worker, as in the Go kubelet. It asks the
runtime whether the image is present, pulls it when the policy says so — at most
``serializeImagePulls``/``maxParallelImagePulls`` pulls at a time node-wide, with the
credentials of the pod's imagePullSecrets that match the image's registry — and keeps a
backoff per pod and image (10 s doubling to 300 s) so a failing pull is retried ever
more slowly (``ImagePullBackOff``) instead of hammering the registry.

A pull gets a deadline (the runtime request timeout, from the agent): the CRI has no
progress reports, and a registry that accepts a connection and never answers would
otherwise hold a pull slot — with serialized pulls, every pull on the node — forever.
A pull that runs out of time fails like any other and is retried with backoff;
content the runtime already fetched is kept, so the retry resumes rather than restarts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass

import trio

from trio_kubelet.core.backoff import Backoff
from trio_kubelet.core.image_ref import (
    InvalidImageReference,
    invalid_image_message,
    parse_image_reference,
    with_default_tag,
)
from trio_kubelet.core.objects import ObjectLookup
from trio_kubelet.core.references import image_pull_secret_names
from trio_kubelet.core.token_bucket import TokenBucket
from trio_kubelet.images.keyring import DockerConfigError, RegistryAuth, pod_keyring
from trio_kubelet.kube_events import EventRecorder, EventType, ObjectRef
from trio_kubelet.metrics import AgentMetrics, image_size_bucket
from trio_kubelet.model.duration import format_duration
from trio_kubelet.model.pod import Container, Pod
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import CRIError

log = logging.getLogger("trio_kubelet.images")

# kubelet.go: the image pull backoff (flowcontrol.NewBackOff(backOffPeriod, MaxContainerBackOff)).
IMAGE_BACKOFF_INITIAL = 10.0
IMAGE_BACKOFF_MAX = 300.0
# While a pull runs, say so in the log this often (the CRI reports no progress of its own).
PULL_PROGRESS_LOG_INTERVAL = 30.0
# The prefix a runtime puts on a pull error when the registry cannot be reached (CRI errors).
REGISTRY_UNAVAILABLE = "RegistryUnavailable"
# The pull error when registryPullQPS is exhausted (Go's throttledImageService).
PULL_QPS_EXCEEDED = "pull QPS exceeded"


class ImageError(Exception):
    """The image could not be made present; ``reason`` is what kubectl shows as waiting reason.

    ``retry_in`` is how long until another attempt can do better (the rest of the
    pull backoff), when that is known.
    """

    def __init__(self, reason: str, message: str, *, retry_in: float | None = None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.retry_in = retry_in


def pull_slots(serialize: bool, max_parallel: int | None) -> int | None:
    """How many pulls may run at once on the node; None for no limit.

    serializeImagePulls (the default) means one; otherwise maxParallelImagePulls,
    unset meaning unlimited, as in the Go kubelet.
    """
    if serialize:
        return 1
    return max_parallel


@dataclass(frozen=True, slots=True)
class _Pulled:
    image_ref: str
    pulled_in: float  # the pull itself, without the wait for a slot


class _PullFailed(Exception):
    def __init__(self, errors: Sequence[CRIError], message: str = "") -> None:
        super().__init__(message or "; ".join(str(e) for e in errors))
        self.errors = list(errors)


class ImageManager:
    """Shared by every pod worker: pull limit, credentials and a backoff per pod and image."""

    def __init__(
        self,
        client: CRIClient,
        events: EventRecorder | None = None,
        *,
        serialize_pulls: bool = True,
        max_parallel_pulls: int | None = None,
        pull_timeout: float | None = None,
        registry_qps: float = 0.0,
        registry_burst: int = 1,
        metrics: AgentMetrics | None = None,
        on_image_used: Callable[[str], None] | None = None,
    ) -> None:
        self._client = client
        # registryPullQPS / registryBurst: a pull beyond the rate fails ("pull QPS exceeded")
        # and backs off, as the Go kubelet's throttled image service does; 0 is no limit.
        self._pull_rate = TokenBucket(registry_qps, registry_burst)
        self.events = events if events is not None else EventRecorder()
        self._backoff = Backoff(IMAGE_BACKOFF_INITIAL, IMAGE_BACKOFF_MAX)
        slots = pull_slots(serialize_pulls, max_parallel_pulls)
        self._slots = trio.Semaphore(slots) if slots is not None else None
        self._pull_timeout = pull_timeout
        self._metrics = metrics
        #: Told the image ID of every image a container is about to use (image GC's lastUsed).
        self._on_image_used = on_image_used
        #: Pulls running now, and how many are waiting for a slot (for tests and logs).
        self.pulls_running = 0
        self.pulls_waiting = 0

    def backoff_delay(self, pod_uid: str, image: str) -> float:
        """The current pull backoff of a pod's image (0.0 when it has none)."""
        return self._backoff.delay(f"{pod_uid}_{image}")

    async def ensure(
        self,
        container: Container,
        pod_uid: str,
        now: float,
        ref: ObjectRef | None = None,
        *,
        pod: Pod | None = None,
        objects: ObjectLookup | None = None,
    ) -> str:
        """The runtime's reference (image ID) for the container's image; pulls if needed.

        ``ref`` is the container the Kubernetes Events are about (none without it);
        ``pod`` and ``objects`` give the pod's imagePullSecrets and a way to read them.
        """
        image = container.image
        try:
            requested = with_default_tag(image)
        except InvalidImageReference as err:
            message = invalid_image_message(image, err)
            log.warning("%s", message)
            self._event(ref, "Warning", "InspectFailed", message, logged=True)
            raise ImageError("InvalidImageName", message) from None
        try:
            present = await self._client.image_status(requested)
        except CRIError as err:
            message = f'Failed to inspect image "{image}": {err}'
            self._event(ref, "Warning", "InspectFailed", message)
            raise ImageError("ImageInspectError", message) from err
        policy = container.image_pull_policy
        if present is not None and policy != "Always":
            message = f'Container image "{image}" already present on machine'
            self._event(ref, "Normal", "Pulled", message)
            return self._used(present.id)
        if policy == "Never":
            message = f'Container image "{image}" is not present with pull policy of Never'
            self._event(ref, "Warning", "ErrImageNeverPull", message)
            raise ImageError("ErrImageNeverPull", message)
        key = f"{pod_uid}_{image}"
        entry = self._backoff.entries.get(key)
        if entry is not None:
            remaining = self._backoff.in_backoff(key, entry.last_update, now)
            if remaining > 0:
                message = f'Back-off pulling image "{image}"'
                self._event(ref, "Normal", "BackOff", message)
                raise ImageError("ImagePullBackOff", message, retry_in=remaining)
        auths = self._credentials(requested, pod, objects, ref)
        self._event(ref, "Normal", "Pulling", f'Pulling image "{image}"', logged=True)
        started = trio.current_time()
        try:
            pulled = await self._pull_in_slot(requested, auths)
        except _PullFailed as failed:
            return self._pull_failed(image, present, failed, key, now, ref)
        with_wait = trio.current_time() - started
        self._backoff = self._backoff.gc(now)
        size = await self._image_size(requested)
        took = _go_duration(pulled.pulled_in)
        message = (
            f'Successfully pulled image "{image}" in {took} ({_go_duration(with_wait)} '
            f"including waiting). Image size: {size} bytes."
        )
        log.info("%s", message)
        self._event(ref, "Normal", "Pulled", message, logged=True)
        if self._metrics is not None:
            self._metrics.image_pull_duration.labels(image_size_bucket(size)).observe(with_wait)
        return self._used(pulled.image_ref)

    def _pull_failed(
        self,
        image: str,
        present: v1.Image | None,
        failed: _PullFailed,
        key: str,
        now: float,
        ref: ObjectRef | None,
    ) -> str:
        message = f'Failed to pull image "{image}": {failed}'
        if present is not None:  # Always with the image present: a failed refresh is not fatal
            log.warning("Pulling image %s failed, using the present one: %s", image, failed)
            self._event(ref, "Warning", "Failed", message, logged=True)
            return self._used(present.id)
        self._backoff = self._backoff.next(key, now)
        delay = self._backoff.delay(key)
        log.warning("%s; next attempt in %s at the earliest", message, format_duration(delay))
        self._event(ref, "Warning", "Failed", message, logged=True)
        unavailable = [e for e in failed.errors if e.message.startswith(REGISTRY_UNAVAILABLE)]
        if unavailable and len(unavailable) == len(failed.errors):
            detail = unavailable[-1].message.removeprefix(REGISTRY_UNAVAILABLE)
            reason_message = (
                f"image pull failed for {image} because the registry is unavailable{detail}"
            )
            raise ImageError(REGISTRY_UNAVAILABLE, reason_message, retry_in=delay)
        raise ImageError("ErrImagePull", message, retry_in=delay)

    def _credentials(
        self, image: str, pod: Pod | None, objects: ObjectLookup | None, ref: ObjectRef | None
    ) -> list[RegistryAuth]:
        """The credentials to try for ``image``, from the pod's pull secrets (none: anonymous)."""
        if pod is None or objects is None or not image_pull_secret_names(pod):
            return []
        try:
            keyring = pod_keyring(pod, objects)
        except DockerConfigError as err:
            message = f'Failed to pull image "{image}": {err}'
            self._event(ref, "Warning", "Failed", message)
            raise ImageError("ErrImagePull", message) from None
        if keyring.unreadable:
            names = ", ".join(keyring.unreadable)
            message = (
                f"Could not read the image pull secrets {names}; the image pull may fail "
                "without their credentials"
            )
            log.info("Pod %s: %s", pod.full_name, message)
            self._event(ref, "Warning", "FailedToRetrieveImagePullSecret", message, logged=True)
        return keyring.keyring.lookup(parse_image_reference(image).repository)

    async def _pull_in_slot(self, image: str, auths: Sequence[RegistryAuth]) -> _Pulled:
        """Wait for a pull slot, then pull (logging progress while it runs)."""
        slot: AbstractAsyncContextManager[object] = (
            self._slots if self._slots is not None else nullcontext()
        )
        self.pulls_waiting += 1
        waiting = True
        try:
            async with slot:
                self.pulls_waiting -= 1
                waiting = False
                self.pulls_running += 1
                try:
                    return await self._pull_logging_progress(image, auths)
                finally:
                    self.pulls_running -= 1
        finally:
            if waiting:  # cancelled while waiting for a slot
                self.pulls_waiting -= 1

    async def _pull_logging_progress(
        self, image: str, auths: Sequence[RegistryAuth]
    ) -> _Pulled:
        started = trio.current_time()
        log.info("Pulling image %s%s", image, " with registry credentials" if auths else "")
        outcome: str | _PullFailed
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._log_progress, image, started)
            try:
                outcome = await self._pull(image, auths)
            except _PullFailed as failed:
                outcome = failed
            nursery.cancel_scope.cancel()
        if isinstance(outcome, _PullFailed):
            raise outcome
        return _Pulled(outcome, trio.current_time() - started)

    async def _pull(self, image: str, auths: Sequence[RegistryAuth]) -> str:
        """Pull with each matching credential in turn until one works (anonymously without)."""
        attempts: list[v1.AuthConfig | None] = [
            v1.AuthConfig(username=a.username, password=a.password) for a in auths
        ] or [None]
        errors: list[CRIError] = []
        for auth in attempts:
            if not self._pull_rate.try_accept(trio.current_time()):
                raise _PullFailed(errors, PULL_QPS_EXCEEDED)
            try:
                return await self._client.pull_image(
                    image, auth=auth, call_timeout=self._pull_timeout
                )
            except CRIError as err:
                errors.append(err)
        raise _PullFailed(errors)

    @staticmethod
    async def _log_progress(image: str, started: float) -> None:
        while True:
            await trio.sleep(PULL_PROGRESS_LOG_INTERVAL)
            elapsed = _go_duration(trio.current_time() - started)
            log.info("Still pulling image %s after %s", image, elapsed)

    async def _image_size(self, image: str) -> int:
        """Best effort, as the Go kubelet's: 0 when the runtime cannot say."""
        try:
            status = await self._client.image_status(image)
        except CRIError:
            return 0
        return status.size if status is not None else 0

    def _used(self, image_id: str) -> str:
        if self._on_image_used is not None and image_id:
            self._on_image_used(image_id)
        return image_id

    def _event(
        self,
        ref: ObjectRef | None,
        type: EventType,
        reason: str,
        message: str,
        *,
        logged: bool = False,
    ) -> None:
        if ref is not None:
            self.events.event(ref, type, reason, message, logged=logged)


def _go_duration(seconds: float) -> str:
    """A duration truncated to milliseconds, printed as Go prints one ("1.234s", "450ms")."""
    return format_duration(math.floor(seconds * 1000) / 1000)
