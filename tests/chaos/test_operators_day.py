"""An operator's day (issue 40 item 4): a live ``lakesink run`` with a publisher sending
good and bad records, SIGKILLed at random moments and restarted, while a "cron" loop
beside it runs ``status``, ``compact``, ``repair``, ``vacuum`` and ``dlq replay`` again and
again — as ``docs/maintenance.md`` allows. At the end every good record is in the table
once, every bad one is a pending dead letter once, ``repair`` finds nothing, and readers
nobody here wrote agree: DuckDB's glob (Parquet), Spark SQL through the Hive metastore by
table name, delta-rs and DuckDB's own ``delta`` extension (Delta), pyiceberg by table
name and DuckDB's ``iceberg`` extension (Iceberg). Every maintenance run ends with exit
0, or with one line saying why.

CI runs the Parquet + Hive day (one short round: ``CHAOS_KILLS`` kills, default 2);
``CHAOS_FULL=1`` adds Delta + Hive and Parquet + an Iceberg SQL catalog. Seeded like the
kill loop (``CHAOS_SEED``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.test_kill_loop import KILLS, _publish
from tests.fixtures import hive_client
from tests.fixtures.services import (
    config_dict,
    full_only,
    lakesink_cmd,
    read_ids,
    run_cli,
    write_config,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]

#: the cron loop's commands, in its order (each a process of its own, as cron runs them)
CRON = [["status"], ["compact"], ["repair"], ["vacuum"], ["dlq", "replay"]]


class Cron(threading.Thread):
    """Runs :data:`CRON` over and over until stopped (the command running finishes)."""

    def __init__(self, cfg: Path, env: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.cfg, self.env = cfg, env
        self.stop = threading.Event()
        self.runs: list[dict[str, Any]] = []

    @property
    def cycles(self) -> int:
        return sum(1 for r in self.runs if r["cmd"] == CRON[-1])

    def run(self) -> None:
        while not self.stop.is_set():
            for cmd in CRON:
                if self.stop.is_set():
                    return
                done = subprocess.run(lakesink_cmd(*cmd, "-c", str(self.cfg)), env=self.env,
                                      capture_output=True, text=True, timeout=300,
                                      start_new_session=True)
                self.runs.append({"cmd": cmd, "rc": done.returncode,
                                  "stdout": done.stdout[-3000:], "stderr": done.stderr[-3000:]})


def _said_why(run: dict[str, Any]) -> bool:
    """Exit 0; or a refusal in one line (exit 2: ``config error: …``; exit 1: ``error:
    …``), or ``repair``'s report of what a live table shows for a moment (exit 1)."""
    if run["rc"] == 0:
        return True
    errors = [line for line in run["stderr"].splitlines()
              if line.startswith(("config error:", "error:"))]
    if run["rc"] in (1, 2) and len(errors) == 1 and "Traceback" not in run["stderr"]:
        return True
    return run["cmd"] == ["repair"] and run["rc"] == 1 and "Traceback" not in run["stderr"]


def _pending_bad(spec: Any) -> list[int]:
    """The bad records' ids among the pending dead letters (read without Spark)."""
    from lakesink import dlq

    letters = dlq.reader(None, spec)
    assert letters is not None
    pending = letters.pending()
    if not pending:
        return []
    values = letters._dataset(pending).to_table(columns=["value"]).column("value")
    return [int(bytes(v).split()[-1]) for v in values.to_pylist()]


def _duckdb(*extensions: str) -> Any:  # noqa: ANN401 - a duckdb connection
    """DuckDB with its own extensions from their PyPI wheels (nothing downloaded)."""
    import duckdb
    import duckdb_ext

    folder = Path(list(duckdb_ext.__path__)[0]) / "extensions"
    con = duckdb.connect(config={"extension_directory": str(folder),
                                 "autoinstall_known_extensions": False})
    for name in extensions:
        con.execute(f"LOAD {name}")
    return con


@pytest.mark.parametrize(("fmt", "catalog"), [
    ("parquet", "hive"),
    full_only("delta", "hive", id="delta-hive"),
    full_only("parquet", "iceberg", id="parquet-iceberg")])
