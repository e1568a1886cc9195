"""A real ``redis-server`` (Debian's package) on 127.0.0.1 for the demo, the tests and
the benchmark: its own port and data directory, append-only file on (so a restart of
the server keeps what it acknowledged), stopped by its pid."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from lakesink.errors import ServiceError
from lakesink.local.services import LocalService, free_port, stop_process, tail


class RedisServer(LocalService):
    def __init__(self, *, work_dir: str | Path | None = None, password: str | None = None,
                 start_timeout_s: float = 30.0) -> None:
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="lakesink-redis-"))
        self.password = password
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.work_dir / "redis.log"

    def start(self) -> RedisServer:
        if self.process is not None:
            return self
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServiceError("redis-server not found: install the Debian package "
                               "redis-server (scripts/setup.sh does)")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.work_dir), "--appendonly", "yes", "--save", "",
                "--logfile", str(self.log_path), "--daemonize", "no",
                "--protected-mode", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceError(f"redis-server exited with {self.process.returncode}; "
                                   f"log {self.log_path}:\n{tail(self.log_path)}")
            try:
                self.client().ping()
                return self
            except Exception:  # noqa: BLE001 - not ready yet
                time.sleep(0.1)
        self.stop(keep_data=True)
        raise ServiceError(f"redis-server not ready after {self.start_timeout_s:.0f}s; log "
                           f"{self.log_path}:\n{tail(self.log_path)}")

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password)

    def stop(self, *, keep_data: bool = False) -> None:
        proc, self.process = self.process, None
        stop_process(proc, grace_s=10)
        if self._own_dir and not keep_data:
            shutil.rmtree(self.work_dir, ignore_errors=True)
