"""The embedded session as built by lakesink (the tests' one session)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_the_embedded_jvm_runs_the_throughput_collector(spark) -> None:  # noqa: ANN001
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    assert sorted(b.getName() for b in beans) == ["PS MarkSweep", "PS Scavenge"]
