"""The embedded JVM's collector choice (no JVM started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakesink.runtime.spark import LOCAL_GC, LOCAL_YOUNG, local_gc_options

OURS = f"{LOCAL_GC} {LOCAL_YOUNG}"


def test_parallel_gc_by_default_after_other_default_options() -> None:
    assert local_gc_options({}, {}) == OURS
    assert local_gc_options({"spark.driver.defaultJavaOptions": "-Dx=1"}, {}) == \
        f"-Dx=1 {OURS}"


@pytest.mark.parametrize(("settings", "env"), [
    ({"spark.driver.extraJavaOptions": "-Xmn128m"}, {}),
    ({"spark.driver.defaultJavaOptions": "-XX:NewRatio=3"}, {}),
    ({}, {"JAVA_TOOL_OPTIONS": "-XX:MaxNewSize=256m"}),
])
def test_a_young_generation_sized_elsewhere_is_left_alone(settings: dict[str, str],
                                                         env: dict[str, str]) -> None:
    options = local_gc_options(settings, env)
    assert options is not None and LOCAL_GC in options and LOCAL_YOUNG not in options


@pytest.mark.parametrize(("settings", "env"), [
    ({"spark.driver.extraJavaOptions": "-Xss4m -XX:+UseG1GC"}, {}),
    ({"spark.driver.defaultJavaOptions": "-XX:+UseZGC"}, {}),
    ({}, {"JAVA_TOOL_OPTIONS": "-XX:+UseSerialGC"}),
    ({}, {"JDK_JAVA_OPTIONS": "-XX:+UseShenandoahGC"}),
])
def test_a_collector_chosen_elsewhere_is_left_alone(settings: dict[str, str],
                                                   env: dict[str, str]) -> None:
    assert local_gc_options(settings, env) is None  # two collectors stop the JVM


def test_spark_defaults_conf_is_read(tmp_path: Path) -> None:
    conf = tmp_path / "spark-defaults.conf"
    conf.write_text("# admin's\nspark.driver.defaultJavaOptions  -Dadmin=1\n")
    assert local_gc_options({}, {"SPARK_CONF_DIR": str(tmp_path)}) == f"-Dadmin=1 {OURS}"
    conf.write_text("spark.driver.extraJavaOptions -XX:+UseG1GC -Xss4m\n")
    assert local_gc_options({}, {"SPARK_CONF_DIR": str(tmp_path)}) is None
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text(conf.read_text())
    assert local_gc_options({}, {"SPARK_HOME": str(tmp_path)}) is None
