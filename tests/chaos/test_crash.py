"""Crash tests: SIGKILL the whole process at each fault point, restart, count every id.

Scale the loop with ``CHAOS_ROUNDS`` (default 1 round per point).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lakesink.faults import DELTA_POINTS, PARQUET_POINTS
from lakesink.runtime.services import produce
from tests.fixtures.services import (
    config_dict,
    produce_events,
    read_ids,
    run_cli,
    write_config,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]

ROUNDS = int(os.environ.get("CHAOS_ROUNDS", "1"))
N = 3000


CASES = [("parquet", p) for p in PARQUET_POINTS] + [("delta", p) for p in DELTA_POINTS]
BAD = [(b"k", b"not json %d" % i) for i in range(7)]


def crash_then_recover(kafka_broker, topic: str, tmp_path: Path, fmt: str, point: str
                       ) -> tuple[list[int], int]:
    """Returns the ids the table holds and the number of rejected rows."""
    lake = tmp_path / "lake"
    shutil.rmtree(lake, ignore_errors=True)
    data = config_dict(kafka_broker, topic, lake, format=fmt)
    data["source"]["kafka"]["max_offsets_per_trigger"] = 1000
    cfg = write_config(tmp_path / "c.yaml", data)
    crashed = run_cli("run", "-c", str(cfg), "--until-caught-up",
                      env={"LAKESINK_FAULT": point, "LAKESINK_FAULT_BATCH": "1"})
    assert crashed.returncode == -9, f"did not crash at {point}: {crashed.stderr[-2000:]}"
    assert f"fault injection: killing the process group at {point}" in crashed.stderr
    recovered = run_cli("run", "-c", str(cfg), "--until-caught-up")
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    import duckdb

    rejected = duckdb.sql(f"SELECT count(*) FROM read_parquet('{lake}/_rejected/events/*.parquet')"
                          ).fetchone()
    return read_ids(lake / "events", fmt), rejected[0] if rejected else 0


@pytest.mark.parametrize("round_", range(ROUNDS))
@pytest.mark.parametrize(("fmt", "point"), CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_kill_at_fault_point_then_restart(kafka_broker, topic, tmp_path, fmt, point, round_
                                          ) -> None:
    produce_events(kafka_broker, topic, range(N // 2))
    produce(kafka_broker.bootstrap_servers, topic, BAD)  # rejected rows must survive too
    produce_events(kafka_broker, topic, range(N // 2, N))
    ids, rejected = crash_then_recover(kafka_broker, topic, tmp_path, fmt, point)
    rows, distinct = len(ids), len(set(ids))
    print(f"crash-matrix point={point} format={fmt} restarts=1 produced={N} "
          f"lost={N - distinct} duplicated={rows - distinct} rejected={rejected}/{len(BAD)}")
    assert (rows, distinct) == (N, N), f"{point}: lost {N - distinct}, duplicated {rows - distinct}"
    assert sorted(ids) == list(range(N))
    assert rejected == len(BAD), "rejected records lost or duplicated"
