"""Ad-hoc experiment: lakesink and the hand-written job as separate, fresh processes,
alternating, on one topic, with Spark's event log on (per job and stage times).

    SPARK_CONF_DIR=DIR .venv/bin/python bench/experiments/cold_runs.py 5000000 hand,lake,hand,lake

``DIR/spark-defaults.conf`` should turn the event log on, e.g.::

    spark.eventLog.enabled true
    spark.eventLog.dir file:/tmp/evcold
    spark.eventLog.compress false

Cases: ``lake`` (Parquet), ``lakedelta`` (Delta), ``hand``. Prints each run's seconds
and lakesink's per-batch commit lines; 500 000 events per batch, like bench/run.py.
"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.common import LAKESINK_SCHEMA, PARTITION_BY, SPARK_DDL, events  # noqa: E402
from lakesink.runtime.jars import connector_jars  # noqa: E402
from lakesink.runtime.services import KafkaBroker, produce  # noqa: E402

n = int(sys.argv[1])
order = sys.argv[2].split(",")
work = Path(tempfile.mkdtemp(prefix="lakesink-cold-"))
with KafkaBroker() as broker:
    broker.create_topic("p", partitions=4)
    produce(broker.bootstrap_servers, "p", events(n))
    for i, case in enumerate(order):
        if case.startswith("lake"):
            cfg = {"source": {"kafka": {"bootstrap_servers": broker.bootstrap_servers,
                                        "topics": ["p"], "max_offsets_per_trigger": 500000}},
                   "decode": {"schema": LAKESINK_SCHEMA},
                   "table": {"name": "s", "base_path": str(work / f"l{i}"),
                             "format": "delta" if case == "lakedelta" else "parquet",
                             "partition_by": PARTITION_BY, "timestamp_column": "ts_ms"}}
            (work / "c.yaml").write_text(yaml.safe_dump(cfg))
            cmd = [sys.executable, "-m", "lakesink.cli", "run", "-c", str(work / "c.yaml"),
                   "--until-caught-up"]
        else:
            cmd = [sys.executable, str(ROOT / "bench/cases/handwritten_spark.py"),
                   "--bootstrap", broker.bootstrap_servers, "--topic", "p",
                   "--out", str(work / f"h{i}"), "--checkpoint", str(work / f"hc{i}"),
                   "--jars", ",".join(str(j) for j in connector_jars()),
                   "--schema", SPARK_DDL, "--max-offsets", "500000"]
        t = time.time()
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=os.environ)
        print(case, round(time.time() - t, 1), "rc", out.returncode, flush=True)
        for line in (out.stdout + out.stderr).splitlines():
            if "committed in" in line:
                print("   ", line[:160])
