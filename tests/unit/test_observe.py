"""Metrics and health rules, without Spark or a network."""

from __future__ import annotations

import time

from prometheus_client import generate_latest

from lakesink.observe.health import Health, interval_seconds
from lakesink.observe.metrics import Metrics
from lakesink.sources.offsets import log_sources, lag


def test_lag_per_topic_partition_from_kafka_progress() -> None:
    end = '{"events": {"0": 40, "1": 7}, "other": {"0": 5}}'
    latest = '{"events": {"0": 100, "1": 7}, "other": {"0": 5}}'
    assert lag(end, latest) == {("events", "0"): 60, ("events", "1"): 0, ("other", "0"): 0}
    assert lag(None, latest) == {}  # no batch yet
    assert lag('{"events": {"0": 1}}', '{"events": {"0": "x", "p": 9}}') == {}


def test_lag_of_redis_streams_lists_and_danube() -> None:
    # a stream: entries added up to its end minus up to the batch's end
    end = {"s": {"id": "5-0", "n": 40, "d": "0-0"}, "gone": {"id": "1-0", "n": -1, "d": "1-0"}}
    latest = {"s": {"id": "9-0", "n": 52, "d": "0-0"}, "gone": {"id": "2-0", "n": 9, "d": "0-0"}}
    assert lag(end, latest) == {("s", ""): 12}, "an unknown count is left out"
    # a list (and Danube's spool): what is still waiting, whatever the batch number
    assert lag('{"jobs": 7, "q": 2}', '{"jobs": {"waiting": 30}, "q": {"waiting": 0}}') \
        == {("jobs", ""): 30, ("q", ""): 0}
    assert lag(None, {"jobs": {"waiting": 3}}) == {("jobs", ""): 3}, "before a batch too"


def test_the_offset_log_is_parsed_once_for_every_reader() -> None:
    text = 'v1\n{"batchWatermarkMs":0}\n{"t": {"0": 5}}\n-\n{"s": {"id": "1-0", "n": 1}}'
    assert log_sources(text) == [{"t": {"0": 5}}, {"s": {"id": "1-0", "n": 1}}]
    assert log_sources("") == [] and log_sources(None) == []
    assert log_sources('v2\n{}\n{"t": 1}') is None, "a format lakesink does not read"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_readiness_follows_the_query() -> None:
    clock = Clock()
    health = Health(max_age_s=60, restarts=2, clock=clock)
    assert health.ready() == (False, "starting: the ingestion query is not running yet")
    health.started()
    assert health.ready()[0]
    clock.now += 61
    ready, why = health.ready()
    assert not ready and why == "no batch or idle report for 61 s (limit 60 s)"
    health.progressed()
    assert health.ready()[0]
    health.failed(1)  # a restart: not running until it starts again
    assert not health.ready()[0]
    health.started()
    assert health.ready()[0]
    health.failed(2)
    health.started()
    assert health.ready() == (False, "the query failed 2 time(s) in a row without a "
                                     "committed batch")
    health.committed()
    assert health.ready()[0]
    health.stopped()
    assert health.ready() == (False, "the ingestion query is not running")
    assert interval_seconds("500 milliseconds") == 0.5
    assert interval_seconds("2 minutes") == 120


def test_the_probes_answer_from_the_start_before_spark(tmp_path) -> None:
    """``run`` serves the endpoints before it starts Spark (item 9 of issue 41):
    /healthz answers, /readyz says "starting"; the run's Observer takes them over."""
    import urllib.error
    import urllib.request

    import yaml

    from lakesink.config import load_config
    from lakesink.config.plan import plan
    from lakesink.observe import Observer

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "source": {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topics": ["t"]}},
        "table": {"base_path": str(tmp_path)},
        "metrics": {"port": 0, "host": "127.0.0.1"}}))
    early = Observer.early(plan(load_config(path, env={})))
    assert early.server is not None
    base = f"http://127.0.0.1:{early.server.port}"
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as r:
            assert (r.status, r.read()) == (200, b"ok\n")
        try:
            urllib.request.urlopen(f"{base}/readyz", timeout=5)
            raise AssertionError("/readyz answered 200 before the query ran")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and b"starting" in exc.read()
    finally:
        early.stop()


