"""volumes.plugins: which plugin a volume uses."""

from __future__ import annotations

from typing import Any

import pytest

from trio_kubelet.model.pod import Volume
from trio_kubelet.volumes.errors import VolumeError
from trio_kubelet.volumes.plugins import plugin_dir_name, volume_plugin


def volume(**source: Any) -> Volume:
    return Volume.model_validate({"name": "v", **source})


def test_each_source_has_its_plugin() -> None:
    assert volume_plugin(volume(configMap={"name": "a"})) == ("configmap", {"name": "a"})
    assert volume_plugin(volume(downwardAPI={})) == ("downward-api", {})
    assert plugin_dir_name("empty-dir") == "kubernetes.io~empty-dir"


def test_no_source_is_an_empty_dir() -> None:
    assert volume_plugin(volume()) == ("empty-dir", {})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"emptyDir": {}, "secret": {}}, "may not specify more than 1 volume type"),
        ({"persistentVolumeClaim": {"claimName": "c"}},
         "no volume plugin matched: persistentVolumeClaim"),
    ],
)
def test_unusable_sources(source: dict[str, Any], message: str) -> None:
    with pytest.raises(VolumeError) as caught:
        volume_plugin(volume(**source))
    assert (caught.value.reason, caught.value.message, caught.value.volume) == (
        "FailedMount", message, "v",
    )
