"""A real HDFS for the tests: Hadoop's MiniDFSCluster (one NameNode, one DataNode) from
``hadoop-client-minicluster`` 3.5.0, run by ``jvm/MiniHdfs.java`` as a single-file Java
program (no build step), on 127.0.0.1 with free ports and its data in a temporary
directory. WebHDFS is on, so tests can read files back without Spark.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from lakesink.errors import ServiceError
from lakesink.runtime.jars import repo_root
from lakesink.local.services import LocalService, free_port, tail


def hdfs_jars() -> Path:
    folder = Path(os.environ.get("LAKESINK_HDFS_JARS_DIR") or repo_root() / "jvm" / "hdfs-jars")
    if not any(folder.glob("hadoop-client-minicluster-*.jar")):
        raise ServiceError(f"no MiniDFSCluster jars in {folder}: run scripts/setup.sh")
    return folder


class MiniHdfs(LocalService):
    """``with MiniHdfs() as hdfs: ... hdfs.uri ('hdfs://127.0.0.1:port') ...``"""

    def __init__(self, *, start_timeout_s: float = 120.0) -> None:
        self.work_dir = Path(tempfile.mkdtemp(prefix="lakesink-hdfs-"))
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.http = ""
        self.process: subprocess.Popen[str] | None = None
        self.log_path = self.work_dir / "hdfs.log"

    @property
    def uri(self) -> str:
        return f"hdfs://127.0.0.1:{self.port}"

    def start(self) -> MiniHdfs:
        self.port = free_port()
        java = shutil.which("java") or "java"
        cmd = [java, "-Xmx512m", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
               "-cp", f"{hdfs_jars()}/*", str(repo_root() / "jvm" / "MiniHdfs.java"),
               str(self.work_dir / "data"), str(self.port)]
        log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self._log = log
        self.process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=log, text=True, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line.startswith("READY"):
                self.http = line.split()[2].replace("localhost", "127.0.0.1")
                return self
            if not line and self.process.poll() is not None:
                break
        self.stop()
        raise ServiceError(f"MiniDFSCluster did not start; log {self.log_path}:\n"
                           f"{tail(self.log_path)}")

    def list_files(self, path: str) -> list[str]:
        """Every file below ``path`` (an HDFS path, no scheme), through WebHDFS."""
        out = []
        url = f"http://{self.http}/webhdfs/v1{path}?op=LISTSTATUS"
        for entry in json.loads(urllib.request.urlopen(url, timeout=30).read())[
                "FileStatuses"]["FileStatus"]:
            child = f"{path.rstrip('/')}/{entry['pathSuffix']}"
            if entry["type"] == "DIRECTORY":
                out.extend(self.list_files(child))
            else:
                out.append(child)
        return out

    def download(self, path: str, to: Path) -> Path:
        """One file, through WebHDFS (the DataNode redirect is followed)."""
        url = f"http://{self.http}/webhdfs/v1{path}?op=OPEN"
        to.parent.mkdir(parents=True, exist_ok=True)
        to.write_bytes(urllib.request.urlopen(url, timeout=60).read())
        return to

    def stop(self, *, keep_data: bool = False) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            try:
                assert proc.stdin is not None
                proc.stdin.close()  # MiniHdfs shuts the cluster down on EOF
                proc.wait(timeout=30)
            except (subprocess.TimeoutExpired, OSError):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if getattr(self, "_log", None) is not None:
            self._log.close()
        if not keep_data:
            shutil.rmtree(self.work_dir / "data", ignore_errors=True)

