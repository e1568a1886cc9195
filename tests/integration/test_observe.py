"""``metrics.port``: Prometheus /metrics, /healthz and /readyz served by a streaming
run, scraped over HTTP while it ingests (a real broker, the shared SparkSession)."""

from __future__ import annotations

import time
from collections.abc import Callable
import urllib.error
import urllib.request

import pytest

from lakesink.local.services import free_port, produce
from tests.fixtures.runs import Streaming
from tests.fixtures.services import config_dict, json_events

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:  # not listening (yet)
        return 0, ""


def _value(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# planted secrets: credentials the run is given (S3 keys for a store it does not use
# here) must not show in any output this feature adds
PLANTED = {"LAKESINK_STORAGE__S3__ACCESS_KEY_ID": "AKIAPLANTEDMARKER1",
           "LAKESINK_STORAGE__S3__SECRET_ACCESS_KEY": "planted-secret-marker-2"}


def test_a_streaming_run_serves_metrics_and_probes(spark, kafka_broker, topic, tmp_path,
                                                   caplog) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    data = config_dict(kafka_broker, topic, tmp_path / "lake", partition_by=[])
    data["trigger"] = {"interval": "1 second"}
    data["metrics"] = {"port": port, "host": "127.0.0.1"}
    table = 'table="events"'
    from prometheus_client import generate_latest

    from lakesink.observe import METRICS

    # the counters are the process's, and other tests write tables named events too
    start = generate_latest(METRICS.registry).decode()

    def grew(text: str, name: str) -> float:
        return _value(text, name) - _value(start, name)

    produce(kafka_broker.bootstrap_servers, topic,
            json_events(range(50)) + [(b"k", b"not json"), (b"k", b"[1]")])
    caplog.set_level("INFO")
    run = Streaming(spark, data, env=PLANTED)
    try:
        deadline = time.monotonic() + 120
        status, text = 0, ""
        while time.monotonic() < deadline:
            status, _ = _get(f"{base}/readyz")
            text = _get(f"{base}/metrics")[1]
            if status == 200 and grew(text, f"lakesink_records_written_total{{{table}}}") >= 50:
                break
            time.sleep(0.5)
        assert status == 200, _get(f"{base}/readyz")
        assert _get(f"{base}/healthz") == (200, "ok\n")
        assert grew(text, f"lakesink_records_written_total{{{table}}}") == 50
        assert grew(text, f"lakesink_records_read_total{{{table}}}") == 52
        assert grew(text, 'lakesink_records_rejected_total{reason="malformed_json",'
                          f'{table}}}') == 1
        assert grew(text, 'lakesink_records_rejected_total{reason="not_an_object",'
                          f'{table}}}') == 1
        assert _value(text, "lakesink_query_active") == 1
        assert grew(text, f"lakesink_files_written_total{{{table}}}") >= 1
        assert grew(text, 'lakesink_batch_phase_seconds_count{phase="write",'
                          f'{table}}}') >= 1
        assert grew(text, 'lakesink_batch_phase_seconds_count{phase="dead_letters",'
                          f'{table}}}') == 1  # the one batch with dead letters
        # caught up: the next progress report says no record is left behind
        deadline = time.monotonic() + 30
        lag = None
        while time.monotonic() < deadline:
            text = _get(f"{base}/metrics")[1]
            lag = _value(text, f'lakesink_consumer_lag_records{{partition="0",topic="{topic}"}}')
            if f'topic="{topic}"' in text and lag == 0:
                break
            time.sleep(0.5)
        assert f'topic="{topic}"' in text and lag == 0
        produce(kafka_broker.bootstrap_servers, topic, json_events(range(50, 80)))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = _get(f"{base}/metrics")[1]
            if grew(text, f"lakesink_records_written_total{{{table}}}") >= 80:
                break
            time.sleep(0.5)
        assert grew(text, f"lakesink_records_written_total{{{table}}}") == 80
        assert _get(f"{base}/nope")[0] == 404
        page = _status_page_in_chromium(f"{base}/", tmp_path)
        outputs = {"/metrics": text, "/": page, "/readyz": _get(f"{base}/readyz")[1],
                   "logs": caplog.text}
        for where, output in outputs.items():
            for marker in PLANTED.values():
                assert marker not in output, f"a planted secret in {where}"
    finally:
        run.close()
    with pytest.raises(OSError):  # the endpoints end with the run
        urllib.request.urlopen(f"{base}/healthz", timeout=2)


def test_opentelemetry_export_to_a_collector(spark, kafka_broker, topic, tmp_path,
                                             monkeypatch) -> None:
    """OTLP/HTTP to a collector double (no collector binary runs here): a span per
    batch with its phases and counts, and the metrics with the run's exact values."""
    from tests.fixtures.otlp_collector import OtlpCollectorDouble

    collector = OtlpCollectorDouble()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "lakesink-test")
    try:
        produce(kafka_broker.bootstrap_servers, topic,
                json_events(range(40)) + [(b"k", b"not json")])
        data = config_dict(kafka_broker, topic, tmp_path / "lake", partition_by=[],
                           name="otel_events")
        data["telemetry"] = {"otlp_endpoint": collector.url, "export_interval_s": 1}
        for name, value in PLANTED.items():
            monkeypatch.setenv(name, value)
        from lakesink.app import Pipeline
        from lakesink.config.loader import load_config
        from tests.fixtures.runs import flatten

        cfg = load_config(flags=flatten(data))  # the environment, with the planted secrets
        assert cfg.storage.s3.secret_access_key.get_secret_value() == PLANTED[
            "LAKESINK_STORAGE__S3__SECRET_ACCESS_KEY"]
        stats = Pipeline.build(cfg, spark).run(until_caught_up=True)  # flushes at its end
        assert (stats.written, stats.rejected) == (40, 1)
        spans = collector.spans()
        batches = [s for s in spans if s.name == "lakesink.batch"]
        assert batches and collector.services() == {"lakesink-test"}
        attrs = [{a.key: (a.value.string_value or a.value.int_value) for a in s.attributes}
                 for s in batches]
        assert {a["lakesink.table"] for a in attrs} == {"otel_events"}
        assert sum(a.get("lakesink.written", 0) for a in attrs) == 40
        assert sum(a.get("lakesink.rejected", 0) for a in attrs) == 1
        children = {s.name for s in spans if s.parent_span_id in
                    {b.span_id for b in batches}}
        assert {"write", "dead_letters"} <= children, children
        written = collector.last_values("lakesink_records_written")
        assert written[(("table", "otel_events"),)] == 40
        assert collector.last_values("lakesink_records_read")[
            (("table", "otel_events"),)] == 41
        rejected = collector.last_values("lakesink_records_rejected")
        assert rejected[(("reason", "malformed_json"), ("table", "otel_events"))] == 1
        exported = b"".join(r.SerializeToString() for r in collector.traces + collector.metrics)
        for marker in PLANTED.values():
            assert marker.encode() not in exported
    finally:
        collector.stop()


