"""The static pod source: naming and UID rules, malformed manifests, last good versions, polling."""

from __future__ import annotations

import functools
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from trio_kubelet.core.phase import CONFIG_SOURCE_ANNOTATION
from trio_kubelet.events import Event, PodSetUpdate
from trio_kubelet.sources import static_files
from trio_kubelet.sources.static_files import (
    CONFIG_HASH_ANNOTATION,
    CONFIG_SEEN_ANNOTATION,
    ManifestScan,
    load_manifests,
    run_static_files,
    static_pod_uid,
)

NODE = "node-1"


def pod_yaml(name: str, *, command: str = "sleep 3600", extra_meta: str = "") -> str:
    return (
        "apiVersion: v1\nkind: Pod\n"
        f"metadata:\n  name: {name}\n{extra_meta}"
        "spec:\n  containers:\n"
        f"    - name: app\n      image: busybox:1.36\n      command: [sh, -c, {command!r}]\n"
    )


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def names(scan: ManifestScan | PodSetUpdate) -> list[str]:
    return [f"{p.metadata.namespace}/{p.metadata.name}" for p in scan.pods]


def reasons(scan: ManifestScan | PodSetUpdate) -> list[tuple[str, str]]:
    return [(Path(p.file).name, p.reason) for p in scan.problems]


# --- naming, defaults and UID -------------------------------------------------------------------


def test_static_pod_defaults(tmp_path: Path) -> None:
    file = write(tmp_path, "web.yaml", pod_yaml("web"))
    scan = load_manifests(tmp_path, "Node-1")
    assert scan.problems == ()
    (pod,) = scan.pods
    assert pod.metadata.name == "web-node-1"
    assert pod.metadata.namespace == "default"
    assert pod.spec.node_name == "node-1"
    assert pod.metadata.annotations[CONFIG_SOURCE_ANNOTATION] == "file"
    assert len(pod.metadata.annotations[CONFIG_HASH_ANNOTATION]) == 32
    assert CONFIG_SEEN_ANNOTATION not in pod.metadata.annotations  # stamped by the source task
    assert pod.to_api()["spec"]["tolerations"] == [{"operator": "Exists", "effect": "NoExecute"}]
    assert pod.metadata.uid == static_pod_uid("node-1", str(file), "default", "web")
    assert pod.status.phase == "Pending"


def test_namespace_labels_and_an_existing_toleration_are_kept(tmp_path: Path) -> None:
    meta = "  namespace: kube-system\n  labels: {tier: control-plane}\n  annotations: {note: hi}\n"
    text = pod_yaml("etcd", extra_meta=meta) + (
        "  tolerations:\n    - {operator: Exists, effect: NoExecute}\n"
        "    - {key: k, operator: Exists, effect: NoSchedule}\n"
    )
    write(tmp_path, "etcd.yaml", text)
    (pod,) = load_manifests(tmp_path, NODE).pods
    assert pod.metadata.namespace == "kube-system"
    assert pod.metadata.labels == {"tier": "control-plane"}
    assert pod.metadata.annotations["note"] == "hi"
    assert len(pod.to_api()["spec"]["tolerations"]) == 2


