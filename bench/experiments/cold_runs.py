"""Ad-hoc experiment: lakesink and the hand-written job as separate, fresh processes,
alternating, on one topic, with Spark's event log on (per job and stage times).

    SPARK_CONF_DIR=DIR .venv/bin/python bench/experiments/cold_runs.py 5000000 hand,lake,hand,lake

``DIR/spark-defaults.conf`` should turn the event log on, e.g.::

    spark.eventLog.enabled true
    spark.eventLog.dir file:/tmp/evcold
    spark.eventLog.compress false

Cases: ``lake`` (Parquet), ``lakedelta`` (Delta), ``hand``; ``case@DIR`` runs it with
``SPARK_CONF_DIR=DIR`` (e.g. other JVM options). Prints each run's seconds and
lakesink's per-batch commit lines; 500 000 events per batch, like bench/run.py.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.common import events  # noqa: E402
from bench.run import Case  # noqa: E402
from lakesink.local.services import KafkaBroker, produce  # noqa: E402

CASES = {"lake": "lakesink-parquet", "lakedelta": "lakesink-delta", "hand": "spark-handwritten"}

n = int(sys.argv[1])
order = sys.argv[2].split(",")
work = Path(tempfile.mkdtemp(prefix="lakesink-cold-"))
args = argparse.Namespace(max_offsets=500_000)
with KafkaBroker() as broker:
    broker.create_topic("p", partitions=4)
    produce(broker.bootstrap_servers, "p", events(n))
    for i, spec in enumerate(order):
        case, _, conf_dir = spec.partition("@")
        env = {**os.environ, **({"SPARK_CONF_DIR": conf_dir} if conf_dir else {})}
        run_dir = work / f"{i}-{case}"
        run_dir.mkdir()
        cmd = Case(CASES[case], run_dir, broker, args).command("p", stream=False, count=n,
                                                               ndjson=None)
        t = time.time()
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        print(spec, round(time.time() - t, 1), "rc", out.returncode, flush=True)
        for line in (out.stdout + out.stderr).splitlines():
            if "committed in" in line:
                print("   ", line[:160])
