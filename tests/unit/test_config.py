"""KubeletConfiguration defaults and checks, Go durations, flags, and the CLI's error contract."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from trio_kubelet import cli
from trio_kubelet.config import (
    AgentOptions,
    ConfigError,
    KubeletConfiguration,
    apply_flag_overrides,
    build_agent_options,
    load_config,
    load_config_file,
    resolve_node_name,
)
from trio_kubelet.model.duration import DurationError, format_duration, parse_duration

SRC = Path(__file__).resolve().parents[2] / "src"
HEADER = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def write_config(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "kubelet.yaml"
    path.write_text(header + body)
    return path


# --- durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("20s", 20.0),
        ("1m0s", 60.0),
        ("1h2m3.5s", 3723.5),
        ("300ms", 0.3),
        ("0", 0.0),
        ("0s", 0.0),
        ("1.5h", 5400.0),
        (".5s", 0.5),
        ("2h45m", 9900.0),
        ("10us", 0.00001),
        ("10µs", 0.00001),
        ("-1m", -60.0),
        ("+5s", 5.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("20 seconds", 'unknown unit " seconds"'),
        ("20", "missing unit"),
        ("", "empty"),
        ("s", "expected a number"),
        ("1x", 'unknown unit "x"'),
        ("-", "empty"),
    ],
)
def test_parse_duration_errors_quote_the_input(text: str, why: str) -> None:
    with pytest.raises(DurationError) as raised:
        parse_duration(text)
    assert str(raised.value).startswith(f'invalid duration "{text}"')
    assert why in str(raised.value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.3, "300ms"),
        (0.0015, "1.5ms"),
        (20, "20s"),
        (60, "1m0s"),
        (120, "2m0s"),
        (3600, "1h0m0s"),
        (3723.5, "1h2m3.5s"),
        (-90, "-1m30s"),
    ],
)
def test_format_duration_like_go(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


# --- defaults -------------------------------------------------------------------------------


def test_defaults_are_the_go_kubelets() -> None:
    c = KubeletConfiguration()
    assert c.static_pod_path == ""
    assert (c.file_check_frequency, c.http_check_frequency, c.sync_frequency) == (20, 20, 60)
    assert c.container_runtime_endpoint == "unix:///run/containerd/containerd.sock"
    assert c.runtime_request_timeout == 120
    assert c.pod_logs_dir == "/var/log/pods"
    assert c.max_pods == 110
    assert (c.address, c.port, c.read_only_port) == ("0.0.0.0", 10250, 0)
    assert (c.healthz_port, c.healthz_bind_address) == (10248, "127.0.0.1")
    assert c.authentication.anonymous.enabled is False
    assert c.authentication.webhook.enabled is True
    assert c.authentication.webhook.cache_ttl == 120
    assert c.authentication.x509.client_ca_file == ""
    assert c.authorization.mode == "Webhook"
    assert c.authorization.webhook.cache_authorized_ttl == 300
    assert c.authorization.webhook.cache_unauthorized_ttl == 30
    assert (c.node_status_update_frequency, c.node_status_report_frequency) == (10, 300)
    assert c.node_lease_duration_seconds == 40
    assert (c.image_gc_high_threshold_percent, c.image_gc_low_threshold_percent) == (85, 80)
    assert (c.image_minimum_gc_age, c.image_maximum_gc_age) == (120, 0)
    assert c.eviction_hard == {
        "memory.available": "100Mi",
        "nodefs.available": "10%",
        "nodefs.inodesFree": "5%",
        "imagefs.available": "15%",
    }
    assert c.eviction_pressure_transition_period == 300
    assert (c.cgroups_per_qos, c.cgroup_root, c.cgroup_driver) == (True, "/", "cgroupfs")
    assert c.enforce_node_allocatable == ["pods"]
    assert c.serialize_image_pulls is True and c.max_parallel_image_pulls is None
    assert c.register_node is True
    assert (c.kube_api_qps, c.kube_api_burst) == (50, 100)
    assert c.crash_loop_back_off.max_container_restart_period == 300
    assert (c.container_log_max_size, c.container_log_max_files) == ("10Mi", 5)
    assert c.feature_gates == {}
    assert c.resolv_conf == "/etc/resolv.conf"


def test_minimal_file_gives_the_defaults(tmp_path: Path) -> None:
    assert load_config_file(write_config(tmp_path, "")) == KubeletConfiguration()


def test_file_values_camel_case_and_go_durations(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        "staticPodPath: /etc/kubernetes/manifests\n"
        "fileCheckFrequency: 1m30s\n"
        "kubeAPIQPS: 5\n"
        "staticPodURLHeader: {Authorization: [Bearer x]}\n"
        "clusterDNS: [10.96.0.10]\n"
        "authentication: {webhook: {cacheTTL: 300ms}, x509: {clientCAFile: /ca.crt}}\n"
        "authorization: {mode: AlwaysAllow, webhook: {cacheAuthorizedTTL: 1h}}\n"
        "evictionSoftGracePeriod: {memory.available: 1m30s}\n"
        "crashLoopBackOff: {maxContainerRestartPeriod: 30s}\n"
        "featureGates: {SidecarContainers: true}\n",
    )
    c = load_config_file(path)
    assert c.static_pod_path == "/etc/kubernetes/manifests"
    assert c.file_check_frequency == 90
    assert c.kube_api_qps == 5
    assert c.static_pod_url_header == {"Authorization": ["Bearer x"]}
    assert c.cluster_dns == ["10.96.0.10"]
    assert c.authentication.webhook.cache_ttl == pytest.approx(0.3)
    assert c.authentication.x509.client_ca_file == "/ca.crt"
    assert c.authorization.mode == "AlwaysAllow"
    assert c.authorization.webhook.cache_authorized_ttl == 3600
    assert c.eviction_soft_grace_period == {"memory.available": 90}
    assert c.crash_loop_back_off.max_container_restart_period == 30
    assert c.feature_gates == {"SidecarContainers": True}
    wire = c.to_wire()
    assert wire["fileCheckFrequency"] == "1m30s"
    assert wire["authorization"]["webhook"]["cacheAuthorizedTTL"] == "1h0m0s"
    assert KubeletConfiguration.model_validate(wire) == c


def test_go_zero_values_and_null_mean_default_in_a_file(tmp_path: Path) -> None:
    path = write_config(
        tmp_path, "port: 0\nmaxPods: 0\nfileCheckFrequency: 0s\naddress: ''\nsyncFrequency:\n"
    )
    c = load_config_file(path)
    assert (c.port, c.max_pods, c.file_check_frequency) == (10250, 110, 20)
    assert (c.address, c.sync_frequency) == ("0.0.0.0", 60)


def test_pointer_fields_keep_an_explicit_zero(tmp_path: Path) -> None:
    c = load_config_file(write_config(tmp_path, "healthzPort: 0\nkubeAPIQPS: 0\n"))
    assert (c.healthz_port, c.kube_api_qps) == (0, 0)


def test_an_empty_resolv_conf_means_none_and_is_kept(tmp_path: Path) -> None:
    """resolvConf is a *string in Go: "" is "no resolver file", not "the default"."""
    assert load_config_file(write_config(tmp_path, "resolvConf: ''\n")).resolv_conf == ""
    assert load_config_file(write_config(tmp_path, "resolvConf:\n")).resolv_conf == (
        "/etc/resolv.conf"
    )


def test_report_frequency_follows_an_explicit_update_frequency(tmp_path: Path) -> None:
    c = load_config_file(write_config(tmp_path, "nodeStatusUpdateFrequency: 20s\n"))
    assert (c.node_status_update_frequency, c.node_status_report_frequency) == (20, 20)


def test_parallel_pulls_turn_off_serialized_pulls(tmp_path: Path) -> None:
    c = load_config_file(write_config(tmp_path, "maxParallelImagePulls: 3\n"))
    assert c.serialize_image_pulls is False


def test_eviction_hard_given_replaces_the_defaults_unless_merged(tmp_path: Path) -> None:
    c = load_config_file(write_config(tmp_path, "evictionHard: {memory.available: 1Gi}\n"))
    assert c.eviction_hard == {"memory.available": "1Gi"}
    merged = load_config_file(
        write_config(
            tmp_path, "mergeDefaultEvictionSettings: true\nevictionHard: {memory.available: 1Gi}\n"
        )
    )
    assert merged.eviction_hard["memory.available"] == "1Gi"
    assert merged.eviction_hard["imagefs.available"] == "15%"


def test_relative_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        "staticPodPath: manifests\ntlsCertFile: pki/kubelet.crt\n"
        "authentication: {x509: {clientCAFile: pki/ca.crt}}\npodLogsDir: /abs/logs\n"
        "resolvConf: etc/resolv.conf\n",
    )
    c = load_config_file(path)
    assert c.resolv_conf == str(tmp_path / "etc/resolv.conf")
    assert c.static_pod_path == str(tmp_path / "manifests")
    assert c.tls_cert_file == str(tmp_path / "pki/kubelet.crt")
    assert c.authentication.x509.client_ca_file == str(tmp_path / "pki/ca.crt")
    assert c.pod_logs_dir == "/abs/logs"


def test_example_config_loads() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "kubelet-config.yaml"
    c = load_config_file(example)
    assert c.static_pod_path == str(example.parent / "manifests")
    assert c.file_check_frequency == 20


# --- unknown fields ---------------------------------------------------------------------------


def test_unknown_fields_warn_by_name_and_are_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(
        tmp_path, "maxPods: 7\nbogusField: 1\nauthentication: {webhook: {typoTTL: 1s}}\n"
    )
    with caplog.at_level(logging.INFO, logger="trio_kubelet.config"):
        c = load_config_file(path)
    assert c.max_pods == 7
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "bogusField" in warnings[0].getMessage()
    assert "authentication.webhook.typoTTL" in warnings[0].getMessage()


def test_go_fields_we_do_not_implement_are_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(tmp_path, "seccompDefault: true\npodCIDR: 10.0.0.0/24\n")
    with caplog.at_level(logging.INFO, logger="trio_kubelet.config"):
        load_config_file(path)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("seccompDefault, podCIDR" in r.getMessage() for r in caplog.records)


# --- invalid files: one line, naming the field ----------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("fileCheckFrequency: 20 seconds\n", 'fileCheckFrequency: invalid duration "20 seconds"'),
        ("fileCheckFrequency: 20\n", "fileCheckFrequency: invalid duration 20"),
        ("syncFrequency: -1m\n", "syncFrequency: must not be negative"),
        ("port: -1\n", "port: must be between 1 and 65535, inclusive (got -1)"),
        ("port: 70000\n", "port: must be between 1 and 65535, inclusive (got 70000)"),
        ("readOnlyPort: 65536\n", "readOnlyPort: must be between 0 and 65535"),
        ("healthzPort: -5\n", "healthzPort: must be between 0 and 65535"),
        ("maxPods: -1\n", "maxPods: must not be a negative number (got -1)"),
        (
            "maxPods: many\n",
            'maxPods: must be a valid integer, unable to parse string as an integer (got "many")',
        ),
        (
            "imageGCLowThresholdPercent: 90\n",
            "imageGCLowThresholdPercent: 90 must be less than imageGCHighThresholdPercent (85)",
        ),
        (
            "imageGCHighThresholdPercent: 101\n",
            "imageGCHighThresholdPercent: must be between 0 and 100",
        ),
        (
            "imageMaximumGCAge: 1m\n",
            "imageMaximumGCAge: 1m0s must be greater than imageMinimumGCAge (2m0s)",
        ),
        (
            "authorization: {mode: Magic}\n",
            'authorization.mode: must be "AlwaysAllow" or "Webhook" (got "Magic")',
        ),
        (
            "authentication: {webhook: {cacheTTL: soon}}\n",
            'authentication.webhook.cacheTTL: invalid duration "soon"',
        ),
        ("address: localhost\n", 'address: "localhost" is not a valid IP address'),
        ("clusterDNS: [10.0.0.1, nope]\n", 'clusterDNS[1]: "nope" is not a valid IP address'),
        (
            "evictionHard: {memory.free: 1Gi}\n",
            "evictionHard[memory.free]: unknown eviction signal",
        ),
        (
            "evictionHard: {memory.available: 120%}\n",
            'evictionHard[memory.available]: invalid percentage "120%"',
        ),
        ("containerLogMaxSize: 10 MB\n", 'containerLogMaxSize: "10 MB" is not a quantity'),
        ("containerLogMaxFiles: 1\n", "containerLogMaxFiles: must be 2 or greater (got 1)"),
        ("cgroupDriver: docker\n", 'cgroupDriver: must be "cgroupfs" or "systemd" (got "docker")'),
        ("registerNode: perhaps\n", "registerNode: must be a valid boolean"),
        ("nodeLeaseDurationSeconds: -1\n", "nodeLeaseDurationSeconds: must be greater than 0"),
        (
            "crashLoopBackOff: {maxContainerRestartPeriod: 10m}\n",
            "crashLoopBackOff.maxContainerRestartPeriod: must be between 1s and 300s",
        ),
        (
            "enforceNodeAllocatable: [pods, gpus]\n",
            'enforceNodeAllocatable[1]: unknown value "gpus"',
        ),
        (
            "maxParallelImagePulls: 4\nserializeImagePulls: true\n",
            "maxParallelImagePulls: cannot be larger than 1",
        ),
        ("kubeReserved: {memory: lots}\n", 'kubeReserved.memory: "lots" is not a quantity'),
        ("staticPodURLHeader: {X: notalist}\n", "staticPodURLHeader.X: must be a valid list"),
        (
            "maxPods: 5\n  x: 1\n",
            "invalid YAML at line 4, column 4: mapping values are not allowed",
        ),
    ],
)
def test_invalid_config_is_one_line_naming_the_field(
    tmp_path: Path, body: str, message: str
) -> None:
    path = write_config(tmp_path, body)
    with pytest.raises(ConfigError) as raised:
        load_config_file(path)
    text = str(raised.value)
    assert "\n" not in text
    assert text.startswith(f"invalid config file {path}: {message}")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: KubeletConfiguration\n", "apiVersion: required value"),
        ("apiVersion: kubelet.config.k8s.io/v1beta1\n", "kind: required value"),
        (
            "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
            'apiVersion: unsupported "kubelet.config.k8s.io/v1alpha1"',
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
            'kind: unsupported "KubeProxyConfiguration" (expected KubeletConfiguration)',
        ),
        ("- a\n- b\n", "expected a KubeletConfiguration mapping, got a list"),
        ("", "expected a KubeletConfiguration mapping, got an empty document"),
    ],
)
def test_wrong_kind_or_api_version_is_an_error(tmp_path: Path, text: str, message: str) -> None:
    path = write_config(tmp_path, text, header="")
    with pytest.raises(
        ConfigError,
        match="^invalid config file .*: " + re.escape(message),
    ):
        load_config_file(path)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read: No such file or directory"):
        load_config_file(tmp_path / "absent.yaml")


# --- flag overrides -----------------------------------------------------------------------------


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, "staticPodPath: /from/file\nmaxPods: 7\nport: 1234\n")
    c = load_config(
        path,
        {
            "staticPodPath": ("--pod-manifest-path", "/from/flag"),
            "fileCheckFrequency": ("--file-check-frequency", 5.0),
            "authentication.x509.clientCAFile": ("--client-ca-file", "/ca"),
        },
    )
    assert c.static_pod_path == "/from/flag"
    assert c.file_check_frequency == 5
    assert c.authentication.x509.client_ca_file == "/ca"
    assert (c.max_pods, c.port) == (7, 1234)  # untouched by flags


def test_an_invalid_flag_value_names_the_flag() -> None:
    with pytest.raises(ConfigError) as raised:
        apply_flag_overrides(KubeletConfiguration(), {"port": ("--port", 0)})
    assert str(raised.value) == "--port: must be between 1 and 65535, inclusive (got 0)"
    with pytest.raises(ConfigError, match=r"^--image-gc-low-threshold: 95 must be less than"):
        apply_flag_overrides(
            KubeletConfiguration(), {"imageGCLowThresholdPercent": ("--image-gc-low-threshold", 95)}
        )


# --- node options -------------------------------------------------------------------------------


def test_node_name_is_the_lowercased_override_or_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_node_name("  Worker-1.Example.COM ") == "worker-1.example.com"
    monkeypatch.setattr("socket.gethostname", lambda: "MyHost\n")
    assert resolve_node_name(None) == "myhost"
    assert resolve_node_name("") == "myhost"
    monkeypatch.setattr("socket.gethostname", lambda: "my_host")
    with pytest.raises(
        ConfigError, match=r'^host name: "my_host" is not a valid node name.*--hostname-override'
    ):
        resolve_node_name(None)


def test_build_agent_options(tmp_path: Path) -> None:
    options = build_agent_options(
        config_file=write_config(tmp_path, "maxPods: 9\n"),
        root_dir=Path("state"),
        hostname_override="Node-A",
        node_ip="10.0.0.5,fd00::5",
        kubeconfig=Path("/etc/kubernetes/kubelet.conf"),
        record=Path("run.rec"),
        verbosity=4,
    )
    assert options.config.max_pods == 9
    assert options.node_name == "node-a"
    assert options.root_dir == Path.cwd() / "state"
    assert options.node_ip == "10.0.0.5,fd00::5"
    assert options.kubeconfig == Path("/etc/kubernetes/kubelet.conf")
    assert options.record == Path("run.rec")
    assert options.log_level == logging.DEBUG
    with pytest.raises(AttributeError):
        setattr(options, "node_name", "other")  # noqa: B010 (frozen: assignment must fail)


@pytest.mark.parametrize("node_ip", ["1.2.3", "10.0.0.1,10.0.0.2", "a,b,c"])
def test_bad_node_ip(node_ip: str) -> None:
    with pytest.raises(ConfigError, match=r"^--node-ip: "):
        build_agent_options(hostname_override="n", node_ip=node_ip)


# --- the command line ---------------------------------------------------------------------------


@pytest.fixture
def fake_agent(monkeypatch: pytest.MonkeyPatch) -> list[AgentOptions]:
    """Replace trio_kubelet.agent with a stub that records the options it was run with."""
    calls: list[AgentOptions] = []

    async def run_agent(options: AgentOptions) -> None:
        calls.append(options)

    module = types.ModuleType("trio_kubelet.agent")
    module.run_agent = run_agent  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "trio_kubelet.agent", module)
    monkeypatch.setattr(cli, "configure_logging", lambda *args: None)
    return calls


def test_go_style_command_line_runs_the_agent(
    tmp_path: Path, fake_agent: list[AgentOptions]
) -> None:
    config = write_config(tmp_path, "staticPodPath: /from/file\nfileCheckFrequency: 30s\n")
    status = cli.main(
        [
            "--config",
            str(config),
            "--pod-manifest-path",
            "/etc/kubernetes/manifests",
            "--file-check-frequency=5s",
            "--hostname-override=Node-1",
            "--max-pods",
            "20",
            "--register-node=false",
            "--manifest-url-header=a:1,b:2",
            "--manifest-url-header",
            "a:3",
            "--feature-gates=A=true,B=false",
            "--cluster-dns=10.0.0.10",
            "--resolv-conf=",
            "--minimum-image-ttl-duration=5m",
            "--record",
            "out.rec",
            "--record-max-bytes=10Mi",
            "--v=4",
        ]
    )
    assert status == 0
    (options,) = fake_agent
    assert options.config.static_pod_path == "/etc/kubernetes/manifests"
    assert options.config.file_check_frequency == 5
    assert options.config.max_pods == 20
    assert options.config.register_node is False
    assert options.config.static_pod_url_header == {"a": ["1", "3"], "b": ["2"]}
    assert options.config.feature_gates == {"A": True, "B": False}
    assert options.config.cluster_dns == ["10.0.0.10"]
    assert options.config.resolv_conf == ""
    assert options.config.image_minimum_gc_age == 300
    assert options.node_name == "node-1"
    assert options.record == Path("out.rec") and options.record_max_bytes == 10 * 2**20
    assert options.verbosity == 4 and options.log_level == logging.DEBUG


def test_run_subcommand_and_bare_bool_flag(fake_agent: list[AgentOptions]) -> None:
    assert cli.main(["run", "--hostname-override=n", "--register-node", "-v", "2"]) == 0
    assert fake_agent[0].config.register_node is True
    assert fake_agent[0].verbosity == 2


def test_no_arguments_runs_with_defaults(
    fake_agent: list[AgentOptions], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "host")
    assert cli.main([]) == 0
    assert fake_agent[0].config == KubeletConfiguration()
    assert fake_agent[0].root_dir == Path("/var/lib/kubelet")


def test_keyboard_interrupt_exits_zero_without_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def run_agent(options: AgentOptions) -> None:
        raise KeyboardInterrupt

    module = types.ModuleType("trio_kubelet.agent")
    module.run_agent = run_agent  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "trio_kubelet.agent", module)
    monkeypatch.setattr(cli, "configure_logging", lambda *args: None)
    assert cli.main(["--hostname-override=n"]) == 0
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-pods=abc"], '--max-pods: invalid integer "abc"'),
        (["--max-pods", "abc"], '--max-pods: invalid integer "abc"'),
        (["--port=70000"], "--port: must be between 1 and 65535, inclusive (got 70000)"),
        (
            ["--file-check-frequency=20 seconds"],
            '--file-check-frequency: invalid duration "20 seconds"',
        ),
        (["--sync-frequency=-1s"], "--sync-frequency: must not be negative"),
        (["--register-node=maybe"], '--register-node: invalid boolean "maybe"'),
        (
            ["--healthz-bind-address=localhost"],
            '--healthz-bind-address: "localhost" is not a valid IP address',
        ),
        (["--node-ip=1.2.3"], '--node-ip: "1.2.3" is not a valid IP address'),
        (
            ["--hostname-override=Bad_Name"],
            '--hostname-override: "bad_name" is not a valid node name',
        ),
        (["--record-max-bytes=lots"], '--record-max-bytes: invalid size "lots"'),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--config=/nonexistent/k.yaml"], "invalid config file /nonexistent/k.yaml: cannot read"),
        (["replay"], "the following arguments are required: FILE"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(
    argv: list[str],
    message: str,
    fake_agent: list[AgentOptions],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--hostname-override=n", *argv] if argv[0] != "replay" else argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"trio-kubelet: error: {message}")
    assert not fake_agent


def test_config_file_error_through_the_cli(
    tmp_path: Path, fake_agent: list[AgentOptions], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, "fileCheckFrequency: 20 seconds\n")
    assert cli.main(["--config", str(path), "--hostname-override=n"]) == 2
    assert capsys.readouterr().err.startswith(
        f"trio-kubelet: error: invalid config file {path}: "
        'fileCheckFrequency: invalid duration "20 seconds"'
    )


def test_replay_passes_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def replay_main(args: Any) -> int:
        seen.append(args)
        return 3

    module = types.ModuleType("trio_kubelet.replay.cli")
    module.replay_main = replay_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "trio_kubelet.replay.cli", module)
    argv = ["replay", "run.rec", "--check", "--until=90s", "--pod", "default/web", "--timeline"]
    assert cli.main(argv) == 3
    (args,) = seen
    assert args.file == Path("run.rec") and args.check and args.until == 90
    assert args.pod == "default/web" and args.timeline == "-" and not args.explain


def test_replay_not_available_yet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "trio_kubelet.replay.cli", None)
    assert cli.main(["replay", "run.rec"]) == 2
    assert capsys.readouterr().err == "replay is not available yet\n"


def test_console_entry_point_exit_status(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", "trio_kubelet", "--max-pods=abc"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == 'trio-kubelet: error: --max-pods: invalid integer "abc"\n'


def test_klog_style_log_lines() -> None:
    formatter = cli.KlogFormatter()
    record = logging.LogRecord(
        "trio_kubelet.x", logging.WARNING, __file__, 1, "a\nb %s", ("c",), None
    )
    line = formatter.format(record)
    assert line.startswith("W") and line.endswith(" trio_kubelet.x] a\\nb c")
    assert "\n" not in line


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["replay", "--help"]])
def test_help_renders_every_flag(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """argparse formats help strings with %: a bare one (as in "10%") crashes --help."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(argv)
    assert exited.value.code == 0
    out = capsys.readouterr().out
    if argv[0] == "run":
        assert "memory.available<100Mi,nodefs.available<10%\n" in out
        assert all(flag.flag in out for flag in cli.CONFIG_FLAGS)


