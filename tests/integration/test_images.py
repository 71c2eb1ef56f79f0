"""Images against containerd and a real local registry: pull policies, pull backoff, pull
secrets, a registry that never answers, and image GC removing exactly the unused images."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from cri_api.v1 import api_pb2

from tests.containerd_fixture import Containerd
from tests.integration.harness import container, running, running_agent
from tests.registry_fixture import Registry, running_registry
from trio_kubelet.core.objects import ObjectLookup
from trio_kubelet.images import gc as image_gc
from trio_kubelet.images.manager import ImageError, ImageManager
from trio_kubelet.model.pod import Container, Pod
from trio_kubelet.runtime.client import CRIClient, open_cri_client

pytestmark = pytest.mark.integration

CRI_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def registry(containerd: Containerd) -> Iterator[Registry]:
    with running_registry(containerd) as running_one:
        yield running_one


@pytest.fixture(autouse=True)
def forget_registry_images(containerd: Containerd, registry: Registry) -> Iterator[None]:
    """Images pulled from the test registries do not outlive the test (busybox and pause are
    restored by the containerd fixture's reset)."""
    yield
    for image in containerd.image_service.ListImages(api_pb2.ListImagesRequest(),
                                                     timeout=CRI_TIMEOUT).images:
        if any(tag.startswith("127.0.0.1:") for tag in image.repo_tags):
            containerd.image_service.RemoveImage(
                api_pb2.RemoveImageRequest(image=api_pb2.ImageSpec(image=image.id)),
                timeout=CRI_TIMEOUT)


def pull(containerd: Containerd, ref: str) -> str:
    """Pull through CRI, as set-up; returns the image ID."""
    reply = containerd.image_service.PullImage(
        api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image=ref)), timeout=CRI_TIMEOUT)
    return str(reply.image_ref)


def image_id(containerd: Containerd, ref: str) -> str | None:
    status = containerd.image_service.ImageStatus(
        api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(image=ref)), timeout=CRI_TIMEOUT)
    return status.image.id if status.HasField("image") and status.image.id else None


def present_ids(containerd: Containerd) -> set[str]:
    return {image.id for image in containerd.image_service.ListImages(
        api_pb2.ListImagesRequest(), timeout=CRI_TIMEOUT).images}


def waiting_reason(pod: Pod, name: str) -> str | None:
    waiting = container(pod, name).state.waiting
    return waiting.reason if waiting is not None else None


def manifest(name: str, image: str, policy: str, *, command: str = "sleep 3600",
             restart: str = "Always") -> str:
    return f"""\
        apiVersion: v1
        kind: Pod
        metadata: {{name: {name}}}
        spec:
          restartPolicy: {restart}
          terminationGracePeriodSeconds: 1
          containers:
          - name: app
            image: "{image}"
            imagePullPolicy: {policy}
            command: ["sh", "-c", "{command}"]
        """


# -- pull policies ------------------------------------------------------------------------------

async def test_pull_policies_against_a_registry(containerd: Containerd, registry: Registry,
                                                tmp_path: Path) -> None:
    ref = registry.push("tk/policy", "v1")
    pull(containerd, ref)  # present before the agent sees any pod
    before = registry.manifest_requests("tk/policy", "v1")
    absent = registry.ref("tk/absent", "v1")
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("present.yaml", manifest("present", ref, "IfNotPresent"))
        await agent.wait_for("present", lambda p: running(p, "app"))
        assert registry.manifest_requests("tk/policy", "v1") == before, "IfNotPresent pulled"

        agent.write("always.yaml", manifest("always", ref, "Always"))
        await agent.wait_for("always", lambda p: running(p, "app"))
        assert registry.manifest_requests("tk/policy", "v1") == before + 1, "Always did not pull"

        agent.write("never.yaml", manifest("never", absent, "Never"))
        pod = await agent.wait_for("never",
                                   lambda p: waiting_reason(p, "app") == "ErrImageNeverPull")
        assert container(pod, "app").state.waiting.message == (
            f'Container image "{absent}" is not present with pull policy of Never')
        await trio.sleep(2)
        assert registry.manifest_requests("tk/absent", "v1") == 0


async def test_missing_image_backs_off_with_growing_delays(containerd: Containerd,
                                                           registry: Registry,
                                                           tmp_path: Path) -> None:
    missing = registry.ref("tk/missing", "v1")
    reasons: set[str] = set()
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("missing.yaml", manifest("missing", missing, "IfNotPresent"))

        def attempts() -> list[float]:
            """Pull attempts: the registry's manifest requests, grouped when 2 s apart or less."""
            grouped: list[float] = []
            for moment in registry.manifest_request_times("tk/missing", "v1"):
                if not grouped or moment - grouped[-1] > 2:
                    grouped.append(moment)
            return grouped

        with trio.fail_after(90):
            while len(attempts()) < 3:
                pod = agent.pod("missing")
                if pod is not None and pod.status.container_statuses:
                    reasons.add(waiting_reason(pod, "app") or "")
                await trio.sleep(0.5)
    first, second, third = attempts()[:3]
    # 10 s, then 20 s (the worker retries every 10 s, so a delay ends within 10 s after).
    assert 9 <= second - first <= 21
    assert third - second >= 19 and third - second > second - first
    assert {"ErrImagePull", "ImagePullBackOff"} <= reasons


