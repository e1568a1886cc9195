"""The same app on a real Spark standalone cluster (a master and two one-core workers
from pyspark's ``spark-class``, on 127.0.0.1): ``lakesink run`` with ``spark.master:
spark://…`` writes Parquet and Delta exactly once; a SIGKILL of the driver mid-batch
and of one executor mid-run lose and duplicate nothing. Each run is a process of its
own (one SparkContext per process; the tests' own session stays local). Read back by
DuckDB, delta-rs and the tests' Spark."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lakesink.local.sparkcluster import SparkStandalone
from tests.fixtures.services import (
    SHORT_LIVED_JIT,
    config_dict,
    driver_java_options,
    kill_then_restart,
    lakesink_cmd,
    produce_events,
    read_ids,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

N = 2000


@pytest.fixture(scope="module")
def cluster() -> Iterator[SparkStandalone]:
    with SparkStandalone(workers=2, cores=1, memory="1g") as c:
        yield c


def cluster_config(cluster: SparkStandalone, kafka_broker, topic: str, lake: Path,
                   **table: Any) -> dict[str, Any]:
    data = config_dict(kafka_broker, topic, lake, partition_by=["location"], **table)
    data["spark"] = {"master": cluster.master_url, "driver_memory": "1g",
                     "log_level": "ERROR",
                     "conf": {"spark.executor.memory": "640m", "spark.executor.cores": "1",
                              "spark.driver.host": "127.0.0.1",
                              "spark.driver.bindAddress": "127.0.0.1",
                              # short-lived JVMs, as every lakesink process of the tests
                              **driver_java_options(),
                              "spark.executor.extraJavaOptions": SHORT_LIVED_JIT}}
    return data


ENV = {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}


def test_parquet_on_the_cluster_with_the_driver_killed_mid_batch(
        cluster, kafka_broker, topic, tmp_path, spark) -> None:
    """A whole run on the cluster, its driver SIGKILLed while publishing a batch (the
    executors live on in the workers), then run again to the end."""
    produce_events(kafka_broker, topic, range(N))
    lake = tmp_path / "lake"
    data = cluster_config(cluster, kafka_broker, topic, lake)
    data["source"]["kafka"]["max_offsets_per_trigger"] = 1000
    cfg = write_config(tmp_path / "c.yaml", data)
    logs = kill_then_restart(cfg, "mid_publish", env=ENV)
    assert f"master={cluster.master_url}" in logs
    ids = read_ids(lake / "events", "parquet")
    assert sorted(ids) == list(range(N)), f"{len(ids)} rows, {len(set(ids))} distinct"
    back = spark.read.parquet(str(lake / "events"))
    assert back.count() == N and back.select("id").distinct().count() == N
    apps = list(cluster.work_dir.glob("worker-*/app-*"))
    assert apps, "no application ran on the workers' executors"
    print(f"crash-matrix cluster=standalone kill=driver point=mid_publish table=parquet "
          f"produced={N} read_back={len(ids)} duplicated={len(ids) - len(set(ids))}")


def test_delta_on_the_cluster_with_an_executor_killed_mid_run(cluster, kafka_broker, topic,
                                                              tmp_path, spark) -> None:
    """SIGKILL of one executor JVM while batches run: Spark runs its tasks again on the
    other executor (the master starts a new one on the same worker), every batch
    commits once."""
    produce_events(kafka_broker, topic, range(N))
    lake = tmp_path / "lake"
    data = cluster_config(cluster, kafka_broker, topic, lake, format="delta")
    data["source"]["kafka"]["max_offsets_per_trigger"] = 200  # 10 batches
    cfg = write_config(tmp_path / "c.yaml", data)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKESINK_")} | ENV
    proc = subprocess.Popen(lakesink_cmd("run", "-c", str(cfg), "--until-caught-up"),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    log = lake / "events" / "_delta_log"
    killed = None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            done = len(list(log.glob("*.json"))) if log.exists() else 0
            pids = cluster.executor_pids()
            if done >= 3 and pids:  # mid-run: batches committed, more to come
                killed = pids[0]
                os.kill(killed, signal.SIGKILL)
                break
            time.sleep(0.1)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed is not None, "no executor was running mid-run"
    assert proc.returncode == 0, err[-3000:]
    ids = read_ids(lake / "events", "delta")  # delta-rs
    assert sorted(ids) == list(range(N)), f"{len(ids)} rows, {len(set(ids))} distinct"
    back = spark.read.format("delta").load(str(lake / "events"))
    assert back.count() == N and back.select("id").distinct().count() == N
    print(f"crash-matrix cluster=standalone kill=executor table=delta produced={N} "
          f"read_back={len(ids)} duplicated={len(ids) - len(set(ids))}")


def test_spark_submit_from_the_wheel(cluster, kafka_broker, topic, tmp_path) -> None:
    """The documented spark-submit command line (docs/deploy.md), from a wheel built
    here: the driver and the executors import lakesink from the wheel."""
    from lakesink.runtime.jars import repo_root
    from lakesink.local.sparkcluster import spark_home

    produce_events(kafka_broker, topic, range(1000))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-w", str(tmp_path / "dist"),
                            str(repo_root())], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("lakesink-*.whl")
    lake = tmp_path / "lake"
    data = cluster_config(cluster, kafka_broker, topic, lake)
    data["spark"]["master"] = None  # spark-submit gives it
    cfg = write_config(tmp_path / "c.yaml", data)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LAKESINK_", "PYTHONPATH"))} | ENV
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    jars = subprocess.run([*lakesink_cmd("jars", "-c", str(cfg))], capture_output=True,
                          text=True, env=env, timeout=120, cwd=tmp_path)
    assert jars.returncode == 0 and "spark-sql-kafka" in jars.stdout, jars.stderr
    assert "bundle-" not in jars.stdout, "a local lake needs no S3 connector"
    submit = [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.master_url,
              "--jars", jars.stdout.strip(), "--py-files", str(wheel),
              "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.executor.memory=640m",
              str(repo_root() / "scripts" / "lakesink_submit.py"),
              "run", "-c", str(cfg), "--until-caught-up"]
    run = subprocess.run(submit, capture_output=True, text=True, env=env, timeout=600,
                         cwd=tmp_path, start_new_session=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    logs = run.stdout + run.stderr
    assert f"master={cluster.master_url}" in logs, logs[-3000:]
    # the driver's lakesink is the wheel's (spark-submit put it on the path)
    assert f"lakesink 0.1.0 from {wheel}/lakesink" in logs, logs[-3000:]
    ids = read_ids(lake / "events", "parquet")
    assert sorted(ids) == list(range(1000)), f"{len(ids)} rows, {len(set(ids))} distinct"