def test_go_auth_webhook_flags_set_their_config_fields() -> None:
    options = cli.parse_run_options([
        "--hostname-override=n", "--authentication-token-webhook=false",
        "--authentication-token-webhook-cache-ttl=30s",
        "--authorization-webhook-cache-authorized-ttl=1m",
        "--authorization-webhook-cache-unauthorized-ttl", "5s",
        "--cert-dir", "/var/lib/kubelet/pki",
    ])
    auth = options.config.authentication.webhook
    assert (auth.enabled, auth.cache_ttl) == (False, 30.0)
    webhook = options.config.authorization.webhook
    assert (webhook.cache_authorized_ttl, webhook.cache_unauthorized_ttl) == (60.0, 5.0)
    assert options.cert_dir == Path("/var/lib/kubelet/pki")
    assert cli.parse_run_options(["--hostname-override=n", "--authentication-token-webhook"]
                                 ).config.authentication.webhook.enabled


def test_tls_bootstrap_and_rotation_flags() -> None:
    options = cli.parse_run_options(
        ["--hostname-override=n", "--kubeconfig=/etc/kubernetes/kubelet.conf",
         "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
         "--rotate-certificates", "--cert-dir=/var/lib/kubelet/pki"]
    )
    assert options.bootstrap_kubeconfig == Path("/etc/kubernetes/bootstrap-kubelet.conf")
    assert options.config.rotate_certificates and not options.config.server_tls_bootstrap
    assert options.certificate_dir == Path("/var/lib/kubelet/pki")
    assert cli.parse_run_options(["--hostname-override=n", "--root-dir=/r"]
                                 ).certificate_dir == Path("/r/pki")


