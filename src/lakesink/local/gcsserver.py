"""A GCS emulator for the tests: fake-gcs-server (built by ``scripts/setup.sh`` into
``.tools/bin``), JSON API over plain HTTP on 127.0.0.1, its objects in a temporary
directory. It stands in for Google Cloud Storage, which cannot run here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from lakesink.errors import ServiceError
from lakesink.runtime.jars import repo_root
from lakesink.local.services import LocalService, free_port, port_open, stop_process, tail


def fake_gcs_binary() -> Path:
    path = repo_root() / ".tools" / "bin" / "fake-gcs-server"
    if not path.exists():
        raise ServiceError("fake-gcs-server is missing: run scripts/setup.sh (needs Go)")
    return path


class FakeGcs(LocalService):
    """``with FakeGcs(bucket="lake") as gcs: ... gcs.endpoint ...``"""

    def __init__(self, *, bucket: str = "lake", start_timeout_s: float = 30.0) -> None:
        self.bucket = bucket
        self.work_dir = Path(tempfile.mkdtemp(prefix="lakesink-gcs-"))
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.work_dir / "fake-gcs.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> FakeGcs:
        self.port = free_port()
        (self.work_dir / "seed" / self.bucket).mkdir(parents=True, exist_ok=True)
        cmd = [str(fake_gcs_binary()), "-scheme", "http", "-host", "127.0.0.1",
               "-port", str(self.port), "-public-host", f"127.0.0.1:{self.port}",
               "-backend", "filesystem", "-filesystem-root", str(self.work_dir / "store"),
               "-data", str(self.work_dir / "seed"), "-log-level", "warn"]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if port_open(self.port) and self.bucket in self.buckets():
                return self
            time.sleep(0.2)
        self.stop()
        raise ServiceError(f"fake-gcs-server did not start; log {self.log_path}:\n"
                           f"{tail(self.log_path)}")

    def _get(self, path: str) -> bytes:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30).read()

    def buckets(self) -> list[str]:
        try:
            return [b["name"] for b in json.loads(self._get("/storage/v1/b")).get("items", [])]
        except OSError:
            return []

    def list_objects(self, prefix: str) -> list[str]:
        names, token = [], ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, "pageToken": token})
            page = json.loads(self._get(f"/storage/v1/b/{self.bucket}/o?{query}"))
            names += [o["name"] for o in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return names

    def download(self, name: str, to: Path) -> Path:
        quoted = urllib.parse.quote(name, safe="")
        to.parent.mkdir(parents=True, exist_ok=True)
        to.write_bytes(self._get(f"/storage/v1/b/{self.bucket}/o/{quoted}?alt=media"))
        return to

    def stop(self, *, keep_data: bool = False) -> None:
        proc, self.process = self.process, None
        stop_process(proc, grace_s=10)
        if not keep_data:
            shutil.rmtree(self.work_dir / "store", ignore_errors=True)

