"""A graceful stop under load: batches run back to back (data keeps coming, each batch
takes longer than the trigger interval) and the stop must still happen — after the
batch in flight, not when the topic runs dry — and a restart must land every record
exactly once. The silence query runs beside it (its heartbeat gives it a batch at every
trigger, so it is always busy too)."""

from __future__ import annotations

import threading
import time

import pytest

from lakesink.local.services import produce
from tests.fixtures.runs import Streaming
from tests.fixtures.services import config_dict, duckdb_ids, json_events
from tests.integration.test_ingest import run_once

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def test_stop_while_batches_run_back_to_back_then_restart_is_exact(spark, kafka_broker,
                                                                  topic, tmp_path) -> None:
    data = config_dict(kafka_broker, topic, tmp_path / "lake", partition_by=[])
    data["trigger"] = {"interval": "100 ms"}
    data["silence"] = {"timeout_ms": 3_600_000, "trigger_interval": "100 ms",
                       "table": "silence_events"}
    produced = 0
    done = threading.Event()

    def publish() -> None:  # a steady stream: every batch finds new records
        nonlocal produced
        while not done.is_set():
            produced += produce(kafka_broker.bootstrap_servers, topic,
                                json_events(range(produced, produced + 200)))
            done.wait(0.05)

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    run = Streaming(spark, data)
    try:
        deadline = time.monotonic() + 120
        while run.pipeline.stats.batches < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert run.pipeline.stats.batches >= 3, "the run did not get going"
        silence = run.pipeline.silence
        run.stop_request.event.set()  # what SIGTERM does
        asked = time.monotonic()
        at_request = run.pipeline.stats.batches, silence.stats.batches
        stopped = run.stop(wait_s=120)  # the publisher keeps going meanwhile
        after = run.pipeline.stats.batches, silence.stats.batches
        print(f"\nstopped {time.monotonic() - asked:.1f} s after the request; batches "
              f"(ingestion, silence) at the request {at_request}, after {after}; "
              f"{produced} records produced so far")
        assert stopped, "no stop within 120 s while records kept coming"
        assert run.error is None, run.error
        # only the batches in flight at the request finished; no batch started after it
        assert after[0] - at_request[0] <= 1 and after[1] - at_request[1] <= 1
    finally:
        done.set()
        publisher.join(30)
        run.stop()
    # what the stopped run had not taken, a caught-up run takes; nothing twice
    run_once(spark, data)
    assert sorted(duckdb_ids(tmp_path / "lake" / "events")) == list(range(produced))