def test_a_committed_batch_counts_in_every_metric() -> None:
    metrics = Metrics()
    metrics.committed("events", records=10, written=7, rejected={"malformed_json": 3},
                      unknown_dropped=1, files=2, size=2048, seconds=1.5, schema_changes=1,
                      pending=4)
    metrics.progress([('{"t": {"0": 5}}', '{"t": {"0": 9}}')])
    text = generate_latest(metrics.registry).decode()
    for line in ('lakesink_records_read_total{table="events"} 10.0',
                 'lakesink_records_written_total{table="events"} 7.0',
                 'lakesink_records_rejected_total{reason="malformed_json",table="events"} 3.0',
                 'lakesink_files_written_total{table="events"} 2.0',
                 'lakesink_bytes_written_total{table="events"} 2048.0',
                 'lakesink_batch_duration_seconds_count{table="events"} 1.0',
                 'lakesink_catalog_pending_batches{table="events"} 4.0',
                 'lakesink_consumer_lag_records{partition="0",topic="t"} 4.0'):
        assert line in text, line


def test_the_status_page_lists_the_lag_of_sources_without_partition_numbers() -> None:
    """A Redis stream's (or list's, or Danube topic's) lag has no partition number: the
    page failed on it (int('')) for every request of a Redis run — found by the demo's
    --keep-running test."""
    from lakesink.observe.page import render

    metrics = Metrics()
    metrics.lag.labels("sensors", "").set(12)
    metrics.lag.labels("events", "10").set(3)
    metrics.lag.labels("events", "2").set(1)
    page = render(metrics, Health(max_age_s=60, restarts=3))
    rows = page.split("<th>records behind</th></tr>")[1].split("</table>")[0]
    assert rows.index(">10<") > rows.index(">2<")  # Kafka partitions by number
    assert "<td>sensors</td><td></td><td>12</td>" in rows


def test_the_status_page_shows_mean_file_size_and_a_hint_for_small_files() -> None:
    from lakesink.observe.page import render

    metrics = Metrics()
    for batch in range(5):  # 5 x 8 files of 4 KiB: 40 small files
        metrics.committed("events", records=80, written=80, rejected={}, unknown_dropped=0,
                          files=8, size=8 * 4096, seconds=1.0, schema_changes=0, pending=None,
                          batch_id=batch)
    metrics.committed("big", records=80, written=80, rejected={}, unknown_dropped=0,
                      files=1, size=64 << 20, seconds=1.0, schema_changes=0, pending=None,
                      batch_id=0)
    page = render(metrics, Health(max_age_s=60, restarts=3))
    assert "<th>mean file</th>" in page and "<td>4 KiB</td>" in page
    cards = {c.split("</h2>")[0]: c for c in page.split("<div class='card'><h2>")[1:]}
    assert "40 files of 4 KiB on average" in cards["events"]
    assert "lakesink compact" in cards["events"]
    assert "files of" not in cards["big"]  # one 64 MiB file: no hint


def test_the_grafana_dashboard_uses_only_metrics_that_exist() -> None:
    import json
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).parents[2] / "docs" /
                            "grafana-dashboard.json").read_text())
    names = set()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                "gauge": [""]}
    for metric in Metrics().registry.collect():
        names |= {metric.name + s for s in suffixes[metric.type]}
    used = {m for p in dashboard["panels"] for t in p["targets"]
            for m in re.findall(r"lakesink_[a-z_]+", t["expr"])}
    assert used and used <= names, used - names


def test_log_lines_json_with_the_batch_context_and_no_url_password() -> None:
    import io
    import json
    import logging

    from lakesink.observe.logs import (
        JsonFormatter,
        TextFormatter,
        level_name,
        log_context,
    )

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("lakesink.test_logs")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        with log_context(table="events", batch_id=7):
            log.info("wrote %d rows to %s", 5, "s3a://ak:hunter2@bucket/x")
        log.warning("outside")
    finally:
        log.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "wrote 5 rows to s3a://ak:**********@bucket/x"
    assert (first["table"], first["batch_id"], first["level"]) == ("events", 7, "INFO")
    assert "table" not in second and second["message"] == "outside"
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    with log_context(table="t", batch_id=1):
        assert "[table=t batch_id=1]: m" in TextFormatter().format(record)
    assert level_name(None, None, {"LOGLEVEL": "debug"}) == "DEBUG"
    assert level_name(None, None, {"LOG_LEVEL": "warn", "LOGLEVEL": "debug"}) == "WARNING"
    assert level_name(None, "ERROR", {"LOG_LEVEL": "DEBUG"}) == "ERROR"
    assert level_name("INFO", "ERROR", {}) == "INFO"


