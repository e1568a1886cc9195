"""Planted secrets: every secret setting lakesink knows is set to a unique marker, then
``validate``, a streaming ``run`` (its /metrics, status page and /readyz scraped while
it runs, Spark's event log on), a ``run`` that fails, and ``status`` are run as users
run them (separate processes). No marker may appear in any output, in the event log,
or in any file lakesink wrote.

Markers that must work stand for real credentials: the SASL user's JAAS config (with
a marker option the SCRAM module ignores) reads the topic; the Quix catalog double
only answers the marker token; the lake is in S3 (SeaweedFS) with the server's real
keys, given the Quix/AWS way. The rest (Azure, Iceberg, Redis) are given to the same
processes; a second config with a Redis source and an Iceberg
catalog goes through ``validate`` and ``status``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from lakesink.local.services import free_port
from tests.fixtures.services import (
    config_dict,
    lakesink_cmd,
    produce_events,
    run_cli,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]

N = 300


def _marker(name: str) -> str:
    return f"PLANTED{name}x{secrets.token_hex(6)}"


def _scan(where: str, text: str | bytes, markers: dict[str, str]) -> None:
    data = text.encode() if isinstance(text, str) else text
    found = [k for k, m in markers.items() if m.encode() in data]
    assert not found, f"planted secret(s) {found} in {where}"


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


@pytest.mark.s3
def test_no_planted_secret_in_any_output(kafka_broker, topic, redis_server, s3_server,
                                         tmp_path) -> None:
    from tests.fixtures.quix_catalog import QuixCatalogDouble

    sec = kafka_broker.security
    kafka_broker.grant(topic, "User:alice", "READ", "DESCRIBE")
    produce_events(kafka_broker, topic, range(N))
    m = {name: _marker(name) for name in (
        "JAAS", "SASLPW", "AZKEY", "AZSAS",
        "AZCLIENT", "QUIXTOKEN", "ICEBERGCRED", "REDISPW")}
    secrets_in_use = {**m, "alice": sec.users["alice"], "S3 secret key": s3_server.secret_key}
    catalog = QuixCatalogDouble(token=m["QUIXTOKEN"])
    catalog.start()
    port = free_port()
    events = tmp_path / "events"
    events.mkdir()
    prefix = f"planted-{topic}"
    data = config_dict(kafka_broker, topic, tmp_path / "unused")
    data["table"].pop("base_path")  # the lake in S3: S3_BUCKET / S3_PREFIX and AWS_*
    data["source"]["kafka"].update({
        "bootstrap_servers": kafka_broker.sasl_bootstrap_servers,
        "options": {"security.protocol": "SASL_SSL", "ssl.truststore.type": "PEM",
                    "ssl.truststore.location": str(sec.ca_pem)},
        "sasl": {"mechanism": "SCRAM-SHA-512", "username": "alice"}})
    data["catalog"] = {"quix": {"url": catalog.url}}
    data["metrics"] = {"port": port, "host": "127.0.0.1"}
    data["trigger"] = {"interval": "1 second"}
    data["storage"] = {"azure": {"account": "plantedaccount", "client_id": "id",
                                 "tenant_id": "tenant"}}
    data["spark"]["log_level"] = "WARN"  # Spark's, Kafka's and Hadoop's warnings searched too
    data["spark"].setdefault("conf", {}).update({
        "spark.eventLog.enabled": "true",  # plain JSON lines, to be searched as text
        "spark.eventLog.compress": "false", "spark.eventLog.dir": events.as_uri()})
    cfg = write_config(tmp_path / "a.yaml", data)
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
            f'username="alice" password="{sec.users["alice"]}" planted="{m["JAAS"]}";')
    env = {
        **s3_server.env(), "S3_BUCKET": s3_server.bucket, "S3_PREFIX": prefix,
        "LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS": json.dumps({"sasl.jaas.config": jaas}),
        "LAKESINK_STORAGE__AZURE__ACCOUNT_KEY": m["AZKEY"],
        "LAKESINK_STORAGE__AZURE__SAS_TOKEN": m["AZSAS"],
        "LAKESINK_STORAGE__AZURE__CLIENT_SECRET": m["AZCLIENT"],
        "LAKESINK_CATALOG__QUIX__AUTH_TOKEN": m["QUIXTOKEN"],
        "LOGLEVEL": "DEBUG",
    }
    outputs: dict[str, str] = {}
    try:
        checked = run_cli("validate", "-c", str(cfg), env=env)
        outputs["validate"] = checked.stdout + checked.stderr
        assert checked.returncode == 0, outputs["validate"][-3000:]

        full_env = {k: v for k, v in os.environ.items() if not k.startswith("LAKESINK_")}
        log_path = tmp_path / "run.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(lakesink_cmd("run", "-c", str(cfg)), stdout=log,
                                    stderr=subprocess.STDOUT, env={**full_env, **env},
                                    start_new_session=True)
            try:
                outputs.update(_scrape_while_running(proc, port, log_path))
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=120) == 0, log_path.read_text()[-3000:]
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
        outputs["run"] = log_path.read_text()
        assert catalog.sent, "the catalog (token = a marker) registered nothing"

        failed = run_cli("run", "-c", str(cfg), "--until-caught-up", env={  # wrong password
            **env, "LAKESINK_SOURCE__KAFKA__SECRET_OPTIONS": "{}",
            "LAKESINK_SOURCE__KAFKA__SASL__PASSWORD": m["SASLPW"]})
        outputs["failed run"] = failed.stdout + failed.stderr
        errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
        print(f"planted secrets: the failing run exited {failed.returncode}: {errors}")
        assert failed.returncode == 1 and "Traceback" not in outputs["failed run"]
        assert len(errors) == 1 and "authentication failed" in errors[0], failed.stderr[-2000:]

        status = run_cli("status", "-c", str(cfg), env=env)
        outputs["status"] = status.stdout + status.stderr
        assert status.returncode == 0 and "events" in status.stdout, outputs["status"]

        other = config_dict(kafka_broker, topic, tmp_path / "lake2")
        other["source"] = {"redis": {"host": "127.0.0.1", "port": redis_server.port,
                                     "streams": ["planted"]}}
        other["catalog"] = {"iceberg": {"uri": "http://127.0.0.1:9/catalog"}}
        cfg_b = write_config(tmp_path / "b.yaml", other)
        env_b = {"LAKESINK_SOURCE__REDIS__PASSWORD": m["REDISPW"],
                 "LAKESINK_CATALOG__ICEBERG__SECRET_PROPERTIES":
                     json.dumps({"credential": m["ICEBERGCRED"]})}
        for command in ("validate", "status"):
            done = run_cli(command, "-c", str(cfg_b), "--offline" if command == "validate"
                           else "--json", env=env_b)
            outputs[f"{command} (redis, iceberg)"] = done.stdout + done.stderr
    finally:
        catalog.stop()
    for where, text in outputs.items():
        _scan(where, text, secrets_in_use)
    logs = _files(events)
    assert sum(b'"SparkListenerEnvironmentUpdate"' in p.read_bytes() for p in logs) == 2, \
        "no readable event log of each run"
    for path in logs:
        _scan(str(path.relative_to(tmp_path)), path.read_bytes(), secrets_in_use)
    lake_files = _s3_files(s3_server, f"{s3_server.bucket}/{prefix}")
    assert len(lake_files) > 10
    for key, content in lake_files.items():
        _scan(key, content, secrets_in_use)
    print(f"planted secrets: {len(secrets_in_use)} secrets, absent from "
          f"{len(outputs)} outputs ({', '.join(outputs)}), {len(logs)} event log file(s) "
          f"and {len(lake_files)} lake object(s) in S3")


def _s3_files(server: Any, root: str) -> dict[str, bytes]:  # noqa: ANN401
    """Every object under ``root`` (``bucket/prefix``), read with pyarrow's S3 client."""
    from pyarrow import fs

    s3 = fs.S3FileSystem(access_key=server.access_key, secret_key=server.secret_key,
                         endpoint_override=server.endpoint, scheme="http", region="us-east-1")
    infos = s3.get_file_info(fs.FileSelector(root, recursive=True))
    out = {}
    for info in infos:
        if info.type == fs.FileType.File:
            with s3.open_input_stream(info.path) as f:
                out[info.path] = f.read()
    return out


def _scrape_while_running(proc: subprocess.Popen[Any], port: int, log_path: Path
                          ) -> dict[str, str]:
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, log_path.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{base}/metrics", timeout=5) as answer:
                metrics = answer.read().decode()
        except OSError:
            time.sleep(0.5)
            continue
        if f'lakesink_records_written_total{{table="events"}} {float(N)}' in metrics:
            pages = {"/metrics": metrics}
            for path in ("/", "/readyz", "/healthz"):
                with urllib.request.urlopen(f"{base}{path}", timeout=5) as answer:
                    pages[path] = answer.read().decode()
            return pages
        time.sleep(0.5)
    raise AssertionError("the run did not write every record in time: "
                         + log_path.read_text()[-3000:])
