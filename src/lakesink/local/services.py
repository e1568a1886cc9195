"""Real local services for the demo, the tests and the benchmark, on 127.0.0.1 only.

Each service runs as a child process with its data in a temporary directory, is
ready when :meth:`start` returns, and is stopped by its own pid. Its log file is kept
(``log_path``) so that a failure can show what the service said.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from lakesink.errors import ServiceError
from lakesink.runtime.jars import kafka_broker_classpath
from lakesink.local.kafka_security import BrokerSecurity

logger = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def stop_process(proc: subprocess.Popen[Any] | None, *, grace_s: float = 20) -> None:
    """Stop a service started in its own session: SIGTERM to its process group, then
    SIGKILL after ``grace_s``."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def java_binary() -> str:
    """``$JAVA_HOME/bin/java``, else the ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if not java:
        raise ServiceError("java not found: install OpenJDK 17 (scripts/setup.sh does)")
    return java


class LocalService:
    """A server the project starts on 127.0.0.1 for the demo, tests and benchmark:
    ``start()`` returns it ready, ``stop()`` ends it; as a context manager, its data is
    kept when the block raised (for a look at the logs)."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self, *, keep_data: bool = False) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop(keep_data=exc is not None)


class KafkaBroker(LocalService):
    """A single-node Kafka broker in KRaft mode (broker + controller), run from the jars.

    Usage::

        with KafkaBroker() as broker:
            broker.create_topic("events", partitions=4)
            ... broker.bootstrap_servers ...
    """

    def __init__(
        self,
        *,
        work_dir: str | Path | None = None,
        heap: str = "1G",
        extra_config: dict[str, str] | None = None,
        start_timeout_s: float = 90.0,
        secured: bool = False,
    ) -> None:
        """``secured``: also listen with SASL_SSL (SCRAM-SHA-512) and mutual TLS, ACLs on
        (see :mod:`lakesink.local.kafka_security`; ``security`` holds the files and
        users)."""
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="lakesink-kafka-"))
        self.heap = heap
        self.extra_config = dict(extra_config or {})
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.controller_port = 0
        self.sasl_port = 0
        self.tls_port = 0
        self.security: BrokerSecurity | None = None
        if secured:
            self.security = BrokerSecurity(self.work_dir / "tls")
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.work_dir / "broker.log"
        #: one id for the broker's life (:meth:`resume` formats with it again: a data
        #: folder formatted with another one is refused)
        self.cluster_id = str(uuid.uuid4())

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap_servers(self) -> str:
        """The SASL_SSL (SCRAM-SHA-512) listener of a ``secured`` broker."""
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def tls_bootstrap_servers(self) -> str:
        """The mutual-TLS listener of a ``secured`` broker."""
        return f"127.0.0.1:{self.tls_port}"

    def _write_properties(self) -> Path:
        data_dir = self.work_dir / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dir": str(data_dir),
            "num.partitions": "1",
            "num.recovery.threads.per.data.dir": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.retention.hours": "-1",
            **(self.security.broker_properties(plain=self.port, sasl=self.sasl_port,
                                               tls=self.tls_port,
                                               controller=self.controller_port)
               if self.security else {}),
            **self.extra_config,
        }
        path = self.work_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def start(self) -> KafkaBroker:
        if self.process is not None:
            return self
        ports: set[int] = set()
        while len(ports) < 4:
            ports.add(free_port())
        self.port, self.controller_port, self.sasl_port, self.tls_port = sorted(ports)
        if self.security is not None:  # once: resume() keeps the certificates and users
            self.security.create()
        self._launch()
        return self

    def _launch(self) -> None:
        """Format the data folder (once: a formatted one is kept) and run the broker on
        the ports chosen; returns when it answers."""
        cp = kafka_broker_classpath()
        java = java_binary()
        scram: list[str] = []
        if self.security is not None:
            scram = self.security.scram_format_args()
        props = self._write_properties()
        fmt = subprocess.run(
            [java, "-cp", cp, "kafka.tools.StorageTool", "format", "--standalone",
             "-t", self.cluster_id, "-c", str(props), "--ignore-formatted", *scram],
            capture_output=True, text=True, timeout=120,
        )
        if fmt.returncode != 0:
            raise ServiceError(f"kafka storage format failed: {fmt.stdout}\n{fmt.stderr}")
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.process = subprocess.Popen(
            [java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC",
             "-Djava.awt.headless=true", "-cp", cp, "kafka.Kafka", str(props)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self._wait_ready()
        logger.info("kafka broker ready on %s (pid %d)", self.bootstrap_servers, self.process.pid)

    def halt(self) -> None:
        """Stop the broker's process, keeping its data and ports (an outage, for tests:
        :meth:`resume` brings the same broker back)."""
        proc, self.process = self.process, None
        stop_process(proc)

    def resume(self) -> None:
        """Run the broker again after :meth:`halt`, on the same ports, with its data."""
        if self.process is None:
            self._launch()

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceError(
                    f"kafka broker exited with {self.process.returncode}; log {self.log_path}:\n"
                    + tail(self.log_path)
                )
            if port_open(self.port):
                try:
                    md = AdminClient({"bootstrap.servers": self.bootstrap_servers}).list_topics(
                        timeout=5
                    )
                    if md.brokers:
                        return
                except Exception:  # noqa: BLE001 - not ready yet
                    pass
            time.sleep(0.3)
        self.stop()
        raise ServiceError(
            f"kafka broker not ready after {self.start_timeout_s:.0f}s; log {self.log_path}:\n"
            + tail(self.log_path)
        )

    def stop(self, *, keep_data: bool = False) -> None:
        """Stop the broker by its pid (SIGTERM, then SIGKILL after 20 s)."""
        proc, self.process = self.process, None
        stop_process(proc)
        if self._own_dir and not keep_data:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    # -- helpers for demo, tests and benchmark ------------------------------------------

    def create_topic(self, name: str, *, partitions: int = 1, timeout_s: float = 30) -> None:
        create_topic(self.bootstrap_servers, name, partitions=partitions, timeout_s=timeout_s)

    def grant(self, topic: str, principal: str, *operations: str) -> None:
        """Allow ``principal`` (``User:alice``) the ``operations`` (``READ``, ``DESCRIBE``)
        on ``topic``; once a topic has an ACL, nobody else may touch it (super users
        aside)."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            AdminClient,
            ResourcePatternType,
            ResourceType,
        )

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        bindings = [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL,
                               principal, "*", AclOperation[op], AclPermissionType.ALLOW)
                    for op in operations]
        for future in admin.create_acls(bindings).values():
            future.result(timeout=30)


def create_topic(bootstrap_servers: str, name: str, *, partitions: int = 1,
                 timeout_s: float = 30) -> None:
    """Create ``name`` on the broker at ``bootstrap_servers`` and wait until every
    partition has a leader (a producer before that gets ``UNKNOWN_TOPIC_OR_PART``)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)]
    )
    futures[name].result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if md and not md.error and len(md.partitions) == partitions and all(
            p.leader >= 0 for p in md.partitions.values()
        ):
            return
        time.sleep(0.2)
    raise ServiceError(f"topic {name} has no leaders after {timeout_s}s")


def produce(
    bootstrap_servers: str,
    topic: str,
    records: Iterator[tuple[bytes | None, bytes | None]] | list[tuple[bytes | None, bytes | None]],
    *,
    partition_by_key: bool = True,
) -> int:
    """Produce ``(key, value)`` pairs, wait until every one is acknowledged; return the count."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer({
        "bootstrap.servers": bootstrap_servers, "linger.ms": 50, "batch.size": 1_000_000,
        "queue.buffering.max.messages": 500_000, "enable.idempotence": True,
        "log_level": 3,  # errors only: a fresh broker's "coordinator load in progress" is noise
    })
    errors: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    n = 0
    for key, value in records:
        while True:
            try:
                producer.produce(topic, value=value, key=key if partition_by_key else None,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        n += 1
        if n % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    if remaining or errors:
        raise KafkaException(f"{remaining} undelivered, errors: {errors[:3]}")
    return n
