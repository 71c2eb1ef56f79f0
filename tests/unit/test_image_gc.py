"""core.image_gc: the pure choice of images to remove (examples, then hypothesis properties)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_kubelet.core.image_gc import (
    NEVER,
    ImageFs,
    ImageGCPolicy,
    ImageRecord,
    InvalidCapacity,
    ListedImage,
    bytes_to_free,
    choose_for_space,
    detect_images,
    eviction_order,
    expired_images,
    images_in_use,
    plan_image_gc,
    removable_for_space,
    usage_percent,
)

NOW = 10_000.0
POLICY = ImageGCPolicy()  # 85 / 80 / 2 min / no max age
GB = 10**9


def record(id: str, size: int = 100, *, used: float = NEVER, detected: float = 0.0,
           pinned: bool = False) -> ImageRecord:
    return ImageRecord(id=id, size=size, pinned=pinned, first_detected=detected, last_used=used)


def records(*items: ImageRecord) -> dict[str, ImageRecord]:
    return {r.id: r for r in items}


# -- usage and thresholds -----------------------------------------------------------------------

def test_usage_percent_counts_as_go() -> None:
    assert usage_percent(ImageFs(100, 15)) == 85
    assert usage_percent(ImageFs(1000, 151)) == 85  # 100 - floor(15.1)
    assert usage_percent(ImageFs(100, 200)) == 0  # available above capacity is clamped


def test_zero_capacity_is_invalid() -> None:
    with pytest.raises(InvalidCapacity, match="invalid capacity 0 on image filesystem"):
        usage_percent(ImageFs(0, 0))


def test_bytes_to_free_reaches_the_low_threshold_only_above_the_high_one() -> None:
    assert bytes_to_free(ImageFs(100 * GB, 16 * GB), POLICY) == 0  # 84 % < 85 %
    assert bytes_to_free(ImageFs(100 * GB, 15 * GB), POLICY) == 5 * GB  # 85 % → 80 %
    assert bytes_to_free(ImageFs(100 * GB, 0), POLICY) == 20 * GB


# -- records ------------------------------------------------------------------------------------

def test_detection_stamps_new_used_and_forgets_gone_images() -> None:
    old = records(record("a", detected=5.0, used=7.0), record("gone", detected=1.0))
    listed = [ListedImage("a", 10), ListedImage("b", 20), ListedImage("c", 30, pinned=True)]
    updated = detect_images(old, listed, {"b"}, NOW, used_at={"c": 9.0})
    assert set(updated) == {"a", "b", "c"}
    assert (updated["a"].first_detected, updated["a"].last_used) == (5.0, 7.0)
    assert (updated["b"].first_detected, updated["b"].last_used) == (NOW, NOW)
    assert (updated["c"].first_detected, updated["c"].last_used, updated["c"].pinned) == (
        NOW, 9.0, True)


def test_first_detection_counts_present_images_as_old() -> None:
    updated = detect_images({}, [ListedImage("a", 10)], set(), NOW, first_pass=True)
    assert updated["a"].first_detected == NEVER
    assert removable_for_space(updated["a"], NOW, POLICY)


def test_in_use_matches_ids_tags_and_digests() -> None:
    listed = [
        ListedImage("sha256:1", 1, tags=("docker.io/library/a:1",)),
        ListedImage("sha256:2", 1, digests=("docker.io/library/b@sha256:x",)),
        ListedImage("sha256:3", 1),
        ListedImage("sha256:4", 1),
    ]
    refs = {"docker.io/library/a:1", "docker.io/library/b@sha256:x", "sha256:3"}
    assert images_in_use(listed, refs) == {"sha256:1", "sha256:2", "sha256:3"}


# -- choices ------------------------------------------------------------------------------------

def test_order_is_least_recently_used_then_first_detected() -> None:
    order = eviction_order(
        [record("new-use", used=50), record("old-use", used=10), record("never-late", detected=9),
         record("never-early", detected=3), record("busy", used=1), record("pin", pinned=True)],
        in_use={"busy"},
    )
    assert [r.id for r in order] == ["never-early", "never-late", "old-use", "new-use"]


def test_space_choice_stops_once_enough_is_freed() -> None:
    order = eviction_order([record("a", 100, used=1), record("b", 100, used=2),
                            record("c", 100, used=3)], set())
    plan = choose_for_space(order, 150, NOW, POLICY)
    assert [r.id for r in plan.removals] == ["a", "b"]
    assert [r.id for r in plan.spare] == ["c"]
    assert plan.shortfall == 0


def test_young_images_are_skipped_and_the_shortfall_reported() -> None:
    order = eviction_order([record("young", 500, detected=NOW - 60), record("old", 100)], set())
    plan = choose_for_space(order, 300, NOW, POLICY)
    assert [r.id for r in plan.removals] == ["old"]
    assert plan.shortfall == 200


def test_reclaim_frees_every_eligible_image() -> None:
    order = eviction_order([record("a", 1), record("b", 2), record("y", 4, detected=NOW)], set())
    plan = choose_for_space(order, math.inf, NOW, POLICY)
    assert [r.id for r in plan.removals] == ["a", "b"]
    assert plan.needed == 3 and plan.shortfall == 0


def test_maximum_age_removes_long_unused_images_regardless_of_usage() -> None:
    policy = ImageGCPolicy(maximum_age=3600)
    order = eviction_order([record("stale", used=NOW - 3601), record("fresh", used=NOW - 60),
                            record("never", detected=NOW - 4000),
                            record("never-new", detected=NOW - 10)], set())
    assert [r.id for r in expired_images(order, NOW, policy, started_at=0)] == ["never", "stale"]
    # The agent has not itself run for the maximum age yet: nothing counts as expired.
    assert expired_images(order, NOW, policy, started_at=NOW - 3000) == []
    assert expired_images(order, NOW, POLICY, started_at=0) == []  # max age off


def test_whole_plan_counts_age_removals_towards_space() -> None:
    policy = ImageGCPolicy(maximum_age=600)
    recs = records(record("stale", 10 * GB, used=NOW - 700), record("lru", 3 * GB, used=NOW - 60),
                   record("mru", 3 * GB, used=NOW - 30))
    plan = plan_image_gc(recs, set(), ImageFs(100 * GB, 5 * GB), NOW, policy, started_at=0)
    # 95 % used; the stale image frees 10 GB (→ 85 %, still at the high threshold), then 5 GB
    # more are needed: both others go, least recently used first.
    assert [(r.id, why) for r, why in plan.removals] == [
        ("stale", "age"), ("lru", "space"), ("mru", "space")]
    assert plan.usage_percent == 95


# -- properties ---------------------------------------------------------------------------------

_times = st.one_of(st.just(NEVER), st.floats(0, NOW, allow_nan=False))


@st.composite
def gc_states(draw: st.DrawFn) -> tuple[dict[str, ImageRecord], set[str], ImagePolicyFs]:
    count = draw(st.integers(0, 25))
    recs = {}
    for index in range(count):
        detected = draw(st.one_of(st.just(NEVER), st.floats(0, NOW, allow_nan=False)))
        used = draw(_times)
        recs[f"i{index}"] = ImageRecord(
            id=f"i{index}",
            size=draw(st.integers(0, 10 * GB)),
            pinned=draw(st.booleans()),
            first_detected=detected,
            last_used=max(used, detected) if used != NEVER else NEVER,
        )
    in_use = set(draw(st.lists(st.sampled_from(sorted(recs)), unique=True))) if recs else set()
    low = draw(st.integers(0, 98))
    high = draw(st.integers(low + 1, 100))
    policy = ImageGCPolicy(high, low, draw(st.sampled_from([0.0, 120.0, 3600.0])),
                           draw(st.sampled_from([0.0, 600.0, 7200.0])))
    capacity = draw(st.integers(1, 1000 * GB))
    fs = ImageFs(capacity, draw(st.integers(0, capacity)))
    return recs, in_use, (policy, fs)


ImagePolicyFs = tuple[ImageGCPolicy, ImageFs]
GC_SETTINGS = settings(max_examples=400, deadline=None)


@GC_SETTINGS
@given(gc_states())
def test_never_removes_in_use_pinned_or_too_young_images(
    state: tuple[dict[str, ImageRecord], set[str], ImagePolicyFs],
) -> None:
    recs, in_use, (policy, fs) = state
    plan = plan_image_gc(recs, in_use, fs, NOW, policy, started_at=0.0)
    for image, why in plan.removals:
        assert image.id not in in_use
        assert not image.pinned
        if why == "space":
            assert NOW - image.first_detected >= policy.minimum_age
    ids = [image.id for image, _ in plan.removals]
    assert len(ids) == len(set(ids))


@GC_SETTINGS
@given(gc_states())
def test_space_removals_free_enough_when_possible_and_no_more(
    state: tuple[dict[str, ImageRecord], set[str], ImagePolicyFs],
) -> None:
    recs, in_use, (policy, fs) = state
    order = eviction_order(recs.values(), in_use)
    needed = bytes_to_free(fs, policy)
    plan = choose_for_space(order, needed, NOW, policy)
    eligible = [r for r in order if removable_for_space(r, NOW, policy)]
    if needed == 0:
        assert plan.removals == ()
    elif sum(r.size for r in eligible) >= needed:
        assert plan.freed >= needed and plan.shortfall == 0
        assert plan.freed - plan.removals[-1].size < needed  # stopped at the first sufficient one
    else:
        assert list(plan.removals) == eligible  # everything it could, and says what is missing
        assert plan.shortfall == needed - plan.freed > 0


@GC_SETTINGS
@given(gc_states())
def test_space_removals_are_least_recently_used_first(
    state: tuple[dict[str, ImageRecord], set[str], ImagePolicyFs],
) -> None:
    recs, in_use, (policy, fs) = state
    order = eviction_order(recs.values(), in_use)
    plan = choose_for_space(order, bytes_to_free(fs, policy), NOW, policy)
    chosen = list(plan.removals)
    keys = [(r.last_used, r.first_detected) for r in chosen]
    assert keys == sorted(keys)
    if chosen:  # nothing eligible that was used less recently was left behind
        last = (chosen[-1].last_used, chosen[-1].first_detected)
        for skipped in plan.spare:
            assert (skipped.last_used, skipped.first_detected) >= last


@GC_SETTINGS
@given(gc_states())
def test_expired_images_are_unused_for_longer_than_the_maximum_age(
    state: tuple[dict[str, ImageRecord], set[str], ImagePolicyFs],
) -> None:
    recs, in_use, (policy, _) = state
    order = eviction_order(recs.values(), in_use)
    expired = expired_images(order, NOW, policy, started_at=0.0)
    if policy.maximum_age == 0:
        assert expired == []
    for image in expired:
        assert image.id not in in_use and not image.pinned
        since = image.last_used if image.last_used != NEVER else image.first_detected
        assert NOW - since > policy.maximum_age
