"""The Danube spool on its own (no broker, no Spark): segments roll over and are
dropped only wholly before a durable position, the state keeps what they held, a torn
or damaged tail is cut at open, damage elsewhere fails the read, positions outside the
spool fail, and a scan that goes on from its last stop counts the same."""

from __future__ import annotations

import json

import pytest

pb = pytest.importorskip("danube.proto.DanubeApi_pb2")

from lakesink.errors import SourceError  # noqa: E402
from lakesink.sources.danube_spool import Spool, count_records, read_range  # noqa: E402


def message(offset: int, *, publish_time: int = 1_000, part: str = "/default/t",
            producer: int = 7) -> object:
    return pb.StreamMessage(
        msg_id=pb.MsgID(producer_id=producer, topic_name=part, topic_offset=offset),
        payload=json.dumps({"id": offset, "pad": "x" * 40}).encode(),
        publish_time=publish_time + offset)


def ids(folder, start: int, end: int) -> list[int]:
    return [json.loads(m.payload)["id"] for m in read_range(folder, start, end)]


def test_segments_roll_over_and_drop_only_wholly_before_a_position(tmp_path) -> None:
    with Spool(tmp_path, segment_bytes=200) as spool:
        for i in range(12):
            spool.append([message(i)])
        assert len(spool.segments) > 3
        assert ids(tmp_path, 0, spool.end) == list(range(12))
        middle, n = spool.scan(0, 6)
        assert n == 6 and ids(tmp_path, 0, middle) == list(range(6))
        spool.drop_below(middle)
        assert spool.base <= middle and spool.segments[0] == spool.base
        assert ids(tmp_path, middle, spool.end) == list(range(6, 12)), "the rest is there"
        assert json.loads((tmp_path / "state.json").read_text())["base"] == spool.base
        end = spool.end
    with Spool(tmp_path, segment_bytes=200) as again:  # reopened: same end and base
        assert (again.base, again.end) == (spool.base, end)
        assert again.seen(message(11)), "the last key is known after a restart"
        assert not again.seen(message(12))


def test_the_keys_of_dropped_segments_stay_known(tmp_path) -> None:
    with Spool(tmp_path, segment_bytes=100) as spool:
        for i in range(4):
            spool.append([message(i)])
        spool.append([message(0, part="/default/t-part-1")])  # its last key, in segment 1
        for i in range(4, 8):
            spool.append([message(i)])
        spool.drop_below(spool.end)
        assert spool.segments == [spool.base] and spool.base > 0
    with Spool(tmp_path, segment_bytes=100) as again:
        assert again.seen(message(0, part="/default/t-part-1"))


def test_a_topic_made_again_is_not_taken_for_a_redelivery(tmp_path) -> None:
    with Spool(tmp_path) as spool:
        for i in range(3):
            spool.append([message(i)])
        assert spool.seen(message(2))
        assert not spool.seen(message(0, publish_time=9_000)), "offset 0 again, but new"


def test_a_torn_tail_is_cut_at_open(tmp_path) -> None:
    with Spool(tmp_path) as spool:
        for i in range(3):
            spool.append([message(i)])
        whole = spool.end
        segment = spool._path(spool.segments[-1])
    with open(segment, "ab") as out:
        out.write(b"\x00\x00\x01\x00\x12\x34")  # a header cut short, as a crash leaves it
    with Spool(tmp_path) as again:
        assert again.end == whole and segment.stat().st_size == whole
        assert ids(tmp_path, 0, again.end) == [0, 1, 2]


def test_a_damaged_last_record_is_cut_and_damage_before_it_fails_the_read(tmp_path) -> None:
    with Spool(tmp_path) as spool:
        for i in range(3):
            spool.append([message(i)])
        second, _ = spool.scan(0, 2)
        end = spool.end
        segment = spool._path(spool.segments[-1])
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF  # the last record's payload
    segment.write_bytes(bytes(data))
    with Spool(tmp_path) as again:
        assert again.end == second, "the damaged tail record is cut"
    data = bytearray(segment.read_bytes())
    data[20] ^= 0xFF  # inside the first record
    segment.write_bytes(bytes(data))
    with pytest.raises(SourceError, match="damaged"):
        ids(tmp_path, 0, second)
    with pytest.raises(SourceError, match="not all there"):
        ids(tmp_path, second, end)  # past what is left
    with pytest.raises(SourceError, match="data follows it"):
        Spool(tmp_path)  # damage before the last record: never cut in silence


