"""Every flag of the Go kubelet is known, so a node's existing command line starts the agent."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from tests.net import taken_port
from trio_kubelet import cli
from trio_kubelet.config import AgentOptions

GO_FLAGS = [
    line
    for line in Path(__file__).with_name("go_kubelet_flags.txt").read_text().splitlines()
    if line and not line.startswith("#")
]


def known(flag: str) -> bool:
    try:
        cli.build_parser().parse_args(["run", f"--{flag}"])
    except cli.UsageError as exc:  # a missing or wrong value is fine; an unknown flag is not
        return "unrecognized arguments" not in str(exc)
    except SystemExit:  # --help, --version
        return True
    return True


def test_every_go_kubelet_flag_is_known(capsys: pytest.CaptureFixture[str]) -> None:
    assert len(GO_FLAGS) > 140
    assert [flag for flag in GO_FLAGS if not known(flag)] == []


def test_version_after_other_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--max-pods=3", "--version"]) == 0
    assert capsys.readouterr().out.startswith("trio-kubelet ")


def test_log_and_storage_flags_act_others_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    started: list[AgentOptions] = []

    async def run_agent(options: AgentOptions) -> None:
        started.append(options)

    monkeypatch.setattr(cli.importlib.import_module("trio_kubelet.agent"), "run_agent", run_agent)
    monkeypatch.setattr(cli, "configure_logging", lambda *args: None)
    with caplog.at_level(logging.WARNING):
        status = cli.main([
            "--hostname-override=n",
            "--container-log-max-size=20Mi",
            "--container-log-max-files", "3",
            "--local-storage-capacity-isolation=false",
            "--max-open-files=1000000",
            "--oom-score-adj", "-999",
            "--seccomp-default",
            "--vmodule=sync=4",
        ])
    assert status == 0
    config = started[0].config
    assert (config.container_log_max_size, config.container_log_max_files) == ("20Mi", 3)
    assert config.local_storage_capacity_isolation is False
    assert caplog.messages == [
        "Go kubelet flag(s) not implemented by trio-kubelet, ignored: --max-open-files, "
        "--oom-score-adj, --seccomp-default, --vmodule"
    ]


def test_rotate_server_certificates_is_server_tls_bootstrap(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    options = cli.parse_run_options([
        "--hostname-override=n", f"--bootstrap-kubeconfig={kubeconfig}",
        f"--kubeconfig={tmp_path / 'issued'}", "--rotate-server-certificates",
    ])
    assert options.config.server_tls_bootstrap is True


def test_json_log_lines_carry_gos_keys() -> None:
    formatter = cli.JSONFormatter()
    info = logging.LogRecord("trio_kubelet.workers", logging.INFO, "/x/workers.py", 7,
                             "Started container %s", ("main",), None)
    info.created = 1764322500.25
    assert json.loads(formatter.format(info)) == {
        "ts": 1764322500250.0, "caller": "workers.py:7", "msg": "Started container main", "v": 0}
    try:
        raise OSError("disk full")
    except OSError:
        error = logging.LogRecord("trio_kubelet.gc", logging.ERROR, "/x/gc.py", 9,
                                  "Container GC pass failed", (), sys.exc_info())
    line = json.loads(formatter.format(error))
    assert line["msg"] == "Container GC pass failed" and "v" not in line
    assert "OSError: disk full" in line["err"]


def test_logging_format_from_the_flag_or_the_file_and_kubeadms_block_is_quiet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert cli.parse_run_options(["--hostname-override=n", "--logging-format=json"]
                                 ).config.logging.format == "json"
    config = tmp_path / "kubelet.yaml"
    config.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        "logging:\n  format: json\n  flushFrequency: 0\n  verbosity: 0\n"
        "  options:\n    json: {infoBufferSize: '0'}\n    text: {infoBufferSize: '0'}\n"
    )
    with caplog.at_level(logging.INFO, logger="trio_kubelet.config"):
        options = cli.parse_run_options(["--hostname-override=n", f"--config={config}"])
    assert options.config.logging.format == "json"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    with pytest.raises(cli.ConfigError, match="--logging-format"):
        cli.parse_run_options(["--hostname-override=n", "--logging-format=xml"])


def test_verbosity_from_the_file_unless_the_flag_is_given(tmp_path: Path) -> None:
    config = tmp_path / "kubelet.yaml"
    config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                      "logging: {verbosity: 4}\n")
    base = ["--hostname-override=n", f"--config={config}"]
    from_file = cli.parse_run_options(base)
    assert (from_file.verbosity, from_file.log_level) == (4, logging.DEBUG)
    from_flag = cli.parse_run_options([*base, "--v=2"])
    assert (from_flag.verbosity, from_flag.log_level) == (2, logging.INFO)
    assert cli.parse_run_options(["--hostname-override=n"]).verbosity == 0
    config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                      "logging: {verbosity: -1}\n")
    with pytest.raises(cli.ConfigError, match=r"logging\.verbosity"):
        cli.parse_run_options(base)


def test_the_agent_logs_json_lines(tmp_path: Path) -> None:
    """Each line of the agent's log is a JSON object, its start as its failure (here: the
    kubelet port is taken, so it stops right after starting)."""
    with taken_port() as port:
        run = subprocess.run(
            [sys.executable, "-m", "trio_kubelet", "--logging-format=json", "--hostname-override=n",
             "--address=127.0.0.1", f"--port={port}", f"--root-dir={tmp_path}"],
            capture_output=True, text=True, timeout=60,
        )
    lines = [json.loads(line) for line in run.stderr.splitlines()]
    assert lines[0]["msg"] == "trio-kubelet 0.1.0 starting on node n" and lines[0]["v"] == 0
    assert lines[-1]["msg"].startswith(f"kubelet server: cannot listen on 127.0.0.1:{port}")
    assert "v" not in lines[-1] and run.returncode == 1
