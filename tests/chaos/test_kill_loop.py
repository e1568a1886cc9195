"""Random kills: a publisher keeps producing good and bad records while ``lakesink run``
is SIGKILLed at random moments (not only at named fault points), several times; then a
run catches up. Every good record must be in the table once, every bad one in the dead
letters once.

Seeded: ``CHAOS_SEED`` replays a failure (the seed is printed and in every assertion);
``CHAOS_KILLS`` sets the kills per format (default 2); CI runs the Parquet round, the
Delta round runs with ``CHAOS_FULL=1`` (its kill points run once each in test_crash.py).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import duckdb
import pytest

from lakesink.local.services import produce
from tests.fixtures.services import (
    config_dict,
    full_only,
    json_events,
    lakesink_cmd,
    read_ids,
    run_cli,
    write_config,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]

KILLS = int(os.environ.get("CHAOS_KILLS", "2"))
CHUNK = 200  # records per publish
BAD_EVERY = 50  # one record in 50 is not JSON


def _publish(bootstrap: str, topic: str, rng: random.Random, stop: threading.Event,
             sent: dict[str, list[int]]) -> None:
    """Chunks of good records (unique ids) with bad ones among them, until ``stop``."""
    next_id = 0
    while not stop.is_set():
        records = []
        for i in range(next_id, next_id + CHUNK):
            if i % BAD_EVERY == 7:
                records.append((b"bad", b"not json %d" % i))
                sent["bad"].append(i)
            else:
                records.extend(json_events(range(i, i + 1)))
                sent["good"].append(i)
        produce(bootstrap, topic, records)
        next_id += CHUNK
        stop.wait(rng.uniform(0.2, 1.0))


def _bad_ids(lake: Path) -> list[int]:
    files = list((lake / "_rejected" / "events").glob("*.parquet"))
    if not files:
        return []
    rows = duckdb.sql(f"SELECT value FROM read_parquet('{lake}/_rejected/events/*.parquet')"
                      ).fetchall()
    return [int(bytes(r[0]).split()[-1]) for r in rows]


# Delta's kill points run once each in test_crash.py; its random round is a repeat
# CI runs random kills while publishing in test_operators_day.py (with maintenance and a
# catalog beside them); this plain round repeats them
@pytest.mark.parametrize("fmt", [full_only("parquet", id="parquet"),
                                 full_only("delta", id="delta")])
def test_random_kills_while_publishing(kafka_broker, topic, tmp_path, fmt) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"kill loop: CHAOS_SEED={seed} format={fmt} kills={KILLS}")
    rng = random.Random(seed)
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format=fmt)
    data["source"]["kafka"]["max_offsets_per_trigger"] = 400
    data["trigger"] = {"interval": "500 ms"}
    cfg = write_config(tmp_path / "c.yaml", data)

    sent: dict[str, list[int]] = {"good": [], "bad": []}
    stop = threading.Event()
    publisher = threading.Thread(target=_publish, daemon=True,
                                 args=(kafka_broker.bootstrap_servers, topic, rng, stop, sent))
    publisher.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKESINK_")}
    kills = []
    try:
        for _ in range(KILLS):
            log = tmp_path / f"run-{len(kills)}.log"  # a file: a full pipe would block it
            with log.open("w") as out:
                run = subprocess.Popen(lakesink_cmd("run", "-c", str(cfg)), env=env,
                                       stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            after = rng.uniform(6.0, 20.0)  # start-up is ~6 s: kills land in batches
            time.sleep(after)
            if run.poll() is not None:
                pytest.fail(f"seed {seed}: lakesink ended by itself: {log.read_text()[-2000:]}")
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()  # reaped: its pid is gone, so the restart takes its lease at once
            kills.append(round(after, 1))
    finally:
        stop.set()
        publisher.join(30)
    done = run_cli("run", "-c", str(cfg), "--until-caught-up")
    assert done.returncode == 0, f"seed {seed}: {done.stderr[-3000:]}"

    ids = read_ids(lake / "events", fmt)
    good = sent["good"]
    where = f"seed {seed}, kills after {kills} s"
    print(f"kill loop: {where}: produced {len(good)} good + {len(sent['bad'])} bad, "
          f"read {len(ids)} rows ({len(set(ids))} distinct)")
    assert len(ids) == len(set(ids)), f"{where}: {len(ids) - len(set(ids))} row(s) twice"
    assert sorted(ids) == sorted(good), f"{where}: {len(set(good) - set(ids))} row(s) lost"
    bad = _bad_ids(lake)
    assert sorted(bad) == sorted(sent["bad"]), (
        f"{where}: dead letters {len(bad)} for {len(sent['bad'])} bad records "
        f"({len(bad) - len(set(bad))} twice, {len(set(sent['bad']) - set(bad))} lost)")