def _status_page_in_chromium(url: str, tmp_path) -> str:  # noqa: ANN001
    """The status page rendered by a real headless Chromium (Debian's
    chromium-headless-shell, installed by scripts/setup.sh): its DOM holds the table,
    the chart and the dead-letter reasons, and a screenshot is taken
    (``SCREENSHOT_TO`` copies it out, for the docs; not a ``LAKESINK_`` name, which
    every command would read as configuration)."""
    import os
    import shutil
    import subprocess

    status, page = _get(url)
    assert status == 200 and "<svg" in page and "events" in page
    chromium = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    assert chromium, "no Chromium: scripts/setup.sh installs chromium-headless-shell"
    args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run([*args, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120).stdout
    assert "<h2>events</h2>" in dom and "<svg" in dom and "malformed_json" in dom, dom[:2000]
    shot = tmp_path / "status-page.png"
    subprocess.run([*args, f"--screenshot={shot}", "--window-size=900,760", url],
                   capture_output=True, timeout=120)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
    if os.environ.get("SCREENSHOT_TO"):
        shutil.copy(shot, os.environ["SCREENSHOT_TO"])
    return dom


def test_readiness_falls_while_the_broker_is_down_and_rises_after(spark, tmp_path) -> None:
    """known-open T10: a streaming run whose broker stops is not ready once no batch
    nor idle report came for ``metrics.ready_batch_age_s``, and ready again when the
    broker is back; the records sent around the outage are all written, once. Its own
    broker (the shared one must not stop)."""
    from lakesink.local.services import KafkaBroker
    from tests.fixtures.services import duckdb_ids

    with KafkaBroker(heap="256m") as broker:
        topic = "outage"
        broker.create_topic(topic)
        produce(broker.bootstrap_servers, topic, json_events(range(20)))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        lake = tmp_path / "lake"
        data = config_dict(broker, topic, lake, partition_by=[], name="outage")
        data["trigger"] = {"interval": "1 second"}
        data["metrics"] = {"port": port, "host": "127.0.0.1", "ready_batch_age_s": 6}

        def wait(what: str, done: Callable[[], bool], limit_s: float) -> None:
            deadline = time.monotonic() + limit_s
            while time.monotonic() < deadline:
                if done():
                    return
                time.sleep(0.5)
            raise AssertionError(f"{what}: not within {limit_s:.0f} s; /readyz "
                                 f"{_get(f'{base}/readyz')}")

        run = Streaming(spark, data)
        try:
            wait("ready with 20 rows", lambda: _get(f"{base}/readyz")[0] == 200
                 and len(duckdb_ids(lake / "outage")) == 20, 120)
            broker.halt()
            wait("not ready while the broker is down",
                 lambda: _get(f"{base}/readyz")[0] == 503, 90)
            status, why = _get(f"{base}/readyz")
            assert "no batch or idle report" in why or "not running" in why, why
            assert _get(f"{base}/healthz")[0] == 200  # alive: a restart would not help
            broker.resume()
            produce(broker.bootstrap_servers, topic, json_events(range(20, 30)))
            wait("ready again with 30 rows", lambda: _get(f"{base}/readyz")[0] == 200
                 and len(duckdb_ids(lake / "outage")) == 30, 180)
            assert sorted(duckdb_ids(lake / "outage")) == list(range(30))
        finally:
            broker.resume()  # a stop needs the broker (the last batch's offsets)
            run.close()
