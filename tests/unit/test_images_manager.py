"""images.manager: pull policies and pull backoff against the fake runtime (time is injected)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from trio_kubelet.images.manager import ImageError, ImageManager
from trio_kubelet.model.pod import Container, PullPolicy
from trio_kubelet.runtime.client import open_cri_client
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
