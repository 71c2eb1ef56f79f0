"""container_hash: one container's whole spec, stable, cached per instance."""

from __future__ import annotations

import gc

from trio_kubelet.core import hashing
from trio_kubelet.core.hashing import container_hash
from trio_kubelet.model.pod import Container, Pod


def test_same_spec_same_hash_across_instances() -> None:
    one = Container(name="app", image="nginx:1.27", env=[{"name": "A", "value": "1"}])
    two = Container.model_validate({"image": "nginx:1.27", "name": "app",
                                    "env": [{"value": "1", "name": "A"}]})
    assert container_hash(one) == container_hash(two)
    assert len(container_hash(one)) == 16
    int(container_hash(one), 16)


def test_any_field_change_changes_the_hash() -> None:
    base = Container(name="app", image="nginx:1.27")
    for update in ({"image": "nginx:1.28"}, {"args": ["-g"]}, {"working_dir": "/srv"},
                   {"tty": True}):
        assert container_hash(base.model_copy(update=update)) != container_hash(base)


def test_editing_one_container_leaves_the_others_alone() -> None:
    doc = {"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}]}}
    before = Pod.model_validate(doc)
    doc["spec"]["containers"][1]["command"] = ["sleep", "1"]  # type: ignore[index]
    after = Pod.model_validate(doc)
    assert container_hash(before.spec.containers[0]) == container_hash(after.spec.containers[0])
    assert container_hash(before.spec.containers[1]) != container_hash(after.spec.containers[1])


def test_cache_entry_goes_with_the_container() -> None:
    container = Container(name="temp", image="busybox")
    container_hash(container)
    key = id(container)
    assert key in hashing._CACHE
    del container
    gc.collect()
    assert key not in hashing._CACHE
