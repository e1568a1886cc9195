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