def test_manifest_uid_is_used_as_is(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", pod_yaml("a", extra_meta="  uid: my-own-uid\n"))
    assert load_manifests(tmp_path, NODE).pods[0].metadata.uid == "my-own-uid"


def test_uid_is_stable_across_an_edit_but_the_hash_changes(tmp_path: Path) -> None:
    write(tmp_path, "web.yaml", pod_yaml("web", command="echo one"))
    before = load_manifests(tmp_path, NODE).pods[0]
    write(tmp_path, "web.yaml", pod_yaml("web", command="echo two"))
    after = load_manifests(tmp_path, NODE).pods[0]
    assert after.metadata.uid == before.metadata.uid
    assert (
        after.metadata.annotations[CONFIG_HASH_ANNOTATION]
        != before.metadata.annotations[CONFIG_HASH_ANNOTATION]
    )


def test_uid_depends_on_node_file_namespace_and_name() -> None:
    base = static_pod_uid("n", "/m/a.yaml", "default", "web")
    assert len(base) == 32 and int(base, 16) >= 0
    assert base == static_pod_uid("n", "/m/a.yaml", "default", "web")
    others = {
        static_pod_uid("m", "/m/a.yaml", "default", "web"),
        static_pod_uid("n", "/m/b.yaml", "default", "web"),
        static_pod_uid("n", "/m/a.yaml", "other", "web"),
        static_pod_uid("n", "/m/a.yaml", "default", "web2"),
    }
    assert base not in others and len(others) == 4


def test_same_content_in_two_files_gives_two_uids(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", pod_yaml("one"))
    write(tmp_path, "b.yaml", pod_yaml("two"))
    a, b = load_manifests(tmp_path, NODE).pods
    assert a.metadata.uid != b.metadata.uid


# --- files and documents ------------------------------------------------------------------------


def test_multi_document_file_and_empty_documents(tmp_path: Path) -> None:
    write(tmp_path, "m.yaml", "---\n" + pod_yaml("a") + "---\n---\n" + pod_yaml("b") + "---\n")
    scan = load_manifests(tmp_path, NODE)
    assert scan.problems == ()
    assert names(scan) == ["default/a-node-1", "default/b-node-1"]


def test_pod_list(tmp_path: Path) -> None:
    text = (
        "apiVersion: v1\nkind: PodList\nitems:\n"
        "  - metadata: {name: x, namespace: ns1}\n"
        "    spec: {containers: [{name: c, image: busybox:1.36}]}\n"
        "  - apiVersion: v1\n    kind: Pod\n    metadata: {name: y}\n"
        "    spec: {containers: [{name: c, image: busybox:1.36}]}\n"
    )
    write(tmp_path, "list.yaml", text)
    assert names(load_manifests(tmp_path, NODE)) == ["ns1/x-node-1", "default/y-node-1"]


def test_json_manifest(tmp_path: Path) -> None:
    text = (
        '{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "j"},\n'
        '\t"spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}\n'
    )
    write(tmp_path, "j.json", text)
    assert names(load_manifests(tmp_path, NODE)) == ["default/j-node-1"]


def test_files_in_name_order_dotfiles_and_subdirectories_ignored(tmp_path: Path) -> None:
    write(tmp_path, "b.yaml", pod_yaml("b"))
    write(tmp_path, "a.yaml", pod_yaml("a"))
    write(tmp_path, ".hidden.yaml", pod_yaml("hidden"))
    write(tmp_path, ".a.yaml.swp", "\0garbage")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "c.yaml", pod_yaml("c"))
    scan = load_manifests(tmp_path, NODE)
    assert names(scan) == ["default/a-node-1", "default/b-node-1"]
    assert scan.problems == ()


def test_a_single_file_path(tmp_path: Path) -> None:
    file = write(tmp_path, "only.yaml", pod_yaml("only"))
    write(tmp_path, "other.yaml", pod_yaml("other"))
    assert names(load_manifests(file, NODE)) == ["default/only-node-1"]


def test_dates_stay_strings(tmp_path: Path) -> None:
    write(tmp_path, "d.yaml", pod_yaml("d", extra_meta="  annotations: {released: 2024-01-02}\n"))
    (pod,) = load_manifests(tmp_path, NODE).pods
    assert pod.metadata.annotations["released"] == "2024-01-02"


def test_missing_path_is_not_a_problem(tmp_path: Path) -> None:
    scan = load_manifests(tmp_path / "absent", NODE)
    assert scan.pods == () and scan.problems == () and not scan.path_exists


# --- malformed input, each with its precise reason -------------------------------------------

DUPLICATE_CONTAINER = (
    "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n"
    "    - {name: app, image: busybox:1.36}\n    - {name: app, image: busybox:1.36}\n"
)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n spec: 1\n",
            # libyaml's wording (the pure-Python parser says "expected <block end>").
            "invalid YAML at line 5, column 2: did not find expected key",
        ),
        ("- just\n- a list\n", "expected a mapping (a Pod or PodList), got a list"),
        ("hello\n", 'expected a mapping (a Pod or PodList), got str "hello"'),
        (
            "apiVersion: apps/v1\nkind: Deployment\n",
            'unsupported kind "Deployment" (expected Pod or PodList)',
        ),
        (
            "apiVersion: v2\nkind: Pod\n",
            'unsupported apiVersion "v2" for kind Pod (expected v1)',
        ),
        ("apiVersion: v1\nmetadata: {name: x}\n", "kind: required value (expected Pod or PodList)"),
        ("kind: Pod\nmetadata: {name: x}\n", "apiVersion: required value (expected v1)"),
        (
            DUPLICATE_CONTAINER,
            'spec.containers[1].name: duplicate container name "app" (already used by '
            "containers[0])",
        ),
        (
            "apiVersion: v1\nkind: Pod\nspec: {containers: [{name: c, image: busybox:1.36}]}\n",
            "metadata.name: required value",
        ),
        (
            pod_yaml("Web_1"),
            'metadata.name: Invalid value: "Web_1": a lowercase RFC 1123 subdomain must consist '
            "of lower case alphanumeric characters, '-' or '.', and must start and end with an "
            "alphanumeric character (e.g. 'example.com', regex used for validation is "
            "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ),
        (
            pod_yaml("web", extra_meta="  namespace: My-NS\n"),
            'metadata.namespace: Invalid value: "My-NS": a lowercase RFC 1123 label must '
            "consist of lower case alphanumeric characters or '-', and must start and end with "
            "an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
            "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        ),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", "spec: required value"),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  restartPolicy: Sometimes\n"
            "  containers: [{name: c, image: busybox:1.36}]\n",
            'spec.restartPolicy: must be "Always", "OnFailure" or "Never" (got "Sometimes")',
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n"
            "  containers: [{name: c, image: busybox:1.36, ports: [{containerPort: 70000}]}]\n",
            "spec.containers[0].ports[0].containerPort: must be less than or equal to 65535 "
            "(got 70000)",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: []}\n",
            "spec.containers: at least one container is required",
        ),
        (
            "apiVersion: v1\nkind: PodList\nitems:\n  - metadata: {name: ok}\n"
            "    spec: {containers: [{name: c, image: busybox:1.36}]}\n"
            "  - metadata: {name: bad}\n    spec: {containers: [{name: c}]}\n",
            "items[1].spec.containers[0].image: required value",
        ),
        (
            "apiVersion: v1\nkind: PodList\nitems:\n  - kind: Service\n",
            'items[0]: unsupported kind "Service" (expected Pod)',
        ),
        ("", "no pod manifest in file (it is empty)"),
        ("# only a comment\n---\n", "no pod manifest in file (it is empty)"),
    ],
)
def test_malformed_manifest_reasons(tmp_path: Path, text: str, reason: str) -> None:
    write(tmp_path, "bad.yaml", text)
    write(tmp_path, "good.yaml", pod_yaml("good"))
    scan = load_manifests(tmp_path, NODE)
    assert reasons(scan) == [("bad.yaml", reason)]
    assert names(scan) == ["default/good-node-1"]  # other pods untouched


