"""--node-labels and --register-with-taints: parsed and checked as the Go kubelet does."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_kubelet.cli import UsageError, parse_run_options
from trio_kubelet.config import AgentOptions, ConfigError, Taint, load_config_file


def run(*flags: str) -> AgentOptions:
    return parse_run_options(["--hostname-override", "n", *flags])


def test_node_labels_merge_across_flags_later_wins() -> None:
    options = parse_run_options(
        [
            "--hostname-override",
            "n",
            "--node-labels",
            "a=1,node.kubernetes.io/pool=x",
            "--node-labels",
            "a=2,kubelet.kubernetes.io/b=",
        ]
    )
    assert dict(options.node_labels) == {
        "a": "2",
        "node.kubernetes.io/pool": "x",
        "kubelet.kubernetes.io/b": "",
    }


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("noequals", '"noequals" must be key=value'),
        ("node-role.kubernetes.io/master=", "unknown 'kubernetes.io' or 'k8s.io' labels"),
        ("x.k8s.io/y=1", "unknown 'kubernetes.io' or 'k8s.io' labels x.k8s.io/y"),
        ("Bad_Prefix/x=1", "prefix must be a lowercase RFC 1123 subdomain"),
        ("a=-bad", "a value must be"),
    ],
)
def test_bad_node_labels_are_refused(value: str, error: str) -> None:
    with pytest.raises(ConfigError, match=r"^--node-labels: ") as caught:
        run("--node-labels", value)
    assert error in str(caught.value)


def test_register_with_taints() -> None:
    options = parse_run_options(
        ["--hostname-override", "n", "--register-with-taints", "a=b:NoSchedule,c:NoExecute"]
    )
    assert options.config.register_with_taints == [
        Taint(key="a", value="b", effect="NoSchedule"),
        Taint(key="c", effect="NoExecute"),
    ]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("a=b", "invalid taint spec"),
        ("a=b:Sometimes", '"NoSchedule", "PreferNoSchedule" or "NoExecute"'),
        ("=b:NoSchedule", "invalid taint spec"),
        ("a/b/c=d:NoSchedule", "prefix must be"),
    ],
)
def test_bad_taints_are_refused(value: str, error: str) -> None:
    with pytest.raises((ConfigError, UsageError)) as caught:
        run("--register-with-taints", value)
    assert "--register-with-taints" in str(caught.value)
    assert error in str(caught.value)


def test_taints_from_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "k.yaml"
    path.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        "registerWithTaints:\n- {key: dedicated, value: infra, effect: NoSchedule}\n"
    )
    config = load_config_file(path)
    assert config.register_with_taints == [
        Taint(key="dedicated", value="infra", effect="NoSchedule")
    ]