def test_positions_outside_the_spool_fail(tmp_path) -> None:
    with Spool(tmp_path, segment_bytes=100) as spool:
        for i in range(6):
            spool.append([message(i)])
        spool.drop_below(spool.end)
        spool.check_position(spool.base)
        spool.check_position(spool.end)
        with pytest.raises(SourceError, match="older than its spool"):
            spool.check_position(spool.base - 1)
        with pytest.raises(SourceError, match="deleted, cut or belongs"):
            spool.check_position(spool.end + 1)


def test_a_scan_goes_on_from_its_last_stop(tmp_path) -> None:
    with Spool(tmp_path, segment_bytes=150) as spool:
        for i in range(3):
            spool.append([message(i)])
        assert spool.scan(0, 5)[1] == 3
        for i in range(3, 9):
            spool.append([message(i)])
        pos, n = spool.scan(0, 5)  # continues from the cached 3
        assert n == 5 and ids(tmp_path, 0, pos) == list(range(5))
        assert spool.scan(0, 2)[1] == 2, "a smaller bound starts over"
        until = spool.scan(0, 4)[0]
        assert spool.scan(0, 100, until) == (until, 4), "not past until"
        assert spool.scan(0, 100) == (spool.end, 9)


def test_records_are_counted_across_segments_and_not_a_torn_tail(tmp_path) -> None:
    with Spool(tmp_path, segment_bytes=150) as spool:
        spool.append([message(i) for i in range(7)])
        spool.append([message(i) for i in range(7, 10)])
        middle = spool.scan(0, 4)[0]
        end = spool.end
    assert count_records(tmp_path, 0) == (end, 10)
    assert count_records(tmp_path, middle) == (end, 6)
    assert count_records(tmp_path, 0, middle) == (middle, 4)
    assert count_records(tmp_path, 0, most=3)[1] == 3
    last = max(tmp_path.glob("*.log"))
    with open(last, "ab") as f:  # a record still being written: its head, half its data
        f.write(b"\x00\x00\x01\x00" + b"\x00" * 4 + b"x" * 100)
    assert count_records(tmp_path, 0) == (end, 10)


def test_one_writer_at_a_time(tmp_path) -> None:
    with Spool(tmp_path), pytest.raises(SourceError, match="in use by another process"):
        Spool(tmp_path, lock_timeout_s=0.2)
    spool = Spool(tmp_path, lock_timeout_s=0.2)
    spool.close()
    with pytest.raises(SourceError, match="closed"):
        spool.append([message(0)])


def test_a_drop_a_crash_interrupted_is_finished_at_open(tmp_path) -> None:
    """The state was saved, the old segments not yet deleted: the next open deletes
    them; a segment missing at the start is an error, not a silent skip."""
    with Spool(tmp_path, segment_bytes=100) as spool:
        for i in range(6):
            spool.append([message(i)])
        first = spool._path(spool.segments[0])
        kept = first.read_bytes()
        spool.drop_below(spool.end)
        base, end = spool.base, spool.end
    first.write_bytes(kept)  # as if the unlink had not happened
    with Spool(tmp_path, segment_bytes=100) as again:
        assert (again.base, again.end) == (base, end) and not first.exists()
        for i in range(6, 9):
            again.append([message(i)])
        assert len(again.segments) > 1
    again._path(again.segments[0]).unlink()
    with pytest.raises(SourceError, match="deleted by hand"):
        Spool(tmp_path, segment_bytes=100)


def test_a_group_is_written_with_one_fsync_and_read_one_by_one(tmp_path) -> None:
    with Spool(tmp_path, segment_bytes=100) as spool:
        spool.append([message(i) for i in range(5)])  # larger than a segment: one still
        spool.append([message(5)])
        assert spool.scan(0, 100) == (spool.end, 6)
        assert ids(tmp_path, 0, spool.end) == list(range(6))
        assert len(spool.segments) == 2
    with Spool(tmp_path, segment_bytes=100) as again:
        assert again.end == spool.end and again.seen(message(4))


