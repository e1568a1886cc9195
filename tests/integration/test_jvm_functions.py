"""lakesink's own Java functions (``jvm/udf``): registered at session start, correct on
any bytes, and skipped (with Spark's slower expression used instead) when missing."""

from __future__ import annotations

import random


def test_count_colons_matches_a_plain_count_on_random_bytes(spark) -> None:
    from pyspark.sql import functions as F

    from lakesink.decode.json import COUNT_COLONS
    from lakesink.runtime.spark import has_function

    assert has_function(spark, COUNT_COLONS)
    rng = random.Random(7)
    alphabet = [ord(":")] * 8 + list(range(256))  # colons often, and every other byte
    values: list[bytes | None] = [
        bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 70)))  # 8-byte words + tail
        for _ in range(3000)]
    values += [None, b"", b":" * 64, b":" * 67, "{\"ä\":\"é:ü\"}".encode()]
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "i int, value binary")
    got = {r["i"]: r["n"] for r in
           df.select("i", F.call_function(COUNT_COLONS, F.col("value")).alias("n")).collect()}
    assert got == {i: None if v is None else v.count(b":") for i, v in enumerate(values)}


def test_a_missing_java_function_is_skipped(spark, monkeypatch) -> None:
    from lakesink.runtime import spark as spark_mod

    monkeypatch.setattr(spark_mod, "JVM_FUNCTIONS", {
        "lakesink_test_missing": ("dev.lakesink.udf.NoSuchClass", "int")})
    assert spark_mod.register_jvm_functions(spark) == []
    assert not spark_mod.has_function(spark, "lakesink_test_missing")
