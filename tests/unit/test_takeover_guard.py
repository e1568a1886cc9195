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