def test_invalid_json_reports_line_and_column(tmp_path: Path) -> None:
    write(tmp_path, "p.json", '{"apiVersion": "v1",\n  "kind": "Pod" "metadata": {}}\n')
    assert reasons(load_manifests(tmp_path, NODE)) == [
        ("p.json", "invalid JSON at line 2, column 17: Expecting ',' delimiter")
    ]


def test_each_bad_document_is_named_and_the_file_is_rejected_whole(tmp_path: Path) -> None:
    text = pod_yaml("a") + "---\n- 1\n---\napiVersion: apps/v1\nkind: Deployment\n"
    write(tmp_path, "m.yaml", text)
    scan = load_manifests(tmp_path, NODE)
    assert scan.pods == ()
    assert reasons(scan) == [
        ("m.yaml", "document 2: expected a mapping (a Pod or PodList), got a list"),
        ("m.yaml", 'document 3: unsupported kind "Deployment" (expected Pod or PodList)'),
    ]


def test_unreadable_file(tmp_path: Path) -> None:
    (tmp_path / "dangling.yaml").symlink_to(tmp_path / "nowhere.yaml")
    assert reasons(load_manifests(tmp_path, NODE)) == [
        ("dangling.yaml", "cannot read file: No such file or directory")
    ]


def test_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "bin.yaml").write_bytes(b"kind: Pod\n\xff\xfe")
    assert reasons(load_manifests(tmp_path, NODE)) == [
        ("bin.yaml", "not UTF-8 text (invalid byte at offset 10)")
    ]


