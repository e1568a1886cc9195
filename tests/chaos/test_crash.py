"""Crash tests: SIGKILL the whole process at each fault point, restart, count every id.

Scale the loop with ``CHAOS_ROUNDS`` (default 1 round per point).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lakesink.faults import POINTS
from tests.fixtures.services import config_dict, duckdb_ids, produce_events, run_cli, write_config

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]

ROUNDS = int(os.environ.get("CHAOS_ROUNDS", "1"))
N = 3000


def crash_then_recover(kafka_broker, topic: str, tmp_path: Path, point: str) -> tuple[int, int]:
    lake = tmp_path / "lake"
    shutil.rmtree(lake, ignore_errors=True)
    data = config_dict(kafka_broker, topic, lake)
    data["source"]["kafka"]["max_offsets_per_trigger"] = 1000
    cfg = write_config(tmp_path / "c.yaml", data)
    crashed = run_cli("run", "-c", str(cfg), "--until-caught-up",
                      env={"LAKESINK_FAULT": point, "LAKESINK_FAULT_BATCH": "1"})
    assert crashed.returncode == -9, f"did not crash at {point}: {crashed.stderr[-2000:]}"
    assert f"fault injection: killing the process group at {point}" in crashed.stderr
    recovered = run_cli("run", "-c", str(cfg), "--until-caught-up")
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    ids = duckdb_ids(lake / "events")
    return len(ids), len(set(ids))


@pytest.mark.parametrize("round_", range(ROUNDS))
@pytest.mark.parametrize("point", POINTS)
def test_kill_at_fault_point_then_restart(kafka_broker, topic, tmp_path, point, round_) -> None:
    produce_events(kafka_broker, topic, range(N))
    rows, distinct = crash_then_recover(kafka_broker, topic, tmp_path, point)
    assert (rows, distinct) == (N, N), f"{point}: lost {N - distinct}, duplicated {rows - distinct}"