def test_progress_line_and_start_offsets() -> None:
    from lakesink.observe.progress import CatchUpProgress, _start

    done = [0]
    progress = CatchUpProgress(1000, lambda: done[0], interactive=False)
    progress.started -= 10  # ten seconds in
    done[0] = 250
    assert progress.line() == "250 of 1000 records (25%), 25 records/s, ETA 30s"
    assert CatchUpProgress(None, lambda: 5, interactive=False).line().startswith(
        "5 records, ")
    # where a partition starts: the checkpoint, else starting_offsets (JSON, then the word)
    assert _start({"t": {"0": 40}}, {}, "earliest", "t", 0, 10, 90) == 40
    assert _start({"t": {"0": 40}}, {}, "earliest", "t", 1, 10, 90) == 10  # a new partition
    assert _start(None, {"t": {"0": -1}}, "earliest", "t", 0, 10, 90) == 90
    assert _start(None, {"t": {"0": 55}}, "earliest", "t", 0, 10, 90) == 55
    assert _start(None, {}, "latest", "t", 0, 10, 90) == 90


def test_silence_metrics() -> None:
    metrics = Metrics()
    metrics.silence_batch(fired=2, swept=1, tracked=40, callback_failures=1)
    metrics.silence_batch(fired=1, swept=0, tracked=38, callback_failures=3)
    text = generate_latest(metrics.registry).decode()
    for line in ("lakesink_silence_fired_total 3.0", "lakesink_silence_swept_total 1.0",
                 "lakesink_silence_keys_tracked 38.0",
                 "lakesink_silence_callback_failures_total 3.0"):
        assert line in text, line


def test_the_status_page_shows_totals_the_run_and_a_chart_scaled_to_the_uptime() -> None:
    """Issue 41 item 10: totals per table (rows, rows/s, files, mean file size, time since
    the last commit), the run's source and tables, thousands separators, the lag's total,
    and a chart of the minutes since the start (not always 60)."""
    import re

    from lakesink.observe.page import render

    metrics = Metrics()
    metrics.started = time.time() - 10 * 60 - 5  # up for ten minutes
    metrics.describe("kafka 127.0.0.1:9092 ['events']", "s3a://u:hunter2@lake/events")
    for batch in range(2):
        metrics.committed("events", records=12_346, written=12_345, rejected={"x": 1},
                          unknown_dropped=0, files=3, size=3 * (5 << 20), seconds=2.0,
                          schema_changes=0, pending=None, batch_id=batch)
    metrics.lag.labels("events", "0").set(1500)
    metrics.lag.labels("events", "1").set(700)
    page = render(metrics, Health(max_age_s=60, restarts=3))
    assert "kafka 127.0.0.1:9092 [&#x27;events&#x27;] &rarr; s3a://u:**********@lake/events" \
        in page and "hunter2" not in page
    totals = re.sub(r"<[^>]+>", " ", page.split("<div class='totals'>")[1].split("<svg")[0])
    words = " ".join(totals.split())
    assert "24,690 rows" in words and "6 files" in words and "5.0 MiB mean file" in words
    assert re.search(r"\b(8[0-9]|9[0-9]|1[0-9]{2}) rows/s", words), words  # 24,690 in <= 5 min
    assert re.search(r"\b[0-2] s ago last commit", words), words
    assert "<td>12,345</td>" in page
    chart = page.split("<svg")[1].split("</svg>")[0]
    assert chart.count("<rect") in (11, 12) and 'width="100%"' in page  # the minutes up
    assert "-11 min" in page or "-12 min" in page
    metrics.started = time.time() - 90  # up for a minute and a half: ten minutes shown
    page = render(metrics, Health(max_age_s=60, restarts=3))
    assert page.split("<svg")[1].split("</svg>")[0].count("<rect") == 10
    assert "<b>2,200</b> <span>records behind in all</span>" in page