def test_same_pod_in_two_files_rejects_the_later_naming_both(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", pod_yaml("web"))
    write(tmp_path, "b.yaml", pod_yaml("web", command="echo other"))
    scan = load_manifests(tmp_path, NODE)
    assert names(scan) == ["default/web-node-1"]
    assert scan.pods[0].metadata.uid == static_pod_uid(NODE, str(first), "default", "web")
    assert reasons(scan) == [
        ("b.yaml", f'pod "default/web-node-1" is already defined in {first}; ignoring this one')
    ]


def test_the_file_already_running_a_pod_keeps_it(tmp_path: Path) -> None:
    owner = write(tmp_path, "m.yaml", pod_yaml("web"))
    scan = load_manifests(tmp_path, NODE)
    write(tmp_path, "a.yaml", pod_yaml("web"))  # sorts first, but appeared later
    scan = load_manifests(tmp_path, NODE, previous=scan)
    assert scan.pods[0].metadata.uid == static_pod_uid(NODE, str(owner), "default", "web")
    assert reasons(scan) == [
        ("a.yaml", f'pod "default/web-node-1" is already defined in {owner}; ignoring this one')
    ]


def test_same_uid_in_two_files(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", pod_yaml("one", extra_meta="  uid: u1\n"))
    write(tmp_path, "b.yaml", pod_yaml("two", extra_meta="  uid: u1\n"))
    scan = load_manifests(tmp_path, NODE)
    assert names(scan) == ["default/one-node-1"]
    assert reasons(scan) == [
        (
            "b.yaml",
            'pod "default/two-node-1": metadata.uid "u1" is already used by pod '
            f'"default/one-node-1" in {first}; ignoring this one',
        )
    ]


def test_same_pod_twice_in_one_file(tmp_path: Path) -> None:
    write(tmp_path, "m.yaml", pod_yaml("web") + "---\n" + pod_yaml("web"))
    scan = load_manifests(tmp_path, NODE)
    assert scan.pods == ()
    assert reasons(scan) == [
        ("m.yaml", 'document 2: duplicate pod "default/web-node-1" (also defined by document 1)')
    ]


# --- last good versions ---------------------------------------------------------------------------


def test_a_file_turned_malformed_keeps_its_last_good_pods(tmp_path: Path) -> None:
    write(tmp_path, "web.yaml", pod_yaml("web"))
    good = load_manifests(tmp_path, NODE)
    write(tmp_path, "web.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: web\n")
    half_saved = load_manifests(tmp_path, NODE, previous=good)
    assert half_saved.pods == good.pods
    assert half_saved.stale == {str(tmp_path / "web.yaml")}
    assert [file for file, _ in reasons(half_saved)] == ["web.yaml"]
    still_bad = load_manifests(tmp_path, NODE, previous=half_saved)
    assert still_bad.pods == good.pods  # the last good version survives repeated bad scans
    write(tmp_path, "web.yaml", pod_yaml("web", command="echo fixed"))
    fixed = load_manifests(tmp_path, NODE, previous=still_bad)
    assert fixed.problems == () and fixed.stale == frozenset()
    assert fixed.pods[0].spec.containers[0].command == ["sh", "-c", "echo fixed"]


def test_a_file_malformed_from_the_start_contributes_nothing(tmp_path: Path) -> None:
    write(tmp_path, "web.yaml", DUPLICATE_CONTAINER)
    scan = load_manifests(tmp_path, NODE, previous=load_manifests(tmp_path, NODE))
    assert scan.pods == () and len(scan.problems) == 1


def test_a_deleted_file_stops_contributing(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", pod_yaml("a"))
    gone = write(tmp_path, "b.yaml", pod_yaml("b"))
    scan = load_manifests(tmp_path, NODE)
    gone.unlink()
    assert names(load_manifests(tmp_path, NODE, previous=scan)) == ["default/a-node-1"]


# --- the source task ------------------------------------------------------------------------------


async def receive(channel: trio.MemoryReceiveChannel[Event], within: float = 60.0) -> PodSetUpdate:
    with trio.fail_after(within):
        event = await channel.receive()
    assert isinstance(event, PodSetUpdate)
    return event


async def nothing_within(channel: trio.MemoryReceiveChannel[Event], seconds: float) -> bool:
    with trio.move_on_after(seconds):
        await channel.receive()
        return False
    return True


async def start_source(
    nursery: trio.Nursery,
    path: Path,
    *,
    check_frequency: float = 20.0,
    poll_interval: float = 1.0,
    log: logging.Logger | None = None,
) -> trio.MemoryReceiveChannel[Event]:
    """Start the source (polling every second, config.seen at a fixed wall time)."""
    send, receive_channel = trio.open_memory_channel[Event](100)
    await nursery.start(
        functools.partial(
            run_static_files,
            send,
            path,
            NODE,
            check_frequency=check_frequency,
            poll_interval=poll_interval,
            log=log or logging.getLogger("test"),
            wall_clock=lambda: 1_700_000_000.0,
        )
    )
    return receive_channel


async def test_initial_update_then_only_changes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    write(tmp_path, "web.yaml", pod_yaml("web"))
    async with trio.open_nursery() as nursery:
        updates = await start_source(nursery, tmp_path, check_frequency=20.0)
        first = await receive(updates)
        assert first.source == "file" and names(first) == ["default/web-node-1"]
        seen = first.pods[0].metadata.annotations[CONFIG_SEEN_ANNOTATION]
        assert seen == "2023-11-14T22:13:20.000000Z"
        assert await nothing_within(updates, 100)  # five full rescans, nothing changed
        nursery.cancel_scope.cancel()


async def test_a_change_is_picked_up_before_check_frequency(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    write(tmp_path, "web.yaml", pod_yaml("web", command="echo one"))
    async with trio.open_nursery() as nursery:
        updates = await start_source(nursery, tmp_path, check_frequency=1000.0)
        first = await receive(updates)
        start = trio.current_time()
        write(tmp_path, "web.yaml", pod_yaml("web", command="echo two, longer"))
        edited = await receive(updates)
        assert trio.current_time() - start <= 2.0
        (before,), (after,) = first.pods, edited.pods
        assert after.metadata.uid == before.metadata.uid
        assert after.spec.containers[0].command[-1] == "echo two, longer"
        assert (
            after.metadata.annotations[CONFIG_SEEN_ANNOTATION]
            == before.metadata.annotations[CONFIG_SEEN_ANNOTATION]
        )
        write(tmp_path, "new.yaml", pod_yaml("new"))
        added = await receive(updates, within=2.0)
        assert names(added) == ["default/new-node-1", "default/web-node-1"]
        (tmp_path / "web.yaml").unlink()
        removed = await receive(updates, within=2.0)
        assert names(removed) == ["default/new-node-1"]
        nursery.cancel_scope.cancel()


async def test_inotify_tells_of_changes_at_once_in_one_update_per_burst(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write(manifests, "a.yaml", pod_yaml("a"))
    async with trio.open_nursery() as nursery:
        # No poll and no full rescan for 1000 s: only inotify can tell of the changes.
        updates = await start_source(nursery, manifests, check_frequency=1000.0,
                                     poll_interval=1000.0)
        await receive(updates)
        for name in ("b", "c", "d"):
            write(manifests, f"{name}.yaml", pod_yaml(name))
        added = await receive(updates, within=1.0)
        assert names(added) == [f"default/{n}-node-1" for n in "abcd"], "the burst, at once"
        for name in ("a", "b", "c"):
            (manifests / f"{name}.yaml").unlink()
        assert names(await receive(updates, within=1.0)) == ["default/d-node-1"]
        # The directory replaced by another: its coming is seen, then changes inside it.
        manifests.rename(tmp_path / "old")
        assert (await receive(updates, within=1.0)).pods == []
        (tmp_path / "new").mkdir()
        write(tmp_path / "new", "e.yaml", pod_yaml("e"))
        (tmp_path / "new").rename(manifests)
        assert names(await receive(updates, within=1.0)) == ["default/e-node-1"]
        write(manifests, "f.yaml", pod_yaml("f"))
        assert names(await receive(updates, within=1.0)) == ["default/e-node-1", "default/f-node-1"]
        write(tmp_path / "old", "g.yaml", pod_yaml("g"))
        assert await nothing_within(updates, 10.0), "the old directory is not watched"
        nursery.cancel_scope.cancel()


async def test_problems_are_logged_once_and_again_when_they_come_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="test.static")
    log = logging.getLogger("test.static")
    write(tmp_path, "web.yaml", pod_yaml("web"))

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    async with trio.open_nursery() as nursery:
        updates = await start_source(nursery, tmp_path, check_frequency=2.0, log=log)
        good = await receive(updates)
        write(tmp_path, "web.yaml", DUPLICATE_CONTAINER)
        broken = await receive(updates)
        assert broken.pods == good.pods  # last good version kept
        assert [p.reason for p in broken.problems] == [
            'spec.containers[1].name: duplicate container name "app" (already used by '
            "containers[0])"
        ]
        assert await nothing_within(updates, 30)  # 15 full rescans: same problem, no update
        assert len(warnings()) == 1
        assert "keeping its last good pods" in warnings()[0]
        write(tmp_path, "web.yaml", pod_yaml("web"))
        assert (await receive(updates)).problems == []
        write(tmp_path, "web.yaml", DUPLICATE_CONTAINER)
        await receive(updates)
        assert len(warnings()) == 2
        nursery.cancel_scope.cancel()


async def test_missing_directory_waits_for_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    manifests = tmp_path / "manifests"
    async with trio.open_nursery() as nursery:
        updates = await start_source(nursery, manifests, check_frequency=1000.0)
        first = await receive(updates)
        assert first.pods == [] and first.problems == []  # the source is still marked as seen
        assert await nothing_within(updates, 60)
        manifests.mkdir()
        write(manifests, "web.yaml", pod_yaml("web"))
        assert names(await receive(updates, within=2.0)) == ["default/web-node-1"]
        nursery.cancel_scope.cancel()


def test_unchanged_files_are_not_parsed_again(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n"
        "spec: {containers: [{name: c, image: busybox:1.36}]}\n")
    first = load_manifests(tmp_path, "node1")
    parsed: list[str] = []
    real = static_files.read_manifest_file
    monkeypatch.setattr(static_files, "read_manifest_file",
                        lambda file, node: parsed.append(file.name) or real(file, node))
    (tmp_path / "b.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: b}\n"
        "spec: {containers: [{name: c, image: busybox:1.36}]}\n")
    second = load_manifests(tmp_path, "node1", previous=first)
    assert parsed == ["b.yaml"]
    assert [p.metadata.name for p in second.pods] == ["a-node1", "b-node1"]


# --- hostile manifests --------------------------------------------------------------------------


def with_meta(extra: str) -> str:
    """A valid pod with ``extra`` (YAML flow) added to its metadata."""
    return (
        "apiVersion: v1\nkind: Pod\n"
        f"metadata: {{name: bad, {extra}}}\n"
        "spec:\n  containers:\n    - {name: app, image: busybox:1.36}\n"
    )


def with_container(extra: str, *, spec: str = "") -> str:
    return (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\n"
        f"spec:\n{spec}  containers:\n    - {{name: app, image: busybox:1.36, {extra}}}\n"
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (with_meta("labels: {app: " + "x" * 5000 + "}"),
         'metadata.labels: Invalid value: "' + "x" * 100 + '..." (5000 characters): '
         "must be no more than 63 characters"),
        (with_meta("annotations: {a: " + "x" * 1_000_000 + "}"),
         "metadata.annotations: Too long: must have at most 262144 bytes"),
        (with_meta("annotations: {a: " + "x" * 10_000_000 + "}"),
         "metadata.annotations.a: more than 3145728 characters in one document"),
        (with_container("resources: {limits: {cpu: '-1'}}"),
         'spec.containers[0].resources.limits[cpu]: Invalid value: "-1": '
         "must be greater than or equal to 0"),
        (with_container("resources: {limits: {memory: '-5Mi'}}"),
         'spec.containers[0].resources.limits[memory]: Invalid value: "-5Mi": '
         "must be greater than or equal to 0"),
        (with_container("resources: {limits: {memory: 1Gi}, requests: {memory: 2Gi}}"),
         'spec.containers[0].resources.requests: Invalid value: "2Gi": '
         "must be less than or equal to memory limit of 1Gi"),
        (with_container("", spec=f"  terminationGracePeriodSeconds: {2**80}\n"),
         "spec.terminationGracePeriodSeconds: Invalid value: 1208925819614629174706176: "
         "must be between 0 and 9223372036854775807, inclusive"),
        (with_container("resources: {limits: {cpu: 1e1000000000}}"),
         'spec.containers[0].resources.limits.cpu: quantity "1e1000000000" is out of range '
         "(exponent beyond ±128)"),
    ],
    ids=["label-5000", "annotation-1MB", "annotation-10MB", "cpu-negative", "memory-negative",
         "request-above-limit", "grace-2**80", "quantity-exponent"],
)
def test_invalid_pods_are_refused_as_the_api_server_would(
    tmp_path: Path, text: str, reason: str
) -> None:
    write(tmp_path, "bad.yaml", text)
    write(tmp_path, "good.yaml", pod_yaml("good"))
    scan = load_manifests(tmp_path, NODE)
    assert reasons(scan) == [("bad.yaml", reason)]
    assert names(scan) == ["default/good-node-1"]


def deep_json(levels: int) -> str:
    return ('{"apiVersion":"v1","kind":"Pod","metadata":{"name":"deep"},"spec":'
            + '{"a":' * levels + "1" + "}" * levels + "}")


def alias_bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: bomb\n  annotations:\n"
            + "".join(f"    {line}\n" for line in lines)
            + "spec:\n  containers:\n    - {name: app, image: busybox:1.36}\n")


@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        ("deep.json", deep_json(100_000),
         "spec.a.a.a.a.a.a.a.a.a.a.a...: nested deeper than 100 levels"),
        ("bomb.yaml", alias_bomb(12),
         "metadata.annotations.a5[0]: more than 100000 values in the manifest "
         "(an alias counts as all it repeats)"),
        ("empty-docs.yaml", "---\n" * 20_000, "more than 1000 documents"),
    ],
)
def test_a_hostile_file_is_refused_and_keeps_its_last_good_pods(
    tmp_path: Path, name: str, text: str, reason: str
) -> None:
    write(tmp_path, name, pod_yaml("victim"))
    write(tmp_path, "other.yaml", pod_yaml("other"))
    good = load_manifests(tmp_path, NODE)
    write(tmp_path, name, text)
    scan = load_manifests(tmp_path, NODE, previous=good)
    assert reasons(scan) == [(name, reason)]
    assert names(scan) == names(good)
    assert scan.stale == {str(tmp_path / name)}


