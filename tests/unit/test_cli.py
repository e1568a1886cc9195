"""The CLI's config handling, in-process (no Spark: every case fails or ends before it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lakesink.cli import app

runner = CliRunner()


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


GOOD = {"source": {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topics": ["events"]}},
        "table": {"partition_by": ["location", "day"], "timestamp_column": "ts"},
        "decode": {"schema": [{"name": "location", "type": "Utf8"},
                              {"name": "ts", "type": "Int64"}]}}


def test_help_lists_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("run", "validate", "demo"):
        assert command in result.output


def test_validate_prints_redacted_config(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["validate", "-c", str(write(tmp_path, GOOD)), "--offline",
              "--set", "source.kafka.sasl.username=alice", "--set", f"table.base_path={tmp_path}"],
        env={"LAKESINK_SOURCE__KAFKA__SASL__PASSWORD": "hunter2"},
    )
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.output
    assert "password: '**********'" in result.output
    assert "partition_by:" in result.output
    assert "ok schema: 2 declared field(s)" in result.output


def test_validate_says_it_checks_the_source_and_fails_at_once_when_refused(tmp_path: Path
                                                                          ) -> None:
    """A refused connection is an answer: validate tries once instead of waiting the
    source's connect_timeout_s (30 s) in silence (``run`` waits, and says so)."""
    result = runner.invoke(app, ["validate", "-c", str(write(tmp_path, GOOD)),
                                 "--set", f"table.base_path={tmp_path}"])
    assert result.exit_code == 1, result.output
    assert "checking that kafka 127.0.0.1:1 ['events'] answers" in result.output
    assert "no Kafka broker reachable at 127.0.0.1:1 (" in result.output  # not "after 30s"


def test_a_wait_for_a_server_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    from lakesink.errors import SourceError
    from lakesink.sources.net import wait_for_tcp

    with caplog.at_level("WARNING"), pytest.raises(SourceError, match="after 1s"):
        wait_for_tcp([("127.0.0.1", 1)], 1.0, what="no broker", key="k")
    said = [r.getMessage() for r in caplog.records if "waiting up to" in r.getMessage()]
    assert said == ["no broker (127.0.0.1:1: Connection refused); waiting up to 1 s for it"]


def test_config_errors_exit_2_naming_the_key(tmp_path: Path) -> None:
    bad = {**GOOD, "table": {**GOOD["table"], "compression": "brotli"}}
    result = runner.invoke(app, ["validate", "-c", str(write(tmp_path, bad)), "--offline"])
    assert result.exit_code == 2
    assert "table.compression" in result.output
    result = runner.invoke(app, ["run", "-c", str(write(tmp_path, GOOD)),
                                 "--set", "table.partition_by=[nope]"])
    assert result.exit_code == 2
    assert "table.partition_by" in result.output


def test_partition_columns_checked_against_declared_schema(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", "-c", str(write(tmp_path, GOOD)), "--offline",
                                 "--set", "table.partition_by=[location, nope]"])
    assert result.exit_code == 2
    assert "table.partition_by" in result.output and "'nope'" in result.output


def test_existing_layout_mismatch_exit_2(tmp_path: Path) -> None:
    meta = tmp_path / ".lakesink" / "events"
    meta.mkdir(parents=True)
    (meta / "layout.json").write_text('{"format": "parquet", "partition_by": ["day"]}')
    result = runner.invoke(app, ["validate", "-c", str(write(tmp_path, GOOD)), "--offline",
                                 "--set", f"table.base_path={tmp_path}"])
    assert result.exit_code == 2
    assert "partitioned by ['day']" in result.output


def test_a_changed_null_partition_value_is_refused(tmp_path: Path) -> None:
    meta = tmp_path / ".lakesink" / "events"
    meta.mkdir(parents=True)
    (meta / "layout.json").write_text('{"format": "parquet", "partition_by": ["location"], '
                                      '"null_partition_value": "__None__"}')
    base = ["validate", "-c", str(write(tmp_path, GOOD)), "--offline",
            "--set", f"table.base_path={tmp_path}", "--set", "table.partition_by=[location]"]
    result = runner.invoke(app, base)
    assert result.exit_code == 2
    assert "table.null_partition_value" in result.output and "'__None__'" in result.output
    ok = runner.invoke(app, [*base, "--set", "table.null_partition_value=__None__"])
    assert ok.exit_code == 0, ok.output


def test_unreachable_broker_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", "-c", str(write(tmp_path, GOOD)),
                                 "--set", "source.kafka.connect_timeout_s=1"])
    assert result.exit_code == 1
    assert "no Kafka broker reachable at 127.0.0.1:1" in result.output


def test_silence_config_errors_exit_2_before_spark(tmp_path: Path) -> None:
    cfg = str(write(tmp_path, GOOD))
    result = runner.invoke(app, ["run", "-c", cfg, "--set", "silence.topic=alerts"])
    assert result.exit_code == 2
    assert "silence.timeout_ms" in result.output
    result = runner.invoke(app, ["run", "-c", cfg, "--set", "silence.timeout_ms=5000",
                                 "--set", "silence.callback=no_such_module_q:f"])
    assert result.exit_code == 2
    assert "silence.callback" in result.output and "cannot load" in result.output
    result = runner.invoke(app, ["validate", "-c", cfg, "--offline",
                                 "--set", "silence.timeout_ms=5000",
                                 "--set", "silence.callback=json:dumps"])
    assert result.exit_code == 0, result.output
    assert "silence: a key silent 5000 ms (processing time) fires to callback json:dumps" \
        in result.output


