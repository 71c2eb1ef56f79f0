"""Every flag of the Go kubelet is known, so a node's existing command line starts the agent."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

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
    monkeypatch.setattr(cli, "configure_logging", lambda verbosity: None)
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