# -- the image manager against containerd: credentials and timeouts -----------------------------

def docker_config(host: str, user: str, password: str) -> dict[str, Any]:
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    config = json.dumps({"auths": {host: {"auth": auth}}}).encode()
    return {
        "metadata": {"name": "regcred", "namespace": "default"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config).decode()},
    }


def secret_lookup(secret: dict[str, Any]) -> ObjectLookup:
    def lookup(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return secret if (kind, namespace, name) == ("Secret", "default", "regcred") else None

    return lookup


def pod_using(image: str) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "private", "namespace": "default", "uid": "uid-private"},
        "spec": {"containers": [{"name": "app", "image": image}],
                 "imagePullSecrets": [{"name": "regcred"}]},
    })


@pytest.fixture
async def cri(containerd: Containerd) -> AsyncIterator[CRIClient]:
    async with open_cri_client(containerd.endpoint, timeout=CRI_TIMEOUT) as client:
        yield client


async def test_pull_secrets_authenticate_to_the_matching_registry(
    containerd: Containerd, cri: CRIClient
) -> None:
    with running_registry(containerd, user=("alice", "s3cret")) as private:
        ref = private.push("tk/private", "v1")
        app = Container(name="app", image=ref, image_pull_policy="IfNotPresent")
        images = ImageManager(cri, pull_timeout=CRI_TIMEOUT)
        pod = pod_using(ref)

        with pytest.raises(ImageError) as anonymous:
            await images.ensure(app, "uid-a", 0.0)
        assert anonymous.value.reason == "ErrImagePull"
        assert "401" in anonymous.value.message or "unauthorized" in anonymous.value.message

        wrong = secret_lookup(docker_config("other.example:5000", "alice", "s3cret"))
        with pytest.raises(ImageError):
            await images.ensure(app, "uid-b", 0.0, pod=pod, objects=wrong)

        right = secret_lookup(docker_config(private.host, "alice", "s3cret"))
        pulled = await images.ensure(app, "uid-c", 0.0, pod=pod, objects=right)
        assert pulled == image_id(containerd, ref)


async def test_a_registry_that_never_answers_ends_in_backoff(cri: CRIClient) -> None:
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        app = Container(name="app", image=f"127.0.0.1:{port}/tk/hang:v1",
                        image_pull_policy="IfNotPresent")
        images = ImageManager(cri, pull_timeout=3.0)
        started = trio.current_time()
        with pytest.raises(ImageError) as caught:
            await images.ensure(app, "uid-hang", 1000.0)
        assert caught.value.reason == "ErrImagePull"
        assert "DEADLINE_EXCEEDED" in caught.value.message
        assert trio.current_time() - started < 10
        with pytest.raises(ImageError) as again:
            await images.ensure(app, "uid-hang", 1001.0)
        assert again.value.reason == "ImagePullBackOff"
        nursery.cancel_scope.cancel()


# -- image GC -------------------------------------------------------------------------------------

def gc_config(tmp_path: Path) -> Path:
    """The harness's settings plus image GC that frees everything it may.

    A second ``--config`` replaces the harness's file. The minimum age is 1 s, not 0: as in
    the Go kubelet, a zero imageMinimumGCAge in a config file means the 2 min default.
    """
    config = tmp_path / "kubelet-gc.yaml"
    config.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\n"
        "kind: KubeletConfiguration\n"
        f"podLogsDir: {tmp_path / 'pod-logs'}\n"
        "fileCheckFrequency: 20s\n"
        "imageMinimumGCAge: 1s\n"
    )
    return config


async def test_image_gc_removes_exactly_the_unused_images(
    containerd: Containerd, registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    used, exited, unused = (registry.push(f"tk/gc-{name}", "v1")
                            for name in ("used", "exited", "unused"))
    unused_id = pull(containerd, unused)
    pause_id = image_id(containerd, containerd.PAUSE)
    monkeypatch.setattr(image_gc, "IMAGE_GC_PERIOD", 1.0)
    flags = ("--config", str(gc_config(tmp_path)),
             "--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0")
    async with running_agent(containerd.endpoint, tmp_path, *flags) as agent:
        agent.write("used.yaml", manifest("used", used, "IfNotPresent"))
        agent.write("exited.yaml", manifest("exited", exited, "IfNotPresent", command="true",
                                            restart="Never"))
        await agent.wait_for("used", lambda p: running(p, "app"))
        await agent.wait_for("exited", lambda p: p.status.phase == "Succeeded")
        with trio.fail_after(15):
            while image_id(containerd, unused) is not None:
                await trio.sleep(0.2)
        # Pulled again while the agent runs: the next passes remove it again.
        assert pull(containerd, unused) == unused_id
        with trio.fail_after(15):
            while image_id(containerd, unused) is not None:
                await trio.sleep(0.2)
        await trio.sleep(2.5)  # a few more passes
        in_use = {image_id(containerd, used), image_id(containerd, exited)}
        assert None not in in_use, "an image in use (running or exited) was removed"
        # Everything else went, the local busybox included; the sandbox image stays.
        assert present_ids(containerd) == in_use | {pause_id}
        still = agent.pod("used")
        assert still is not None and running(still, "app")