def test_a_broker_restart_resending_acknowledged_messages_is_recognised(tmp_path) -> None:
    """A restarted broker resends from its last saved cursor, seconds behind: every
    message at or below the highest offset, published no later, was spooled already."""
    with Spool(tmp_path) as spool:
        spool.append([message(i) for i in range(40)])
        assert all(spool.seen(message(i)) for i in range(40))
        assert not spool.seen(message(40))
    with Spool(tmp_path) as again:  # known after a restart too
        assert again.seen(message(3))


def test_a_topic_made_again_is_new_whatever_the_producers_clocks(tmp_path) -> None:
    """Publish times are each producer's clock: a producer whose clock runs ahead must
    not make another producer's messages of a topic made again look like resends."""
    with Spool(tmp_path) as spool:
        spool.append([message(0, publish_time=60_000, producer=1),  # ahead by a minute
                      message(1, publish_time=0, producer=2)])
        assert spool.seen(message(1, publish_time=0, producer=2)), "a resend"
        # the topic is deleted and made again; producer 2 sends at its offset 0, later
        again = message(0, publish_time=10, producer=2)
        assert not spool.seen(again), "new: later than anything producer 2 sent"
        spool.append([again])
        assert spool.seen(again)
        assert not spool.seen(message(0, publish_time=5, producer=3)), "a new producer"


def test_the_state_of_an_earlier_version_is_read(tmp_path) -> None:
    """A state.json with one [offset, publish time] per partition (before producers
    were told apart) still recognises resends."""
    (tmp_path / "state.json").write_text(json.dumps({"base": 0,
                                                     "last": {"/default/t": [9, 1_009]}}))
    with Spool(tmp_path) as spool:
        assert spool.seen(message(9)) and not spool.seen(message(10))
        assert spool.seen(message(3, producer=8))


def test_zeros_a_crash_left_are_cut_at_open(tmp_path) -> None:
    with Spool(tmp_path) as spool:
        spool.append([message(i) for i in range(3)])
        whole, segment = spool.end, spool._path(spool.segments[-1])
    with open(segment, "ab") as out:
        out.write(bytes(4096))  # the file grew, its data never reached the disk
    with Spool(tmp_path) as again:
        assert again.end == whole and ids(tmp_path, 0, again.end) == [0, 1, 2]
    with open(segment, "ab") as out:
        out.write(bytes(8) + b"not zeros")  # an empty record with data after it
    with pytest.raises(SourceError, match="truncating the file to"):
        Spool(tmp_path)


def test_a_non_reliable_topics_messages_without_offsets_are_all_spooled(tmp_path) -> None:
    """audit-2 #3: a non-reliable topic's messages all carry offset 0 (nothing stamps
    them), and a tight loop sends several in one millisecond, identical ones too. Each
    is new: before, the second was acknowledged and dropped as "sent again". A reliable
    topic's first message (offset 0) sent again is still a resend."""
    from lakesink.sources.danube_spool import message_key

    def unstamped(n: int, publish_time: int = 5_000, producer: int = 1) -> object:
        return pb.StreamMessage(
            msg_id=pb.MsgID(producer_id=producer, topic_name="/default/t", topic_offset=0),
            payload=json.dumps({"id": n}).encode(), publish_time=publish_time)

    with Spool(tmp_path) as spool:
        first = unstamped(0, producer=9)  # a reliable topic's first message
        spool.append([first])
        assert spool.seen(unstamped(0, producer=9)), "its resend"
        one, two = unstamped(0), unstamped(1)  # the same millisecond
        assert message_key(one) != message_key(two)
        assert not spool.stamped(one)  # a received group keeps identical ones too
        spool.append([one])
        assert not spool.seen(two)
        spool.append([two])
        same = unstamped(1)  # identical to the last, the same millisecond: a new message
        assert not spool.seen(same), "no offsets: nothing is a resend"
        spool.append([same])
        assert not spool.seen(unstamped(2, publish_time=4_999)), "another producer clock"
    with Spool(tmp_path) as again:  # the state kept across a restart
        assert not again.seen(unstamped(1)) and again.seen(unstamped(0, producer=9))