def test_bootstrap_kubeconfig_needs_kubeconfig() -> None:
    with pytest.raises(ConfigError, match="--bootstrap-kubeconfig: needs --kubeconfig"):
        cli.parse_run_options(["--hostname-override=n", "--bootstrap-kubeconfig=/b.conf"])


def test_server_tls_bootstrap_needs_kubeconfig(tmp_path: Path) -> None:
    config = write_config(tmp_path, "serverTLSBootstrap: true\n")
    with pytest.raises(ConfigError, match="serverTLSBootstrap: needs --kubeconfig"):
        cli.parse_run_options(["--hostname-override=n", f"--config={config}"])


def test_certificate_fields_from_the_config_file(tmp_path: Path) -> None:
    config = load_config_file(
        write_config(tmp_path, "rotateCertificates: true\nserverTLSBootstrap: true\n"))
    assert config.rotate_certificates and config.server_tls_bootstrap


def test_go_only_flags_are_accepted_and_named_in_a_warning(
    fake_agent: list[AgentOptions], caplog: pytest.LogCaptureFixture
) -> None:
    """A command line written for the Go kubelet starts the agent; nothing is silently lost."""
    with caplog.at_level(logging.WARNING):
        status = cli.main(["--hostname-override=n", "--fail-swap-on=false", "--logtostderr",
                           "--pod-infra-container-image", "registry.k8s.io/pause:3.10",
                           "--kubelet-cgroups=/kubelet", "--max-pods=20"])
    assert status == 0 and fake_agent[0].config.max_pods == 20
    assert caplog.messages == [
        "Go kubelet flag(s) not implemented by trio-kubelet, ignored: --fail-swap-on, "
        "--kubelet-cgroups, --logtostderr, --pod-infra-container-image"
    ]


def test_volume_stats_agg_period_defaults_like_go_and_may_switch_the_walks_off(
    tmp_path: Path, fake_agent: list[AgentOptions]
) -> None:
    assert KubeletConfiguration().volume_stats_agg_period == 60
    assert load_config_file(write_config(tmp_path, "volumeStatsAggPeriod: 0s\n")
                            ).volume_stats_agg_period == 60, "Go's zero means the default"
    assert load_config_file(write_config(tmp_path, "volumeStatsAggPeriod: -1s\n")
                            ).volume_stats_agg_period == -1
    with pytest.raises(ConfigError, match="volumeStatsAggPeriod"):
        load_config_file(write_config(tmp_path, "volumeStatsAggPeriod: often\n"))
    for value, seconds in (("-1s", -1), ("2m", 120)):
        assert cli.main(["run", f"--volume-stats-agg-period={value}"]) == 0
        assert fake_agent.pop().config.volume_stats_agg_period == seconds
