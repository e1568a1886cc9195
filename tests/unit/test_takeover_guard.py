"""The take-over guard's rule (no Kafka): which members of the replaced consumer's
group mean it still runs."""

from __future__ import annotations

import pytest

from lakesink.errors import SecondWriterError
from lakesink.sources.kafka_admin import busy_members


def test_a_member_reading_the_topics_refuses_the_start() -> None:
    with pytest.raises(SecondWriterError) as refused:
        busy_members("g", ["orders"], [("old-sink", "/10.0.0.7", {"orders", "x"})],
                     stable=True)
    assert "has 1 active member(s) reading orders (old-sink on 10.0.0.7)" in str(
        refused.value)


def test_members_of_a_shared_group_on_other_topics_do_not_count() -> None:
    busy_members("g", ["orders"], [("other-deployment", "h", {"clicks"})], stable=True)
    busy_members("g", ["orders"], [], stable=False)  # empty (or dead) group


def test_a_member_with_nothing_assigned_counts_only_while_rebalancing() -> None:
    busy_members("g", ["orders"], [("spare", "h", set())], stable=True)
    with pytest.raises(SecondWriterError):
        busy_members("g", ["orders"], [("joining", "h", set())], stable=False)


# --- a new checkpoint on a Delta table other writers' txn actions fill -------------------

def test_earliest_on_a_table_with_other_writers_positions_is_refused() -> None:
    """The first-hour bug: a plain config (earliest) on a table kafka-delta-ingest wrote
    would write its rows again."""
    from lakesink.tables.takeover import start_refusal

    why = start_refusal({"web_requests-0": 9}, "earliest")
    assert why is not None and "txn web_requests-0=9" in why and "earliest" in why
    assert start_refusal({"3f2a9c": 41}, "earliest") is not None  # a lost checkpoint's id
    assert start_refusal({}, "earliest") is None  # nobody else wrote: nothing to repeat


def test_offsets_after_the_tables_start_and_latest_or_group_are_accepted() -> None:
    from lakesink.tables.takeover import start_refusal

    others = {"kdi-0": 29, "kdi-1": 5}
    assert start_refusal(others, '{"t": {"0": 30, "1": 6}}') is None
    assert start_refusal(others, "latest") is None
    assert start_refusal(others, "group") is None
    # a partition kafka-delta-ingest never wrote may start anywhere
    assert start_refusal({"kdi-0": 29}, '{"t": {"0": 30, "1": -2}}') is None


def test_offsets_at_or_before_a_partitions_recorded_position_are_refused() -> None:
    from lakesink.tables.takeover import start_refusal

    others = {"kdi-0": 29, "kdi-1": 5}
    why = start_refusal(others, '{"t": {"0": 30, "1": 5}}')
    assert why is not None and "t partition 1 would start at 5" in why
    assert "offsets up to 5" in why
    assert "start at earliest" in (start_refusal(others, '{"t": {"0": -2, "1": 6}}') or "")