def test_an_operators_day(kafka_broker, hive_metastore, topic, tmp_path, fmt, catalog
                          ) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
    rng = random.Random(seed)
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format=fmt)
    data["source"]["kafka"]["max_offsets_per_trigger"] = 400
    data["trigger"] = {"interval": "500 ms"}
    data["maintenance"] = {"min_age_s": 0, "replaced_grace_s": 0}
    database = f"day_{topic.replace('-', '_')}"[:60]
    if catalog == "hive":
        data["catalog"] = {"hive": {"uri": hive_metastore.uri, "database": database}}
    else:
        data["catalog"] = {"iceberg": {"kind": "sql", "uri": f"sqlite:///{tmp_path}/ice.db",
                                       "warehouse": f"file://{tmp_path}/warehouse",
                                       "namespace": "day"}}
    cfg = write_config(tmp_path / "c.yaml", data)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKESINK_")}
    where = f"seed {seed}, {fmt} + {catalog}"
    print(f"operator's day: CHAOS_SEED={seed} format={fmt} catalog={catalog} kills={KILLS}")

    sent: dict[str, list[int]] = {"good": [], "bad": []}
    stop = threading.Event()
    publisher = threading.Thread(target=_publish, daemon=True,
                                 args=(kafka_broker.bootstrap_servers, topic, rng, stop, sent))
    cron = Cron(cfg, env)
    publisher.start()
    kills: list[float] = []
    try:
        while len(kills) < KILLS or cron.cycles < 1:
            log = tmp_path / f"run-{len(kills)}.log"
            with log.open("w") as out:
                run = subprocess.Popen(lakesink_cmd("run", "-c", str(cfg)), env=env,
                                       stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            if not cron.is_alive() and not cron.stop.is_set():
                cron.start()  # beside the first run, from its start
            after = rng.uniform(8.0, 25.0)
            time.sleep(after)
            if run.poll() is not None:
                pytest.fail(f"{where}: lakesink ended by itself: {log.read_text()[-2000:]}")
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
            kills.append(round(after, 1))
    finally:
        stop.set()
        cron.stop.set()
        publisher.join(30)
        cron.join(300)
    done = run_cli("run", "-c", str(cfg), "--until-caught-up")
    assert done.returncode == 0, f"{where}: {done.stderr[-3000:]}"

    # every maintenance run ended with exit 0 or one line saying why
    for r in cron.runs:
        assert _said_why(r), f"{where}: {' '.join(r['cmd'])} exit {r['rc']}: {r['stderr']}"
    runs = {" ".join(c): sum(1 for r in cron.runs if r["cmd"] == c) for c in CRON}
    # and once the day is over, repair finds nothing
    repaired = run_cli("repair", "-c", str(cfg), "--json")
    assert repaired.returncode == 0, f"{where}: {repaired.stdout[-3000:]}{repaired.stderr}"
    assert all(r["problems"] == 0 for r in json.loads(repaired.stdout))

    from lakesink.config import load_config
    from lakesink.config.plan import TableSpec

    good = sorted(sent["good"])
    counted: dict[str, int] = {}

    def agree(reader: str, ids: list[int]) -> None:
        counted[reader] = len(ids)
        assert len(ids) == len(set(ids)), f"{where}: {reader}: {len(ids) - len(set(ids))} twice"
        assert sorted(ids) == good, f"{where}: {reader}: {len(set(good) - set(ids))} lost"

    agree("duckdb glob" if fmt == "parquet" else "delta-rs", read_ids(lake / "events", fmt))
    if fmt == "delta":
        agree("duckdb delta", [r[0] for r in _duckdb("delta").sql(
            f"SELECT id FROM delta_scan('{lake / 'events'}')").fetchall()])
    if catalog == "hive":
        agree("spark sql (hive)", hive_client.run("read", hive_metastore.uri,
                                                  f"{database}.events")["ids"])
    else:
        from pyiceberg.catalog import load_catalog

        table = load_catalog("default", type="sql", uri=f"sqlite:///{tmp_path}/ice.db",
                             warehouse=f"file://{tmp_path}/warehouse").load_table(
            ("day", "events"))
        agree("pyiceberg", table.scan().to_arrow().column("id").to_pylist())
        agree("duckdb iceberg", [r[0] for r in _duckdb("iceberg").sql(
            f"SELECT id FROM iceberg_scan('{table.metadata_location}')").fetchall()])
    bad = _pending_bad(TableSpec(load_config(cfg, env={})))
    print(f"operator's day: {where}: kills after {kills} s; maintenance runs {runs}; "
          f"produced {len(good)} good + {len(sent['bad'])} bad; readers {counted}; "
          f"pending dead letters {len(bad)}")
    assert sorted(bad) == sorted(sent["bad"]), (
        f"{where}: pending dead letters {len(bad)} for {len(sent['bad'])} bad records "
        f"({len(bad) - len(set(bad))} twice, {len(set(sent['bad']) - set(bad))} lost)")
