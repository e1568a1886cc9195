"""A real Spark standalone cluster on 127.0.0.1 for the tests and the demo: a master and
``workers`` workers (``cores`` cores each), started from pyspark's own ``spark-class``
(``org.apache.spark.deploy.master.Master`` / ``…worker.Worker``), each in a session of
its own. ``master_url`` is what ``spark.master`` takes; executors run as child JVMs of
the workers (:meth:`SparkStandalone.executor_pids`), with their Python workers from
``PYSPARK_PYTHON`` as the application sets it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from lakesink.errors import ServiceError
from lakesink.local.services import LocalService, free_port, port_open, stop_process, tail


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class SparkStandalone(LocalService):
    def __init__(self, *, workers: int = 2, cores: int = 1, memory: str = "1g",
                 work_dir: str | Path | None = None, start_timeout_s: float = 60) -> None:
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="lakesink-spark-"))
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_NO_DAEMONIZE": "1", "SPARK_LOG_DIR": str(self.work_dir),
               # no REST submission server (a fixed port), nothing kept between runs
               "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
               "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=false"}
        env.pop("PYSPARK_GATEWAY_PORT", None)
        env.pop("PYSPARK_GATEWAY_SECRET", None)
        return env

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.work_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child's
        proc = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args],
                                stdout=log, stderr=subprocess.STDOUT, env=self._env(),
                                cwd=self.work_dir, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        self.processes.append(proc)
        return proc

    def start(self) -> SparkStandalone:
        if self.processes:
            return self
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(free_port()))
        self._wait(lambda: port_open(self.port), "master")
        for i in range(self.workers):
            folder = self.work_dir / f"worker-{i}"
            folder.mkdir(exist_ok=True)
            self._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker",
                        self.master_url, "--host", "127.0.0.1", "--cores", str(self.cores),
                        "--memory", self.memory, "--work-dir", str(folder),
                        "--webui-port", str(free_port()), "--port", str(free_port()))
        self._wait(lambda: self._registered() >= self.workers, "workers")
        return self

    def _registered(self) -> int:
        text = (self.work_dir / "master.log").read_text(errors="replace")
        return text.count("Registering worker")

    def _wait(self, ready, what: str) -> None:  # noqa: ANN001
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            for proc in self.processes:
                if proc.poll() is not None:
                    self.stop(keep_data=True)
                    raise ServiceError(f"a Spark standalone process exited ({proc.args[1]}); "
                                       f"log:\n{tail(self.work_dir / 'master.log')}")
            if ready():
                return
            time.sleep(0.2)
        self.stop(keep_data=True)
        raise ServiceError(f"Spark standalone {what} not ready after "
                           f"{self.start_timeout_s:.0f}s; logs in {self.work_dir}")

    def executor_pids(self) -> list[int]:
        """The executor JVMs running now (children of the workers)."""
        out = subprocess.run(["pgrep", "-f", "CoarseGrainedExecutorBackend"],
                             capture_output=True, text=True, check=False)
        return [int(p) for p in out.stdout.split()]

    def stop(self, *, keep_data: bool = False) -> None:
        procs, self.processes = self.processes, []
        for proc in reversed(procs):  # workers (and their executors) first
            stop_process(proc, grace_s=15)
        if self._own_dir and not keep_data:
            shutil.rmtree(self.work_dir, ignore_errors=True)