def test_a_file_over_the_size_limit_is_not_read_past_it(tmp_path: Path) -> None:
    (tmp_path / "huge.yaml").write_bytes(b"#" * (static_files.MAX_MANIFEST_BYTES + 1))
    assert reasons(load_manifests(tmp_path, NODE)) == [
        ("huge.yaml", "file is larger than 10485760 bytes")]


def test_a_fifo_never_blocks_the_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    assert names(load_manifests(tmp_path, NODE)) == []  # not listed: not a regular file
    result = static_files.read_manifest_file(fifo, NODE)  # and if it is read anyway
    assert [p.reason for p in result.problems] == ["not a regular file"]


def test_a_bug_while_reading_one_file_is_that_files_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = static_files._pods_in_document

    def fragile(document: Any, location: str, *args: Any) -> Any:
        if location.endswith("bad.yaml"):
            raise RuntimeError("boom")
        return real(document, location, *args)

    monkeypatch.setattr(static_files, "_pods_in_document", fragile)
    write(tmp_path, "bad.yaml", pod_yaml("bad"))
    write(tmp_path, "good.yaml", pod_yaml("good"))
    scan = load_manifests(tmp_path, NODE)
    assert reasons(scan) == [("bad.yaml", "cannot be read: RuntimeError: boom")]
    assert names(scan) == ["default/good-node-1"]
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None and "bad.yaml" in record.getMessage()


async def test_a_big_file_is_parsed_in_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: dict[str, str] = {}
    real = static_files.read_manifest_file

    def reading(file: Path, node: str) -> Any:
        threads[file.name] = threading.current_thread().name
        return real(file, node)

    monkeypatch.setattr(static_files, "read_manifest_file", reading)
    padding = "# " + "x" * static_files.INLINE_PARSE_BYTES + "\n"
    write(tmp_path, "big.yaml", padding + pod_yaml("big"))
    write(tmp_path, "small.yaml", pod_yaml("small"))
    async with trio.open_nursery() as nursery:
        updates = await start_source(nursery, tmp_path)
        assert names(await receive(updates)) == ["default/big-node-1", "default/small-node-1"]
        nursery.cancel_scope.cancel()
    assert threads["small.yaml"] == threading.main_thread().name
    assert threads["big.yaml"] != threading.main_thread().name
