"""``lakesink run`` as users run it: a separate process, stopped by signals, restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures.services import (
    config_dict,
    driver_java_options,
    full_only,
    duckdb_ids,
    lakesink_cmd,
    produce_events,
    run_cli,
    run_here,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]


def manifests(lake: Path) -> list[Path]:
    return list((lake / ".lakesink" / "events" / "manifests").glob("*/*.json"))


def test_until_caught_up_exits_0_with_every_record(kafka_broker, topic, tmp_path) -> None:
    produce_events(kafka_broker, topic, range(1500))
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake)
    data["logging"] = {"format": "json"}
    cfg = write_config(tmp_path / "c.yaml", data)
    result = run_cli("run", "-c", str(cfg), "--until-caught-up", env={"LOGLEVEL": "INFO"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(duckdb_ids(lake / "events")) == list(range(1500))
    assert '"written": 1500' in result.stderr
    # lakesink's own log lines are JSON objects; those of a batch name it and its table
    ours = [json.loads(line) for line in result.stderr.splitlines()
            if line.startswith('{"time"')]
    committed = [r for r in ours if "committed in" in r["message"]]
    assert committed and all(r["table"] == "events" and isinstance(r["batch_id"], int)
                             and r["level"] == "INFO" for r in committed)
    # the closing progress line: every record of the backlog counted at start
    assert any(r["message"].startswith("caught up: 1500 of 1500 records in ")
               for r in ours), [r["message"] for r in ours][-5:]


def test_sigterm_stops_after_the_batch_then_restart_is_exact(spark, kafka_broker, topic,
                                                             tmp_path) -> None:
    """SIGTERM mid-stream: the process ends the batch, exits 0; a restart (in this
    process) writes the rest, every id once."""
    n_first, n_total = 2400, 3000
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake)
    data["source"]["kafka"]["max_offsets_per_trigger"] = 400
    cfg = write_config(tmp_path / "c.yaml", data)
    produce_events(kafka_broker, topic, range(n_first))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKESINK_")}
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(lakesink_cmd("run", "-c", str(cfg)), stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while len(manifests(lake)) < 3:  # mid-stream: some batches are done, more to come
            assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no batches committed"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=180) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    output = (tmp_path / "run.log").read_text()
    assert "SIGTERM received" in output and "stopped" in output
    # a clean stop: a batch refused after the signal is no error (no ERROR, no trace)
    assert "ERROR" not in output and "Traceback" not in output, output[-3000:]
    print(output[-1500:])
    partial = duckdb_ids(lake / "events")
    assert len(partial) == len(set(partial)) and 0 < len(partial) <= n_first

    produce_events(kafka_broker, topic, range(n_first, n_total))
    run_here(spark, cfg)
    ids = duckdb_ids(lake / "events")
    assert len(ids) == n_total and sorted(ids) == list(range(n_total))


@pytest.mark.parametrize(("fmt", "storage", "source"),
                         [("parquet", "local", "kafka"),
                          full_only("delta", "local", "kafka", id="delta-local-kafka"),
                          ("delta", "s3", "kafka"),
                          # the remote lake's path is the S3 case's; Azure's settings
                          # are test_azure's
                          full_only("parquet", "azure", "kafka", id="parquet-azure-kafka"),
                          ("parquet", "local", "redis")])
def test_demo_command(tmp_path, fmt, storage, source) -> None:
    """The README's demo, small: its own broker (and S3 server), ingest, DuckDB summary,
    everything stopped. The Redis case keeps running (``--keep-running``): live events
    on top of the sample, the status page and /metrics served, until SIGINT."""
    keep = (fmt, source) == ("parquet", "redis")
    extra = ["--set", "table.compression=zstd"] if keep else []  # --set applies as for run
    args = ["demo", "--events", "3000", "--lake", str(tmp_path / "lake"),
            "--format", fmt, "--storage", storage, "--source", source, *extra]
    # the tests' JVM options, as a user's spark settings reach the demo's session
    # (speed only: the class-data archive, C1)
    env = {"LAKESINK_SPARK__CONF": json.dumps(driver_java_options())}
    result = _keep_running(args, env) if keep else run_cli(*args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    if extra:
        import duckdb

        codecs = duckdb.sql("SELECT DISTINCT compression FROM parquet_metadata("
                            f"'{tmp_path}/lake/sensors/**/*.parquet')").fetchall()
        assert codecs == [("ZSTD",)], codecs
    if storage != "local":  # the lake is in the store's server, nothing on local disk
        label, root = {"s3": ("S3", "s3"), "azure": ("Azure", "az")}[storage]
        assert f"DuckDB over {label}: {root}://lake/demo/sensors" in result.stdout
        assert not (tmp_path / "lake").exists()
    rows = 3000
    if keep:  # every live event too, once
        import re

        live = int(re.search(r"produced\s+([\d,]+) live events", result.stdout)[1]
                   .replace(",", ""))
        assert live > 0, result.stdout
        rows, distinct = (int(n.replace(",", "")) for n in re.search(
            r"rows ([\d,]+), distinct event ids ([\d,]+)", result.stdout).groups())
        # every row once; the live events the stream took before it stopped (those sent
        # after its last batch stay in the stream)
        assert rows == distinct and 3000 < rows <= 3000 + live, (rows, distinct, live)
    else:
        assert "rows 3,000, distinct event ids 3,000" in result.stdout
        # the sample in a few batches (the progress bar moves), not all in one
        import re

        batches = int(re.search(r"files in (\d+) batch", result.stdout)[1])
        assert batches >= 3, result.stdout
    assert "1 x malformed_json" in result.stdout  # the demo's deliberate bad record
    assert ("redis-server stopped" if source == "redis" else "broker stopped") in result.stdout
    if storage == "local":  # it leads somewhere: the config it ran, the next commands
        config = tmp_path / "lake" / "demo.yaml"
        assert f"lakesink status -c {config}" in result.stdout
        # the DuckDB line it suggests runs with what the set-up installed
        (read,) = [line.strip() for line in result.stdout.splitlines() if "import duckdb" in line]
        shown = subprocess.run(["bash", "-c", read], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "berlin" in shown.stdout, shown.stderr[-2000:]
        from typer.testing import CliRunner

        from lakesink.cli import app

        shown = CliRunner().invoke(app, ["status", "-c", str(config), "--json"])
        assert shown.exit_code == 0, shown.output
        (table,) = json.loads(shown.output)
        assert (table["rows"], table["format"]) == (rows if keep else 3000, fmt), table


def _keep_running(args: list[str], extra: dict[str, str]
                  ) -> subprocess.CompletedProcess[str]:
    """``lakesink demo --keep-running``: watched on its status page and /metrics until
    the stream has taken live events beyond the sample, then stopped with SIGINT."""
    import re
    import urllib.request

    from lakesink.local.services import free_port

    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LAKESINK_")},
           **extra}
    proc = subprocess.Popen(lakesink_cmd(*args, "--keep-running", "--set",
                                         f"metrics.port={port}"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    written, page = 0.0, ""
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and written < 3100 and proc.poll() is None:
            time.sleep(1)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    page = r.read().decode()
            except OSError:
                continue  # not serving yet
            found = re.findall(r'^lakesink_records_written_total\{table="sensors"\} (\S+)',
                               text, re.M)
            written = float(found[0]) if found else 0.0
        assert written >= 3100, f"written {written}"  # the sample and live events
        assert "sensors" in page
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def test_config_error_exit_2_before_spark(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("source:\n  kafka:\n    bootstrap_servers: h:1\n    topics: [t]\n"
                   "table:\n  format: orc\n")
    result = run_cli("run", "-c", str(cfg))
    assert result.returncode == 2
    assert "config error: table.format" in result.stderr
    assert result.stderr.strip().count("\n") <= 1, result.stderr  # one clear message
    assert "spark" not in result.stderr.lower()  # refused before the JVM started
