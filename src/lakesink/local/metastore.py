"""A real Hive metastore (the standalone thrift service) on 127.0.0.1 for the tests and
the demo, run from the jars pyspark ships (``hive-metastore`` 2.3, DataNucleus, Derby):
the same ``org.apache.hadoop.hive.metastore.HiveMetaStore`` users run in front of their
metastore database, here with an embedded Derby database in its own folder."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from lakesink.errors import ServiceError
from lakesink.runtime.jars import pyspark_jars_dir
from lakesink.local.services import (
    LocalService,
    free_port,
    java_binary,
    port_open,
    stop_process,
    tail,
)


class HiveMetastore(LocalService):
    """``with HiveMetastore() as hms: ... hms.uri`` (``thrift://127.0.0.1:<port>``)."""

    def __init__(self, *, work_dir: str | Path | None = None, heap: str = "512m",
                 start_timeout_s: float = 120.0) -> None:
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="lakesink-hms-"))
        self.heap = heap
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.work_dir / "metastore.log"

    @property
    def uri(self) -> str:
        return f"thrift://127.0.0.1:{self.port}"

    def start(self) -> HiveMetastore:
        if self.process is not None:
            return self
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        db = self.work_dir / "metastore_db"
        props = {
            "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={db};create=true",
            "datanucleus.schema.autoCreateAll": "true",
            "hive.metastore.schema.verification": "false",
            "hive.metastore.warehouse.dir": (self.work_dir / "warehouse").as_uri(),
            "hive.metastore.thrift.bind.host": "127.0.0.1",
            "hive.async.log.enabled": "false",  # its async logger's jar is not shipped
            "derby.system.home": str(self.work_dir),
        }
        args = [java_binary(), f"-Xmx{self.heap}",
                "-cp", f"{pyspark_jars_dir()}/*",
                *(f"-D{k}={v}" for k, v in props.items()),
                "org.apache.hadoop.hive.metastore.HiveMetaStore", "-p", str(self.port)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.work_dir,
                                            start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceError(f"the Hive metastore exited with {self.process.returncode};"
                                   f" log {self.log_path}:\n{tail(self.log_path)}")
            if port_open(self.port):
                return self
            time.sleep(0.3)
        self.stop(keep_data=True)
        raise ServiceError(f"the Hive metastore is not listening after "
                           f"{self.start_timeout_s:.0f}s; log {self.log_path}:\n"
                           f"{tail(self.log_path)}")

    def stop(self, *, keep_data: bool = False) -> None:
        proc, self.process = self.process, None
        stop_process(proc, grace_s=10)
        if self._own_dir and not keep_data:
            shutil.rmtree(self.work_dir, ignore_errors=True)
