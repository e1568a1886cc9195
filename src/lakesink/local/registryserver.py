"""A real schema registry on 127.0.0.1 for the tests: Apicurio Registry's app (a Quarkus
build from Maven Central, ``io.apicurio:apicurio-registry-app:<v>:tar.gz:all``, fetched
by ``scripts/setup.sh`` into ``.tools/apicurio-<v>/``), in-memory storage. Its
Confluent-compatible API (``/apis/ccompat/v7``) is what lakesink and
``confluent_kafka``'s serializers talk to. It needs Java 21 or newer; the JDK 17 the
rest of the project runs on cannot start it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from lakesink.errors import ServiceError
from lakesink.local.services import LocalService, free_port, stop_process, tail

APICURIO_VERSION = "3.3.3"
HOME = Path(__file__).resolve().parents[3] / ".tools" / f"apicurio-{APICURIO_VERSION}"
MIN_JAVA = 21


def java_major(java_home: Path) -> int:
    """The feature version of the JDK at ``java_home`` (its ``release`` file), 0 if none."""
    try:
        text = (java_home / "release").read_text()
    except OSError:
        return 0
    m = re.search(r'JAVA_VERSION="(\d+)', text)
    return int(m.group(1)) if m else 0


def registry_java() -> str | None:
    """A ``java`` of version 21 or newer: ``$APICURIO_JAVA_HOME``, ``$JAVA_HOME`` or a
    JDK under ``/usr/lib/jvm`` (None when there is none)."""
    for env in ("APICURIO_JAVA_HOME", "JAVA_HOME"):
        home = os.environ.get(env)
        if home and java_major(Path(home)) >= MIN_JAVA:
            return str(Path(home) / "bin" / "java")
    homes = sorted(Path("/usr/lib/jvm").glob("*"), key=java_major, reverse=True)
    for home in homes:
        if java_major(home) >= MIN_JAVA and (home / "bin" / "java").exists():
            return str(home / "bin" / "java")
    return None


class ApicurioRegistry(LocalService):
    """``url`` is the Confluent-compatible API's base (what ``decode.avro.registry.url``
    takes)."""

    def __init__(self, *, home: Path = HOME, start_timeout_s: float = 90.0) -> None:
        self.home = home
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.work_dir = Path(tempfile.mkdtemp(prefix="lakesink-apicurio-"))
        self.log_path = self.work_dir / "registry.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    def start(self) -> ApicurioRegistry:
        if self.process is not None:
            return self
        jar = self.home / "quarkus-run.jar"
        if not jar.exists():
            raise ServiceError(f"{jar} is missing: scripts/setup.sh fetches Apicurio Registry "
                               f"{APICURIO_VERSION}")
        java = registry_java()
        if java is None:
            raise ServiceError(f"Apicurio Registry needs Java {MIN_JAVA}+; none found (set "
                               "APICURIO_JAVA_HOME)")
        self.port = free_port()
        args = [java, "-Xmx384m", "-XX:TieredStopAtLevel=1",
                f"-Dquarkus.http.port={self.port}", "-Dquarkus.http.host=127.0.0.1",
                f"-Dquarkus.management.port={free_port()}",
                "-Dquarkus.management.host=127.0.0.1",
                "-Dquarkus.log.level=WARN", "-Dquarkus.http.access-log.enabled=false",
                "-jar", str(jar)]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(args, cwd=self.work_dir, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceError(f"Apicurio Registry exited with {self.process.returncode}; "
                                   f"log {self.log_path}:\n{tail(self.log_path)}")
            try:
                with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        self.stop(keep_data=True)
        raise ServiceError(f"Apicurio Registry not ready after {self.start_timeout_s:.0f}s; "
                           f"log {self.log_path}:\n{tail(self.log_path)}")

    def stop(self, *, keep_data: bool = False) -> None:
        proc, self.process = self.process, None
        stop_process(proc, grace_s=10)
        if not keep_data:
            shutil.rmtree(self.work_dir, ignore_errors=True)
