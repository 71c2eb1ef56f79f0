"""images.gc: image GC passes against the fake runtime over a real socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from tests.unit.test_sync_loop import ListRecorder, replay_through_file
from trio_kubelet.core.image_gc import ImageFs, ImageGCPolicy
from trio_kubelet.images.gc import ImageGC, ImageGCError
from trio_kubelet.kube_events import EventRecorder, ObjectRef
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.recording.records import ImageGCRecord
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import CRIClient, open_cri_client
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.fake import FakeRuntime, serve_fake_runtime

MB = 10**6
CAPACITY = 1000 * MB
NODE = "node-a"
# Free down to 50 % from 60 %, and no minimum age unless a test sets one.
POLICY = ImageGCPolicy(high_threshold_percent=60, low_threshold_percent=50, minimum_age=0)


class Events(EventRecorder):
    """Keeps every event for assertions (no API server)."""

    def __init__(self) -> None:
        super().__init__(NODE)
        self.seen: list[tuple[str, str, str]] = []

    def event(self, ref: ObjectRef, type: str, reason: str, message: str, *,  # type: ignore[override]
              logged: bool = False) -> None:
        self.seen.append((type, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.seen]


@dataclass
class Env:
    fake: FakeRuntime
    client: CRIClient
    events: Events
    metrics: AgentMetrics
    other_used: int = 0  # bytes of the filesystem used by something other than images
    made: list[str] = field(default_factory=list)

    async def image_fs(self) -> ImageFs:
        return ImageFs(CAPACITY, CAPACITY - self.fake.image_bytes - self.other_used)

    def gc(self, policy: ImageGCPolicy = POLICY) -> ImageGC:
        return ImageGC(self.client, policy, node_name=NODE, events=self.events,
                       metrics=self.metrics, image_fs=self.image_fs)

    async def container_using(self, image: str, name: str = "app") -> str:
        """A (created, not started) container of a new pod, using ``image``."""
        uid = f"uid-{len(self.made)}"
        config = v1.PodSandboxConfig(
            metadata=v1.PodSandboxMetadata(name=f"pod{len(self.made)}", uid=uid,
                                           namespace="default"),
            labels=labels.sandbox_labels(uid, f"pod{len(self.made)}", "default", {}),
        )
        sandbox = await self.client.run_pod_sandbox(config)
        container = await self.client.create_container(
            sandbox, v1.ContainerConfig(metadata=v1.ContainerMetadata(name=name),
                                        image=v1.ImageSpec(image=image)), config)
        self.made.append(container)
        return container

    def present(self) -> set[str]:
        return {tag.rsplit("/", 1)[-1] for image in self.fake.list_images(
            v1.ListImagesRequest()).images for tag in image.repo_tags}


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    sock = tmp_path / "cri.sock"
    async with serve_fake_runtime(sock) as fake, \
            open_cri_client(f"unix://{sock}", timeout=5.0) as client:
        fake.add_image("registry.k8s.io/pause:3.9", size=1 * MB)  # the sandbox image
        yield Env(fake, client, Events(), AgentMetrics(NODE))


def collected(metrics: AgentMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("kubelet_image_garbage_collected_total",
                                              {"reason": reason})
    return value or 0.0


async def test_over_the_high_threshold_removes_unused_images_lru_first(env: Env) -> None:
    for name in ("old", "mid", "new", "used"):
        env.fake.add_image(f"r.io/{name}:1", size=100 * MB)
    env.fake.add_image("r.io/pinned:1", size=100 * MB, pinned=True)
    await env.container_using("r.io/used:1")
    env.other_used = 200 * MB  # 200 + 501 images = 70 % used; 50 % means freeing 201 MB
    gc = env.gc()
    for name in ("new", "mid", "old"):  # used in this order: "old" most recently
        gc.note_used(env.fake._tags[f"r.io/{name}:1"])
        await trio.sleep(0.01)
    result = await gc.collect()
    assert env.present() == {"pause:3.9", "used:1", "pinned:1"}  # three needed for 201 MB
    assert result.needed_bytes == 201 * MB and result.freed_bytes == 300 * MB
    assert [r.tags[0].split("/")[-1] for r in result.removed] == ["new:1", "mid:1", "old:1"]
    assert collected(env.metrics, "space") == 3


async def test_stops_as_soon_as_enough_is_freed(env: Env) -> None:
    for name in ("a", "b", "c"):
        env.fake.add_image(f"r.io/{name}:1", size=100 * MB)
    env.other_used = 300 * MB  # 601 MB used: 60 % → free 101 MB
    result = await env.gc().collect()
    assert len(result.removed) == 2 and result.freed_bytes == 200 * MB


async def test_under_the_high_threshold_nothing_is_removed(env: Env) -> None:
    env.fake.add_image("r.io/a:1", size=100 * MB)
    result = await env.gc().collect()
    assert result.removed == () and env.present() == {"pause:3.9", "a:1"}
    assert env.fake.calls["RemoveImage"] == 0


async def test_exited_containers_keep_their_image(env: Env) -> None:
    env.fake.add_image("r.io/a:1", size=100 * MB)
    container = await env.container_using("r.io/a:1")
    await env.client.start_container(container)
    env.fake.crash(container, 1)
    env.other_used = 800 * MB
    with pytest.raises(ImageGCError):
        await env.gc().collect()
    assert "a:1" in env.present()


async def test_not_enough_to_free_is_free_disk_space_failed(env: Env) -> None:
    env.fake.add_image("r.io/a:1", size=50 * MB)
    env.other_used = 900 * MB
    with pytest.raises(ImageGCError, match="could free only 50000000 bytes"):
        await env.gc().collect()
    assert env.events.reasons() == ["FreeDiskSpaceFailed"]
    assert env.present() == {"pause:3.9"}  # it still removed what it could


async def test_minimum_age_protects_newly_detected_images(env: Env) -> None:
    gc = env.gc(ImageGCPolicy(60, 50, minimum_age=120))
    env.other_used = 900 * MB
    with pytest.raises(ImageGCError):
        await gc.collect()  # first pass: "pause" counts as present since long ago
    env.fake.add_image("r.io/fresh:1", size=50 * MB)
    with pytest.raises(ImageGCError):
        await gc.collect()
    assert "fresh:1" in env.present()


async def test_sandbox_image_is_never_removed_even_if_not_pinned(env: Env) -> None:
    env.other_used = 900 * MB
    with pytest.raises(ImageGCError):
        await env.gc().collect()
    assert env.present() == {"pause:3.9"}
    env.fake.sandbox_image = "r.io/other:1"  # now pause is just another unused image
    with pytest.raises(ImageGCError):
        await env.gc().collect()
    assert env.present() == set()


async def test_maximum_age_removes_long_unused_images_below_the_threshold(env: Env) -> None:
    env.fake.add_image("r.io/a:1", size=10 * MB)
    gc = env.gc(ImageGCPolicy(85, 80, minimum_age=0, maximum_age=1.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(gc.run)
        gc.note_used(env.fake._tags["r.io/a:1"])
        await gc.collect()
        assert "a:1" in env.present()  # the agent has not run for the maximum age yet
        await trio.sleep(1.2)
        await gc.collect()
        nursery.cancel_scope.cancel()
    assert env.present() == {"pause:3.9"}
    assert collected(env.metrics, "age") == 1


async def test_a_failed_removal_takes_the_next_candidate(env: Env) -> None:
    for name in ("a", "b", "c"):
        env.fake.add_image(f"r.io/{name}:1", size=100 * MB)
    env.other_used = 300 * MB
    gc = env.gc()
    # Equally unused since the first pass: ties go by ID, so the smallest ID goes first.
    broken = min(env.fake._tags[f"r.io/{name}:1"] for name in ("a", "b", "c"))
    original = env.fake.remove_image

    def remove_image(request: v1.RemoveImageRequest) -> v1.RemoveImageResponse:
        if request.image is not None and request.image.image == broken:
            from trio_kubelet.runtime.errors import CRIUnknown, StatusCode
            raise CRIUnknown("RemoveImage", StatusCode.UNKNOWN, "image is busy")
        return original(request)

    env.fake.remove_image = remove_image  # type: ignore[method-assign]
    with pytest.raises(ImageGCError, match="image is busy"):
        await gc.collect()  # enough was freed, but a failure is still a failed pass
    assert len(env.present()) == 2 and env.fake._resolve_image(broken) is not None


async def test_reclaim_removes_every_unused_image_for_disk_signals_only(env: Env) -> None:
    for name in ("a", "b"):
        env.fake.add_image(f"r.io/{name}:1", size=10 * MB)
    await env.container_using("r.io/b:1")
    gc = env.gc(ImageGCPolicy(minimum_age=0))
    await gc.reclaim("memory.available")
    assert env.fake.calls["RemoveImage"] == 0
    await gc.reclaim("imagefs.available")  # below every threshold: reclaim does not care
    assert env.present() == {"pause:3.9", "b:1"}


async def test_periodic_passes_report_repeated_failures(env: Env) -> None:
    env.other_used = 900 * MB
    gc = env.gc()
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: gc.run(period=0.05, task_status=task_status))
        with trio.fail_after(5):
            while "ImageGCFailed" not in env.events.reasons():
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    reasons = env.events.reasons()
    assert reasons[0] == "FreeDiskSpaceFailed"  # the first failure: no ImageGCFailed yet
    assert reasons[1:3] == ["FreeDiskSpaceFailed", "ImageGCFailed"]


async def test_high_threshold_100_without_max_age_runs_no_periodic_pass(env: Env) -> None:
    env.fake.add_image("r.io/a:1", size=10 * MB)
    env.other_used = 989 * MB  # 100 %
    gc = env.gc(ImageGCPolicy(100, 80, minimum_age=0))
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: gc.run(period=0.01, task_status=task_status))
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert env.fake.calls["ListImages"] == 0


async def test_choices_are_recorded_and_replay_to_the_same_images(
    env: Env, tmp_path: Path
) -> None:
    for name in ("a", "b", "c", "used"):
        env.fake.add_image(f"r.io/{name}:1", size=100 * MB)
    await env.container_using("r.io/used:1")
    env.other_used = 200 * MB  # 601 MB used: 60 % -> free 101 MB
    tags = {v: k.split("/")[-1] for k, v in env.fake._tags.items()}
    recorder = ListRecorder()
    gc = ImageGC(env.client, POLICY, node_name=NODE, events=env.events,
                 image_fs=env.image_fs, recorder=recorder)
    gc.note_used(env.fake._tags["r.io/c:1"])
    await gc.collect()
    await gc.collect()  # under the threshold now: nothing chosen, nothing recorded
    await gc.reclaim("imagefs.available")

    space, reclaim = recorder.records
    assert isinstance(space, ImageGCRecord) and isinstance(reclaim, ImageGCRecord)
    assert sorted(tags[i] for i in space.removals) == ["a:1", "b:1"]  # c was used: it goes last
    assert space.expired == [] and space.image_fs is not None
    assert [tags[i] for i in reclaim.removals] == ["c:1"] and reclaim.image_fs is None
    config = {"imageGCHighThresholdPercent": 60, "imageGCLowThresholdPercent": 50,
              "imageMinimumGCAge": "0s"}
    result = replay_through_file([space, reclaim], tmp_path, config)
    assert result.ok and result.gc_passes == 2

    # Had "a" been in use, the pass would have had to choose differently.
    tampered = space.model_copy(update={"in_use": sorted([*space.in_use, space.removals[0]])})
    diverged = replay_through_file([tampered], tmp_path, config)
    assert diverged.divergence is not None
    assert diverged.divergence.reason == (
        "the replayed image GC choice differs from the recorded one")
    # A configuration with a lower high threshold is not the one the pass ran under.
    other = replay_through_file([space], tmp_path, {**config, "imageGCLowThresholdPercent": 20})
    assert other.divergence is not None


async def test_an_age_removal_is_recorded_and_replays(env: Env, tmp_path: Path) -> None:
    env.fake.add_image("r.io/a:1", size=10 * MB)
    image_a = env.fake._tags["r.io/a:1"]
    recorder = ListRecorder()
    policy = ImageGCPolicy(85, 80, minimum_age=0, maximum_age=1.0)
    gc = ImageGC(env.client, policy, node_name=NODE, events=env.events,
                 image_fs=env.image_fs, recorder=recorder)
    async with trio.open_nursery() as nursery:
        await nursery.start(gc.run)
        await trio.sleep(1.2)
        await gc.collect()
        nursery.cancel_scope.cancel()
    (record,) = recorder.records
    assert record.expired == record.removed_by_age == [image_a]  # not pause
    config = {"imageMinimumGCAge": "0s", "imageMaximumGCAge": "1s"}
    assert replay_through_file([record], tmp_path, config).ok
    assert not replay_through_file([record], tmp_path, {**config, "imageMaximumGCAge": "1h"}).ok
