"""--config-dir: drop-in KubeletConfiguration files merged as the Go kubelet merges them."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_kubelet.cli import parse_run_options
from trio_kubelet.config import ConfigError, KubeletConfiguration, drop_in_files, merge_patch

HEADER = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def write(path: Path, body: str, header: str = HEADER) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + body)
    return path


def configured(*flags: str) -> KubeletConfiguration:
    return parse_run_options(["--hostname-override=n", *flags]).config


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write(
        tmp_path / "kubelet.yaml",
        "port: 20250\nmaxPods: 50\nclusterDNS: [10.0.0.9, 10.0.0.8]\n"
        "authorization:\n  mode: Webhook\n  webhook:\n"
        "    cacheAuthorizedTTL: 5m\n    cacheUnauthorizedTTL: 30s\n",
    )


def test_drop_ins_override_the_file_field_by_field_lists_whole(base: Path, tmp_path: Path) -> None:
    drop_ins = tmp_path / "kubelet.conf.d"
    write(
        drop_ins / "10-auth.conf",
        "authorization:\n  mode: AlwaysAllow\n  webhook:\n    cacheAuthorizedTTL: 8m\n"
        "clusterDNS: [10.0.0.2]\n",
    )
    config = configured(f"--config={base}", f"--config-dir={drop_ins}")
    assert config.authorization.mode == "AlwaysAllow"
    assert config.authorization.webhook.cache_authorized_ttl == 480
    assert config.authorization.webhook.cache_unauthorized_ttl == 30, "kept from the file"
    assert config.cluster_dns == ["10.0.0.2"], "a list is replaced, not appended to"
    assert (config.port, config.max_pods) == (20250, 50)


def test_later_names_win_subdirectories_in_their_place_flags_over_all(
    base: Path, tmp_path: Path
) -> None:
    drop_ins = tmp_path / "d"
    write(drop_ins / "20-pods.conf", "maxPods: 60\n")
    write(drop_ins / "15-group" / "99-pods.conf", "maxPods: 40\nport: 20260\n")
    write(drop_ins / "30-pods.yaml", "maxPods: 10\n")  # not *.conf: not a drop-in
    assert drop_in_files(drop_ins) == [
        drop_ins / "15-group" / "99-pods.conf",
        drop_ins / "20-pods.conf",
    ]
    config = configured(f"--config={base}", f"--config-dir={drop_ins}")
    assert (config.max_pods, config.port) == (60, 20260)
    flagged = configured(f"--config={base}", f"--config-dir={drop_ins}", "--max-pods=70")
    assert flagged.max_pods == 70


def test_drop_ins_apply_without_a_config_file(tmp_path: Path) -> None:
    write(tmp_path / "d" / "10.conf", "staticPodPath: manifests\nserializeImagePulls: false\n")
    config = configured(f"--config-dir={tmp_path / 'd'}")
    assert config.static_pod_path == str(tmp_path / "d" / "manifests"), "relative to the drop-in"
    assert config.serialize_image_pulls is False
    assert config.max_pods == KubeletConfiguration().max_pods


def test_a_null_in_a_drop_in_keeps_the_value_before_it() -> None:
    base = {"maxPods": 50, "authorization": {"mode": "Webhook", "webhook": {"x": 1}}}
    patch = {"maxPods": None, "authorization": {"webhook": {"y": 2}}}
    assert merge_patch(base, patch) == {
        "maxPods": 50,
        "authorization": {"mode": "Webhook", "webhook": {"x": 1, "y": 2}},
    }
    assert base["authorization"] == {"mode": "Webhook", "webhook": {"x": 1}}, "base unchanged"


@pytest.mark.parametrize(
    ("name", "text", "error"),
    [
        ("20-bad.conf", HEADER + "maxPods: many\n", "maxPods"),
        ("20-bad.conf", "maxPods: 60\n", "kind: required value"),
        ("20-bad.conf", HEADER + "maxPods: [\n", "invalid drop-in config file"),
        ("20-bad.conf", HEADER + "containerLogMaxFiles: 1\n", "containerLogMaxFiles"),
    ],
)
def test_a_bad_drop_in_is_named(
    base: Path, tmp_path: Path, name: str, text: str, error: str
) -> None:
    drop_ins = tmp_path / "d"
    write(drop_ins / "10-good.conf", "maxPods: 60\n")
    (drop_ins / name).write_text(text)
    with pytest.raises(ConfigError, match=error) as failure:
        configured(f"--config={base}", f"--config-dir={drop_ins}")
    assert f"invalid drop-in config file {drop_ins / name}: " in str(failure.value)


def test_a_missing_directory_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--config-dir: cannot read .*/nowhere: No such file"):
        configured(f"--config-dir={tmp_path / 'nowhere'}")
