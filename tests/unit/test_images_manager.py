"""images.manager: pull policies, backoff, pull limits and credentials against the fake runtime."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_kubelet.core.objects import ObjectLookup
from trio_kubelet.core.references import image_pull_secret_names
from trio_kubelet.images.keyring import (
    DockerConfigError,
    Keyring,
    RegistryAuth,
    parse_docker_config,
    registry_key,
)
from trio_kubelet.images.manager import ImageError, ImageManager, pull_slots
from trio_kubelet.kube_events import EventRecorder, ObjectRef
from trio_kubelet.metrics import AgentMetrics, image_size_bucket
from trio_kubelet.model.pod import Container, Pod, PullPolicy
from trio_kubelet.runtime.client import open_cri_client
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import CRIUnknown, StatusCode
from trio_kubelet.runtime.fake import FakeRuntime, serve_fake_runtime

NOW = 1_700_000_000.0
POD_UID = "0c3a7d2e-1111-4000-8000-000000000001"
IMAGE = "registry.local/app:v2"


@dataclass
class Env:
    fake: FakeRuntime
    images: ImageManager


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    sock = tmp_path / "cri.sock"
    async with serve_fake_runtime(sock) as fake, \
            open_cri_client(f"unix://{sock}", timeout=5.0) as client:
        yield Env(fake, ImageManager(client))


def container(image: str = IMAGE, policy: PullPolicy | None = None) -> Container:
    return Container(name="app", image=image, image_pull_policy=policy)


async def test_if_not_present_and_present_does_not_pull(env: Env) -> None:
    image_id = env.fake.add_image(IMAGE)
    assert await env.images.ensure(container(policy="IfNotPresent"), POD_UID, NOW) == image_id
    assert env.fake.calls["PullImage"] == 0
    assert env.fake.calls["ImageStatus"] == 1


async def test_if_not_present_and_missing_pulls_once(env: Env) -> None:
    first = await env.images.ensure(container(policy="IfNotPresent"), POD_UID, NOW)
    assert first.startswith("sha256:")
    assert await env.images.ensure(container(policy="IfNotPresent"), POD_UID, NOW + 1) == first
    assert env.fake.calls["PullImage"] == 1


async def test_always_pulls_even_when_present(env: Env) -> None:
    image_id = env.fake.add_image(IMAGE)
    assert await env.images.ensure(container(policy="Always"), POD_UID, NOW) == image_id
    assert await env.images.ensure(container(policy="Always"), POD_UID, NOW + 1) == image_id
    assert env.fake.calls["PullImage"] == 2


async def test_latest_tag_defaults_to_always(env: Env) -> None:
    env.fake.add_image("busybox:latest")
    await env.images.ensure(container("busybox:latest"), POD_UID, NOW)
    await env.images.ensure(container("busybox"), POD_UID, NOW)
    assert env.fake.calls["PullImage"] == 2


async def test_always_with_a_present_image_survives_a_failed_pull(env: Env) -> None:
    # A deliberate choice of this agent (the Go kubelet would report ErrImagePull).
    image_id = env.fake.add_image(IMAGE)
    env.fake.set_pullable(IMAGE, False)
    assert await env.images.ensure(container(policy="Always"), POD_UID, NOW) == image_id
    assert env.fake.calls["PullImage"] == 1


async def test_never_and_present_uses_the_image(env: Env) -> None:
    image_id = env.fake.add_image(IMAGE)
    assert await env.images.ensure(container(policy="Never"), POD_UID, NOW) == image_id
    assert env.fake.calls["PullImage"] == 0


async def test_never_and_missing_is_err_image_never_pull(env: Env) -> None:
    with pytest.raises(ImageError) as caught:
        await env.images.ensure(container(policy="Never"), POD_UID, NOW)
    assert caught.value.reason == "ErrImageNeverPull"
    assert caught.value.message == (
        f'Container image "{IMAGE}" is not present with pull policy of Never')
    assert env.fake.calls["PullImage"] == 0


async def expect(env: Env, reason: str, now: float) -> ImageError:
    with pytest.raises(ImageError) as caught:
        await env.images.ensure(container(policy="IfNotPresent"), POD_UID, now)
    assert caught.value.reason == reason
    return caught.value


async def test_pull_failure_backs_off_then_retries(env: Env) -> None:
    env.fake.set_pullable(IMAGE, False)
    failed = await expect(env, "ErrImagePull", NOW)
    assert failed.message.startswith(f'Failed to pull image "{IMAGE}": ')
    assert "not found" in failed.message

    backing_off = await expect(env, "ImagePullBackOff", NOW + 9.9)
    assert backing_off.message == f'Back-off pulling image "{IMAGE}"'
    assert env.fake.calls["PullImage"] == 1, "no pull inside the backoff window"

    await expect(env, "ErrImagePull", NOW + 10)  # the 10 s window is over: a real retry
    assert env.fake.calls["PullImage"] == 2
    await expect(env, "ImagePullBackOff", NOW + 29.9)  # the window doubled to 20 s
    await expect(env, "ErrImagePull", NOW + 30)
    assert env.fake.calls["PullImage"] == 3


async def test_successful_pull_ends_the_backoff(env: Env) -> None:
    env.fake.set_pullable(IMAGE, False)
    await expect(env, "ErrImagePull", NOW)
    env.fake.set_pullable(IMAGE, True)
    await expect(env, "ImagePullBackOff", NOW + 5)  # the window holds even if it would work
    image_id = await env.images.ensure(container(policy="IfNotPresent"), POD_UID, NOW + 10)
    assert image_id.startswith("sha256:")
    assert await env.images.ensure(container(policy="Always"), POD_UID, NOW + 11) == image_id


async def test_backoff_is_per_pod_and_image(env: Env) -> None:
    env.fake.set_pullable(IMAGE, False)
    await expect(env, "ErrImagePull", NOW)
    other = await env.images.ensure(container("registry.local/other:v1"), POD_UID, NOW + 1)
    assert other.startswith("sha256:")
    assert env.fake.calls["PullImage"] == 2


# -- backoff growth, bad references, inspection ---------------------------------------------------

async def test_backoff_grows_10_20_40_to_300_and_stays(env: Env) -> None:
    env.fake.set_pullable(IMAGE, False)
    now, delays = NOW, []
    for _ in range(8):
        failed = await expect(env, "ErrImagePull", now)
        delays.append(env.images.backoff_delay(POD_UID, IMAGE))
        assert failed.retry_in == delays[-1]
        await expect(env, "ImagePullBackOff", now + delays[-1] - 0.1)
        now += delays[-1]
    assert delays == [10, 20, 40, 80, 160, 300, 300, 300]


async def test_backoff_is_forgotten_after_twice_the_maximum(env: Env) -> None:
    env.fake.set_pullable(IMAGE, False)
    await expect(env, "ErrImagePull", NOW)
    await expect(env, "ErrImagePull", NOW + 10)
    assert env.images.backoff_delay(POD_UID, IMAGE) == 20
    await expect(env, "ErrImagePull", NOW + 10 + 601)  # idle > 2 x 300 s: starts over
    assert env.images.backoff_delay(POD_UID, IMAGE) == 10


async def test_unparsable_reference_is_invalid_image_name(env: Env) -> None:
    with pytest.raises(ImageError) as caught:
        await env.images.ensure(container("Registry.local/App:v1"), POD_UID, NOW)
    assert caught.value.reason == "InvalidImageName"
    assert caught.value.message.startswith(
        'Failed to apply default image tag "Registry.local/App:v1": couldn\'t parse image '
        'reference "Registry.local/App:v1": ')
    assert env.fake.calls["ImageStatus"] == 0 and env.fake.calls["PullImage"] == 0


async def test_untagged_image_is_asked_for_with_the_latest_tag(env: Env) -> None:
    await env.images.ensure(container("registry.local/app", "IfNotPresent"), POD_UID, NOW)
    assert env.fake.pull_requests[0][0] == "registry.local/app:latest"


async def test_runtime_failing_image_status_is_image_inspect_error(env: Env) -> None:
    env.fake.set_unavailable(True)
    with pytest.raises(ImageError) as caught:
        await env.images.ensure(container(), POD_UID, NOW)
    assert caught.value.reason == "ImageInspectError"
    assert caught.value.message.startswith(f'Failed to inspect image "{IMAGE}": ')


async def test_registry_unavailable_is_its_own_reason(env: Env) -> None:
    def unavailable(request: v1.PullImageRequest) -> v1.PullImageResponse:
        raise CRIUnknown("PullImage", StatusCode.UNKNOWN, "RegistryUnavailable: connection refused")

    env.fake.pull_image = unavailable  # type: ignore[method-assign]
    failed = await expect(env, "RegistryUnavailable", NOW)
    assert failed.message == (
        f"image pull failed for {IMAGE} because the registry is unavailable: connection refused")
    await expect(env, "ImagePullBackOff", NOW + 5)


# -- events, metrics, GC's last-used hook ---------------------------------------------------------

class Events(EventRecorder):
    """Keeps every event for assertions."""

    def __init__(self) -> None:
        super().__init__("node-a")
        self.seen: list[tuple[str, str, str]] = []

    def event(self, ref: ObjectRef, type: str, reason: str, message: str, *,  # type: ignore[override]
              logged: bool = False) -> None:
        self.seen.append((type, reason, message))


REF = ObjectRef(kind="Pod", name="web", namespace="default", uid=POD_UID)


async def test_pulled_event_names_duration_waiting_and_size(tmp_path: Path) -> None:
    sock = tmp_path / "cri.sock"
    events, metrics = Events(), AgentMetrics("node-a")
    async with serve_fake_runtime(sock) as fake, \
            open_cri_client(f"unix://{sock}", timeout=5.0) as client:
        used: list[str] = []
        images = ImageManager(client, events, metrics=metrics, on_image_used=used.append)
        image_id = await images.ensure(container(), POD_UID, NOW, REF)
    assert [(t, r) for t, r, _ in events.seen] == [("Normal", "Pulling"), ("Normal", "Pulled")]
    assert events.seen[0][2] == f'Pulling image "{IMAGE}"'
    assert re.fullmatch(
        rf'Successfully pulled image "{re.escape(IMAGE)}" in [0-9.]+m?s '
        r"\([0-9.]+m?s including waiting\)\. Image size: 1000000 bytes\.", events.seen[1][2])
    assert metrics.registry.get_sample_value(
        "kubelet_image_pull_duration_seconds_count", {"image_size_in_bytes": "0-10MB"}) == 1
    assert used == [image_id]
    assert fake.calls["PullImage"] == 1


def test_image_size_buckets_follow_go() -> None:
    assert image_size_bucket(0) == "N/A"
    assert image_size_bucket(1) == "0-10MB"
    assert image_size_bucket(10 * 2**20) == "0-10MB"
    assert image_size_bucket(10 * 2**20 + 1) == "10MB-100MB"
    assert image_size_bucket(200 * 2**30) == "GT100GB"


# -- the node-wide pull limit ---------------------------------------------------------------------

@asynccontextmanager
async def limited(tmp_path: Path, **limits: Any) -> AsyncIterator[tuple[FakeRuntime, ImageManager]]:
    sock = tmp_path / "cri.sock"
    async with serve_fake_runtime(sock) as fake, \
            open_cri_client(f"unix://{sock}", timeout=5.0) as client:
        fake.set_delay("PullImage", 0.3)
        yield fake, ImageManager(client, **limits)


async def pull_many(images: ImageManager, count: int) -> float:
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(images.ensure, container(f"registry.local/app{index}:v1"),
                               f"uid-{index}", NOW)
    return trio.current_time() - started


async def test_serialized_pulls_wait_for_each_other(tmp_path: Path) -> None:
    async with limited(tmp_path) as (fake, images):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(images.ensure, container("registry.local/a:v1"), "uid-a", NOW)
            nursery.start_soon(images.ensure, container("registry.local/b:v1"), "uid-b", NOW)
            with trio.fail_after(5):
                while fake.pulls_in_flight == 0 or images.pulls_waiting == 0:
                    await trio.sleep(0.01)
            assert (images.pulls_running, images.pulls_waiting) == (1, 1)
            assert fake.pulls_in_flight == 1
        assert fake.max_pulls_in_flight == 1 and fake.calls["PullImage"] == 2


async def test_parallel_pulls_are_limited_by_max_parallel_image_pulls(tmp_path: Path) -> None:
    async with limited(tmp_path, serialize_pulls=False, max_parallel_pulls=2) as (fake, images):
        took = await pull_many(images, 5)
        assert fake.max_pulls_in_flight == 2
        assert took >= 0.9  # three rounds of 0.3 s
        assert (images.pulls_running, images.pulls_waiting) == (0, 0)


async def test_parallel_pulls_without_a_limit_all_run_at_once(tmp_path: Path) -> None:
    async with limited(tmp_path, serialize_pulls=False) as (fake, images):
        await pull_many(images, 4)
        assert fake.max_pulls_in_flight == 4


async def test_pulls_past_registry_qps_fail_and_back_off(tmp_path: Path) -> None:
    """registryPullQPS 10, registryBurst 2: of three pulls at once one is refused."""
    async with limited(tmp_path, serialize_pulls=False, registry_qps=10, registry_burst=2) as (
            fake, images):
        outcomes: dict[str, str] = {}

        async def pull(index: int) -> None:
            try:
                outcomes[f"app{index}"] = await images.ensure(
                    container(f"registry.local/app{index}:v1"), f"uid-{index}", NOW)
            except ImageError as err:
                outcomes[f"app{index}"] = f"{err.reason}: {err.message} ({err.retry_in}s)"

        async with trio.open_nursery() as nursery:
            for index in range(3):
                nursery.start_soon(pull, index)
        (refused,) = [v for v in outcomes.values() if not v.startswith("sha256:")]
        assert re.fullmatch(r'ErrImagePull: Failed to pull image "registry.local/app\d:v1": '
                            r"pull QPS exceeded \(10.0s\)", refused), refused
        assert fake.calls["PullImage"] == 2  # the refused pull never reached the runtime
        await trio.sleep(0.15)  # a token back
        assert await images.ensure(container("registry.local/app9:v1"), "uid-9", NOW + 11)
        assert fake.calls["PullImage"] == 3


def test_pull_slots_follow_the_configuration() -> None:
    assert pull_slots(True, None) == 1
    assert pull_slots(False, None) is None
    assert pull_slots(False, 3) == 3


async def test_a_registry_that_never_answers_ends_in_backoff(tmp_path: Path) -> None:
    sock = tmp_path / "cri.sock"
    async with serve_fake_runtime(sock) as fake, \
            open_cri_client(f"unix://{sock}", timeout=5.0) as client:
        fake.set_delay("PullImage", 30)
        images = ImageManager(client, pull_timeout=0.3)
        with trio.fail_after(5):
            with pytest.raises(ImageError) as caught:
                await images.ensure(container(), POD_UID, NOW)
            assert caught.value.reason == "ErrImagePull"
            assert "DEADLINE_EXCEEDED" in caught.value.message
            with pytest.raises(ImageError) as again:
                await images.ensure(container(), POD_UID, NOW + 1)
            assert again.value.reason == "ImagePullBackOff"
            # The slot was given back: another image can be pulled at once.
            fake.set_delay("PullImage", 0)
            await images.ensure(container("registry.local/other:v1"), "uid-2", NOW + 1)


# -- imagePullSecrets -----------------------------------------------------------------------------

def docker_config_secret(name: str, auths: dict[str, dict[str, str]], *,
                         legacy: bool = False) -> dict[str, Any]:
    body = auths if legacy else {"auths": auths}
    key = ".dockercfg" if legacy else ".dockerconfigjson"
    return {
        "metadata": {"name": name, "namespace": "default"},
        "type": "kubernetes.io/dockercfg" if legacy else "kubernetes.io/dockerconfigjson",
        "data": {key: base64.b64encode(json.dumps(body).encode()).decode()},
    }


def lookup_of(*secrets: dict[str, Any]) -> ObjectLookup:
    by_name = {s["metadata"]["name"]: s for s in secrets}

    def lookup(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert kind == "Secret" and namespace == "default"
        return by_name.get(name)

    return lookup


def pod_with_secrets(*names: str) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "web", "namespace": "default", "uid": POD_UID},
        "spec": {"containers": [{"name": "app", "image": IMAGE}],
                 "imagePullSecrets": [{"name": n} for n in names]},
    })


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


async def test_credentials_go_to_the_matching_registry_only(env: Env) -> None:
    secret = docker_config_secret("regcred", {
        "registry.local": {"username": "alice", "password": "s3cret"},
    })
    pod, objects = pod_with_secrets("regcred"), lookup_of(secret)
    env.fake.require_credentials(IMAGE, "alice", "s3cret")
    await env.images.ensure(container(), POD_UID, NOW, pod=pod, objects=objects)
    await env.images.ensure(container("other.io/app:v1"), POD_UID, NOW, pod=pod, objects=objects)
    (first, auth), (second, no_auth) = env.fake.pull_requests
    assert first == IMAGE and auth is not None and (auth.username, auth.password) == (
        "alice", "s3cret")
    assert second == "other.io/app:v1" and no_auth is None


async def test_without_the_secret_the_pull_is_unauthorized(env: Env) -> None:
    env.fake.require_credentials(IMAGE, "alice", "s3cret")
    failed = await expect(env, "ErrImagePull", NOW)
    assert "401 Unauthorized" in failed.message


async def test_each_matching_credential_is_tried_in_turn(env: Env) -> None:
    secrets = (
        docker_config_secret("team",
                             {"https://registry.local/v2/app": {"auth": basic("bob", "x")}}),
        docker_config_secret("all", {"registry.local": {"auth": basic("alice", "s3cret")}},
                             legacy=True),
    )
    env.fake.require_credentials(IMAGE, "alice", "s3cret")
    await env.images.ensure(container(), POD_UID, NOW, pod=pod_with_secrets("all", "team"),
                            objects=lookup_of(*secrets))
    tried = [(auth.username if auth else None) for _, auth in env.fake.pull_requests]
    assert tried == ["bob", "alice"]  # the more specific key (with a path) first


async def test_missing_pull_secret_is_a_warning_and_the_pull_goes_on(tmp_path: Path) -> None:
    sock = tmp_path / "cri.sock"
    events = Events()
    async with serve_fake_runtime(sock) as fake, \
            open_cri_client(f"unix://{sock}", timeout=5.0) as client:
        images = ImageManager(client, events)
        await images.ensure(container(), POD_UID, NOW, REF, pod=pod_with_secrets("gone"),
                            objects=lookup_of())
    assert ("Warning", "FailedToRetrieveImagePullSecret") in [(t, r) for t, r, _ in events.seen]
    assert fake.pull_requests == [(IMAGE, None)]


async def test_malformed_pull_secret_is_err_image_pull(env: Env) -> None:
    broken = docker_config_secret("regcred", {"registry.local": {"auth": "not-base64!"}})
    with pytest.raises(ImageError) as caught:
        await env.images.ensure(container(), POD_UID, NOW, pod=pod_with_secrets("regcred"),
                                objects=lookup_of(broken))
    assert caught.value.reason == "ErrImagePull"
    assert "secret default/regcred" in caught.value.message
    assert env.fake.calls["PullImage"] == 0


# -- keyring matching -----------------------------------------------------------------------------

def keyring(*locations: str) -> Keyring:
    """A keyring whose usernames are the keys, so a lookup shows which keys matched."""
    keys = [registry_key(location) for location in locations]
    return Keyring.from_configs([{key: RegistryAuth(key, key)} for key in keys])


@pytest.mark.parametrize(
    ("location", "key"),
    [
        ("registry.local", "registry.local"),
        ("https://registry.local:5000/v2/", "registry.local:5000"),
        ("http://registry.local/v1/team", "registry.local/team"),
        ("https://index.docker.io/v1/", "index.docker.io"),
        ("registry.local/team/app", "registry.local/team/app"),
    ],
)
def test_registry_keys_drop_scheme_and_api_version(location: str, key: str) -> None:
    assert registry_key(location) == key


@pytest.mark.parametrize(
    ("repository", "matching"),
    [
        ("registry.local/team/app", ["registry.local/team", "registry.local"]),
        ("registry.local/teamx/app", ["registry.local/team", "registry.local"]),  # plain prefix
        ("registry.local/other", ["registry.local"]),
        ("registry.local:5000/app", ["registry.local:5000"]),
        ("eu.registry.local/app", ["*.registry.local"]),
        ("a.eu.registry.local/app", []),  # a glob stands for one label only
        ("docker.io/library/busybox", ["index.docker.io"]),  # Docker Hub's legacy key
        ("quay.io/app", []),
    ],
)
def test_keyring_matches_host_globs_ports_and_path_prefixes(
    repository: str, matching: list[str]
) -> None:
    ring = keyring("registry.local", "registry.local/team", "registry.local:5000",
                   "*.registry.local", "https://index.docker.io/v1/")
    assert [auth.username for auth in ring.lookup(repository)] == matching


def test_credentials_are_never_printed() -> None:
    assert "s3cret" not in repr(RegistryAuth("registry.local", "alice", "s3cret"))


def test_dockerconfig_auth_field_wins_and_must_be_user_colon_password() -> None:
    config = parse_docker_config(
        json.dumps({"auths": {"r.io": {"username": "x", "password": "y",
                                       "auth": basic("u", "p:w")}}}).encode(),
        wrapped=True, where="secret a/b")
    assert (config["r.io"].username, config["r.io"].password) == ("u", "p:w")
    with pytest.raises(DockerConfigError, match="base64"):
        parse_docker_config(json.dumps({"r.io": {"auth": base64.b64encode(b"nocolon").decode()}})
                            .encode(), wrapped=False, where="secret a/b")
    with pytest.raises(DockerConfigError, match="not valid JSON"):
        parse_docker_config(b"{", wrapped=True, where="secret a/b")


def test_pull_secret_names_keep_order_and_skip_empty_or_malformed_entries() -> None:
    pod = Pod.model_validate({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": IMAGE}],
                 "imagePullSecrets": [{"name": "b"}, {"name": ""}, "junk", {"name": 3},
                                      {"name": "a"}, {"name": "b"}]},
    })
    assert image_pull_secret_names(pod) == ["b", "a"]
