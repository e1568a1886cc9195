"""Storage outage: the S3 server stops in the middle of a streaming run and comes back;
the failed batches are retried (with backoff) and every record lands exactly once."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

import pytest

from lakesink.local.s3server import SeaweedS3
from tests.fixtures.services import (
    config_dict,
    duckdb_s3,
    lakesink_cmd,
    produce_events,
    write_config,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow,
              pytest.mark.s3]


def _ids(server: SeaweedS3, table: str) -> list[int]:
    try:
        con = duckdb_s3(server)  # keep it open while the result is read
        return [r[0] for r in con.sql(
            f"SELECT id FROM read_parquet('{table}/**/*.parquet')").fetchall()]
    except Exception:  # noqa: BLE001 - no files yet, or the server is down
        return []


def _wait(check: Any, timeout_s: float) -> bool:  # noqa: ANN401
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(1)
    return False


def test_s3_down_mid_run_then_back(kafka_broker, topic, tmp_path) -> None:
    import os

    with SeaweedS3(bucket="lake") as s3:
        data = config_dict(kafka_broker, topic, tmp_path / "unused")
        data["table"].pop("base_path")
        data["retry"] = {"initial_backoff_s": 2, "max_backoff_s": 8}
        # the outage outlasts the writer lease's TTL: renewals fail meanwhile, and the
        # first check after it must renew, not declare the lease lost
        data["table"]["writer_lease_s"] = 12
        cfg = write_config(tmp_path / "c.yaml", data)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("LAKESINK_")},
               **s3.env(), "S3_BUCKET": "lake", "S3_PREFIX": "outage",
               # fail fast inside S3A so lakesink's own retry is what rides out the outage
               "LAKESINK_STORAGE__S3__OPTIONS": '{"retry.limit": "1", "attempts.maximum": "1"}'}
        table = "s3://lake/outage/events"
        produce_events(kafka_broker, topic, range(0, 1000))
        # the log goes to a file, not a pipe: an outage logs many stack traces, and a
        # pipe nobody reads fills up and blocks the run's next log line (CI, stop 25)
        log = tmp_path / "run.log"
        with log.open("w") as out:
            proc = subprocess.Popen(lakesink_cmd("run", "-c", str(cfg)), env=env, text=True,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            assert _wait(lambda: len(_ids(s3, table)) >= 1000, 240), (
                f"timed out waiting for the first records on S3:\n{log.read_text()[-4000:]}")
            s3.stop(keep_data=True)
            produce_events(kafka_broker, topic, range(1000, 2000))
            time.sleep(10)  # batches fail and back off meanwhile
            if proc.poll() is not None:
                raise AssertionError("the run stopped during the outage:\n"
                                     + log.read_text()[-4000:])
            s3.start()
            produce_events(kafka_broker, topic, range(2000, 3000))
            waited = _wait(lambda: len(_ids(s3, table)) >= 3000, 300)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        stderr = log.read_text()
        assert waited, f"timed out waiting for every record; the run's log:\n{stderr[-6000:]}"
        ids = _ids(s3, table)
        print(f"outage backend=s3 down=10s produced=3000 lost={3000 - len(set(ids))} "
              f"duplicated={len(ids) - len(set(ids))}")
        assert proc.returncode == 0, stderr[-3000:]
        assert "retrying in" in stderr or "restarting from the checkpoint" in stderr, (
            "nothing failed during the outage")
        assert sorted(ids) == list(range(3000))
        assert s3.secret_key not in stderr
