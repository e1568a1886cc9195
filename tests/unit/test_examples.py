"""The README's config example is valid and is the same as examples/sensors.yaml."""

from __future__ import annotations

import re
from pathlib import Path

from lakesink.app import preflight
from lakesink.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_readme_example_matches_file_and_loads() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", readme, re.S)
    assert block is not None
    example = ROOT / "examples" / "sensors.yaml"
    assert block.group(1).strip() in example.read_text()
    cfg = load_config(example, env={"LAKESINK_SOURCE__KAFKA__SASL__PASSWORD": "x"})
    assert cfg.table.partition_by == ["location", "year", "month", "day"]
    checks = preflight(cfg)
    assert checks[0].startswith("schema: 5 declared field(s)")


def test_the_kubernetes_example_loads_and_probes_the_metrics_port(tmp_path: Path) -> None:
    """deploy/k8s/lakesink.yaml: its config loads with the Secret's variables, its
    secrets are only in the Secret, and the probes and scrape port are metrics.port."""
    import yaml

    docs = {d["kind"]: d for d in yaml.safe_load_all(
        (ROOT / "deploy" / "k8s" / "lakesink.yaml").read_text())}
    text = docs["ConfigMap"]["data"]["lakesink.yaml"]
    env = dict(docs["Secret"]["stringData"])
    path = tmp_path / "lakesink.yaml"
    path.write_text(text)
    cfg = load_config(path, env=env)
    assert cfg.source.kafka is not None and cfg.source.kafka.sasl is not None
    assert cfg.source.kafka.sasl.password is not None
    assert cfg.storage.s3.secret_access_key is not None  # from AWS_SECRET_ACCESS_KEY
    assert "change-me" not in text
    pod = docs["Deployment"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"]
    assert port == cfg.metrics.port == int(pod["metadata"]["annotations"]["prometheus.io/port"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert docs["Deployment"]["spec"]["replicas"] == 1
