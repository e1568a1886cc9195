"""Schema evolution rules (pure Python, no JVM)."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from lakesink.decode.evolution import (
    EvolutionPolicy,
    can_widen,
    evolve,
    reconcile_declared,
    schema_record,
)
from lakesink.errors import ConfigError


def schema(**fields: T.DataType) -> T.StructType:
    return T.StructType([T.StructField(n, t, True) for n, t in fields.items()])


@pytest.mark.parametrize(("a", "b", "ok"), [
    (T.IntegerType(), T.LongType(), True),
    (T.ByteType(), T.IntegerType(), True),
    (T.FloatType(), T.DoubleType(), True),
    (T.LongType(), T.IntegerType(), False),    # narrowing
    (T.IntegerType(), T.DoubleType(), False),  # across families
    (T.LongType(), T.StringType(), False),
    (T.LongType(), T.LongType(), False),       # not a change
])
def test_can_widen(a: T.DataType, b: T.DataType, ok: bool) -> None:
    assert can_widen(a, b) is ok


def test_evolve_adds_nullable_columns_after_and_widens() -> None:
    base = T.StructType([T.StructField("id", T.LongType(), False),
                         T.StructField("n", T.IntegerType(), True)])
    new = T.StructType([T.StructField("id", T.StringType()),       # known: ignored
                        T.StructField("tag", T.StringType(), False)])
    out, changes = evolve(base, new_fields=new, widen={"n": T.LongType(), "id": T.IntegerType()})
    assert out.simpleString() == "struct<id:bigint,n:bigint,tag:string>"
    assert [f.nullable for f in out.fields] == [False, True, True]
    assert changes == ["n: int -> bigint", "+ tag string"]
    assert evolve(base) == (base, [])


def test_reconcile_declared_keeps_wider_and_added_columns() -> None:
    stored = schema(id=T.LongType(), n=T.LongType(), extra=T.StringType())
    declared = schema(id=T.LongType(), n=T.IntegerType())
    out, changes = reconcile_declared(declared, stored, EvolutionPolicy())
    assert out.simpleString() == "struct<id:bigint,n:bigint,extra:string>"
    assert changes == []
    strict, _ = reconcile_declared(declared, stored, EvolutionPolicy(mode="strict"))
    assert strict.simpleString() == "struct<id:bigint,n:bigint>"
    wider, changes = reconcile_declared(schema(f=T.DoubleType()), schema(f=T.FloatType()),
                                        EvolutionPolicy())
    assert wider.simpleString() == "struct<f:double>" and changes == [
        "f: float -> double (declared)"]


def test_reconcile_declared_refuses_an_incompatible_type() -> None:
    with pytest.raises(ConfigError) as info:
        reconcile_declared(schema(n=T.StringType()), schema(n=T.LongType()), EvolutionPolicy())
    assert info.value.key == "decode.schema"
    assert "declared string but the table already stores it as bigint" in str(info.value)


def test_schema_record_versions_only_on_change() -> None:
    first = schema_record(schema(a=T.LongType()), source="declared", declared=None,
                          previous=None, changes=["declared"])
    assert first["version"] == 1 and len(first["history"]) == 1
    same = schema_record(schema(a=T.LongType()), source="declared", declared=None,
                         previous=first)
    assert same == first
    second = schema_record(schema(a=T.LongType(), b=T.StringType()), source="declared",
                           declared=None, previous=first, changes=["+ b string"], batch_id=7)
    assert second["version"] == 2
    assert second["history"][-1]["batch_id"] == 7
    assert second["history"][-1]["changes"] == ["+ b string"]


def test_policy_flags() -> None:
    assert EvolutionPolicy().watches_unknown and not EvolutionPolicy().rejects_unknown
    reject = EvolutionPolicy(mode="strict", unknown_fields="reject")
    assert reject.rejects_unknown and not reject.watches_unknown and not reject.adds_columns