def test_every_config_problem_is_listed_with_its_key(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", "--offline", "--set", "table.bogus=1",
                                 "--set", "table.compression=brotli"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert any(line.startswith("config error: source") for line in lines), result.output
    assert any(line.startswith("table.bogus: unknown key") for line in lines), result.output
    assert any(line.startswith("table.compression:") for line in lines), result.output


def test_print_config_makes_a_file_that_runs_the_same(tmp_path: Path) -> None:
    """``run --print-config``: flags, environment and file resolved into one config file,
    secrets left out and named; loaded back with the same secrets it is the same config."""
    from lakesink.config import load_config, redacted_dict

    env = {"LAKESINK_SOURCE__KAFKA__SASL__PASSWORD": "hunter2",
           "LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS": '{"ssl.key.password": "kp"}',
           "AWS_SECRET_ACCESS_KEY": "aws-secret", "AWS_ACCESS_KEY_ID": "AKIA1",
           "S3_BUCKET": "lake", "S3_PREFIX": "data"}
    result = runner.invoke(
        app, ["run", "-c", str(write(tmp_path, GOOD)), "--print-config", "--topic", "other",
              "--set", "source.kafka.sasl.username=alice", "--until-caught-up"], env=env)
    assert result.exit_code == 0, result.output
    text = result.stdout
    for secret in ("hunter2", "kp", "aws-secret", "AKIA1", "**********"):
        assert secret not in text
    assert "source.kafka.sasl.password: LAKESINK_SOURCE__KAFKA__SASL__PASSWORD" in text
    assert ("source.kafka.secret_options.ssl.key.password: "
            "LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS (JSON") in text
    printed = tmp_path / "printed.yaml"
    printed.write_text(text)
    secrets_only = {k: v for k, v in env.items() if k not in ("S3_BUCKET", "S3_PREFIX")}
    again = load_config(printed, env=secrets_only)
    original = load_config(write(tmp_path, GOOD), env=env, flags={
        "source.kafka.topics": "other", "source.kafka.sasl.username": "alice",
        "trigger.until_caught_up": True})
    assert redacted_dict(again) == redacted_dict(original)
    assert again.source.kafka.sasl.password.get_secret_value() == "hunter2"
    assert again.table.base_path == "s3a://lake/data"


def test_run_without_any_configuration_says_so(monkeypatch) -> None:  # noqa: ANN001
    import os

    for key in [k for k in os.environ if k.startswith("LAKESINK_")]:
        monkeypatch.delenv(key)
    result = runner.invoke(app, ["run"])
    assert result.exit_code == 2, result.output
    assert "no configuration was given" in result.output
    assert "lakesink demo" in result.output


def test_kdi_help_lists_every_flag_with_its_lakesink_key() -> None:
    """issue 41 item 4: `--help` on kdi, kdi ingest and kdi repair (was "unknown
    argument(s): --help", exit 2); the ingest help is the flag table."""
    from lakesink.compat.kdi import IGNORED

    ingest = runner.invoke(app, ["kdi", "ingest", "--help"])
    assert ingest.exit_code == 0, ingest.output
    for flag, key in (("--partition_columns", "table.partition_by"),
                      ("-l, --allowed_latency", "trigger.interval"),
                      ("--no_takeover", "table.other_writers: ignore")):
        line = next(line for line in ingest.output.splitlines() if line.startswith(flag))
        assert key in line, line
    assert all(f"--{name}:" in ingest.output for name in IGNORED)
    for argv in (["kdi", "--help"], ["kdi", "repair", "-h"]):
        shown = runner.invoke(app, argv)
        assert shown.exit_code == 0 and shown.output.startswith("Usage: lakesink kdi"), argv
    assert "--table_url URL" in runner.invoke(app, ["kdi", "repair", "--help"]).output


def test_the_small_file_hint_speaks_only_of_many_small_files() -> None:
    from lakesink.status import small_files_hint

    assert small_files_hint(3, 1000) is None
    assert small_files_hint(500, 64 << 20) is None
    hint = small_files_hint(534, 12_000)
    assert hint is not None and "534 files of 12 KiB" in hint and "lakesink compact" in hint


def test_status_says_at_once_that_the_broker_refuses(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """issue 41 item 7: `status` waited source.kafka.connect_timeout_s (30 s) in silence
    for a broker that refuses; it now tries once (a retry would sleep: refused here)."""
    import json
    import time

    def no_waiting(_: float) -> None:
        raise AssertionError("status waited for the broker")

    monkeypatch.setattr(time, "sleep", no_waiting)
    result = runner.invoke(app, ["status", "-c", str(write(tmp_path, GOOD)), "--json",
                                 "--set", f"table.base_path={tmp_path}"])
    assert result.exit_code == 0, result.output
    (table,) = json.loads(result.output)
    assert "no Kafka broker reachable at 127.0.0.1:1 (" in table["lag_error"], table
