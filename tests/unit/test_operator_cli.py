"""`leaseq operator` settings: flags, LEASEQ_* variables, defaults, and refusals."""

from __future__ import annotations

import pytest

from leaseq.core.errors import ConfigError
from leaseq_operator.cli import build_parser, main
from leaseq_operator.config import OperatorConfig

URL = {"LEASEQ_DATABASE_URL": "postgresql://db"}


def config(argv: list[str], env: dict[str, str]) -> OperatorConfig:
    return OperatorConfig.from_args(build_parser().parse_args(argv), env)


def test_flags_beat_environment_beats_defaults() -> None:
    env = {
        "LEASEQ_DATABASE_URL": "postgresql://env/db",
        "LEASEQ_NAMESPACE": "jobs",
        "LEASEQ_REAP_INTERVAL_SECONDS": "2",
        "LEASEQ_POD_NAME": "leaseq-operator-0",
    }
    got = config(["--namespace", "other", "--metrics-port", "0"], env)
    assert got.database_url == "postgresql://env/db"
    assert got.namespace == "other"
    assert got.reap_interval_seconds == 2.0
    assert got.leader_ttl_seconds == 15.0
    assert got.metrics_port == 0
    assert got.health_port == 8080
    assert got.operator_id == "leaseq-operator-0"


def test_refusals_name_the_setting() -> None:
    with pytest.raises(ConfigError, match="--database-url is required"):
        config([], {})
    with pytest.raises(ConfigError, match="LEASEQ_LEADER_TTL_SECONDS='x'"):
        config([], {**URL, "LEASEQ_LEADER_TTL_SECONDS": "x"})
    with pytest.raises(ConfigError, match="must be longer than --reap-interval-seconds"):
        config(
            ["--leader-ttl-seconds", "5", "--reap-interval-seconds", "5"],
            URL,
        )


def test_main_reports_configuration_errors(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEASEQ_DATABASE_URL", raising=False)
    assert main([]) == 2
    assert "--database-url is required" in capsys.readouterr().err


def test_hot_retention_reads_unambiguous_durations_for_operator_and_reaper() -> None:
    from leaseq.cli.main import build_parser as leaseq_parser
    from leaseq_operator.standalone import ReaperConfig

    url = {"LEASEQ_DATABASE_URL": "postgresql://h/db"}
    args = build_parser().parse_args(["--hot-retention", "90min"])
    assert OperatorConfig.from_args(args, url).hot_retention == 5400
    reaper = leaseq_parser().parse_args(["reaper"])
    assert (
        ReaperConfig.from_args(reaper, {**url, "LEASEQ_HOT_RETENTION": "2d"}).hot_retention
        == 172800
    )
    assert ReaperConfig.from_args(reaper, url).hot_retention == 3600  # default 1h
    with pytest.raises(ConfigError, match=r"LEASEQ_HOT_RETENTION='1m': .*ambiguous"):
        ReaperConfig.from_args(reaper, {**url, "LEASEQ_HOT_RETENTION": "1m"})
