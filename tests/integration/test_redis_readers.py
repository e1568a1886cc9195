"""The Redis readers' contracts against a real redis-server, called the way Spark calls
them (driver: offsets and commit; tasks: read), without Spark: replay reads the same
records, nothing is acknowledged, trimmed or deleted before ``commit``, and a reader
that starts again after a crash takes what the crashed one had taken."""

from __future__ import annotations

import itertools
import json

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from lakesink.errors import SourceError
from lakesink.sources.redis_lists import RedisListsReader, names, owner_key
from lakesink.sources.redis_positions import next_id, parse_id, previous_id
from lakesink.sources.redis_streams import RedisStreamsReader

pytestmark = [pytest.mark.integration, pytest.mark.redis]
_n = itertools.count()


@pytest.fixture()
def key(request: pytest.FixtureRequest) -> str:
    return f"k{next(_n)}-{request.node.name[:30]}"


def options(server, keys: list[str], **extra: str) -> dict[str, str]:
    return {"host": "127.0.0.1", "port": str(server.port), "db": "0", "keys": json.dumps(keys),
            "value_field": "data", "key_field": "k", **extra}


def ids(reader, start: dict, end: dict) -> list[int]:
    out = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            out.extend(json.loads(v)["id"] for v in batch.column("value").to_pylist())
    return out


def add(server, key: str, rng: range) -> list[str]:
    client = server.client()
    return [client.xadd(key, {"data": json.dumps({"id": i}), "k": str(i)}).decode()
            for i in rng]


def read_all(server, key: str) -> tuple[list[str], RedisStreamsReader, dict, dict]:
    """Ten entries read in one batch and committed: (their ids, the reader, the batch's
    start and end)."""
    entry_ids = add(server, key, range(10))
    reader = RedisStreamsReader(options(server, [key]))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert ids(reader, start, end) == list(range(10))
    reader.commit(end)
    return entry_ids, reader, start, end


def promote(server, key: str, entries: list[tuple[int, str]]) -> None:
    """The stream as a promoted replica holds it: ``entries`` (the record id each
    carries, and the entry's id), nothing else."""
    client = server.client()
    client.delete(key)
    for i, entry_id in entries:
        client.xadd(key, {"data": json.dumps({"id": i}), "k": str(i)}, id=entry_id)


def test_stream_batches_replay_and_limits(redis_server, key) -> None:
    add(redis_server, key, range(25))
    reader = RedisStreamsReader(options(redis_server, [key]))
    start = reader.initialOffset()
    seen = []
    for _ in range(3):
        end = reader.latestOffset(start, ReadMaxRows(10))
        batch = ids(reader, start, end)
        assert batch == ids(reader, start, end), "a replayed batch reads the same entries"
        assert len(batch) <= 10
        seen += batch
        reader.commit(end)
        start = end
    assert seen == list(range(25))
    assert reader.latestOffset(start, ReadAllAvailable()) == start, "nothing new: same offset"
    assert redis_server.client().xlen(key) == 25, "nothing trimmed without trim_on_commit"


def test_the_group_moves_and_acks_only_in_commit(redis_server, key) -> None:
    """The group mirrors durable progress: its last delivered id and entries read move to
    a batch's end only in ``commit``; entries an earlier consumer left pending up to it
    are acknowledged then, later ones stay pending."""
    entry_ids = add(redis_server, key, range(30))
    client = redis_server.client()
    client.xgroup_create(key, "g", id="0")
    client.xreadgroup("g", "earlier", {key: ">"}, count=15)  # pending: 0..14
    client.xgroup_setid(key, "g", "0-0")  # the earlier consumer's progress never counted
    reader = RedisStreamsReader(options(redis_server, [key], group="g"))
    start = reader.initialOffset()
    assert start[key]["id"] == previous_id(entry_ids[0]), "before the oldest pending entry"
    end = reader.latestOffset(start, ReadMaxRows(10))
    group = client.xinfo_groups(key)[0]
    assert group["last-delivered-id"] == b"0-0" and client.xpending(key, "g")["pending"] == 15
    assert client.xpending_range(key, "g", "-", "+", 1)[0]["consumer"] == b"earlier"
    assert ids(reader, start, end) == list(range(10))
    reader.commit(end)
    group = client.xinfo_groups(key)[0]
    assert group["last-delivered-id"].decode() == entry_ids[9] == end[key]["id"]
    assert client.xpending(key, "g")["pending"] == 5, "only entries up to the end acked"
    rest = reader.latestOffset(end, ReadAllAvailable())
    reader.commit(rest)
    assert client.xpending(key, "g")["pending"] == 0
    group = client.xinfo_groups(key)[0]
    assert (group["entries-read"], group["lag"]) == (30, 0), "XINFO GROUPS shows the progress"


def test_a_new_checkpoint_resumes_where_an_existing_group_is(redis_server, key) -> None:
    """Moving from a consumer that used the group (the FS Data Sink): start after the
    group's last delivered entry, or before its oldest pending one."""
    entry_ids = add(redis_server, key, range(20))
    client = redis_server.client()
    client.xgroup_create(key, "fds", id="0")
    client.xreadgroup("fds", "old", {key: ">"}, count=12)
    client.xack(key, "fds", *entry_ids[:8])  # 8..11 pending: delivered, never written
    reader = RedisStreamsReader(options(redis_server, [key], group="fds"))
    start = reader.initialOffset()
    assert ids(reader, start, reader.latestOffset(start, ReadAllAvailable())) == list(
        range(8, 20))


def test_trim_on_commit_removes_only_committed_entries(redis_server, key) -> None:
    add(redis_server, key, range(10))
    reader = RedisStreamsReader(options(redis_server, [key], trim_on_commit="true"))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(4))
    assert redis_server.client().xlen(key) == 10
    reader.commit(end)
    assert redis_server.client().xlen(key) == 6
    assert ids(reader, end, reader.latestOffset(end, ReadAllAvailable())) == list(range(4, 10))


def test_entries_deleted_before_they_were_read_fail_the_query(redis_server, key) -> None:
    entry_ids = add(redis_server, key, range(10))
    reader = RedisStreamsReader(options(redis_server, [key]))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(3))
    redis_server.client().xdel(key, entry_ids[5])
    with pytest.raises(SourceError, match=r"were deleted \(XDEL.*before they were read"):
        reader.latestOffset(end, ReadAllAvailable())
    lenient = RedisStreamsReader(options(redis_server, [key], fail_on_data_loss="false"))
    assert ids(lenient, end, lenient.latestOffset(end, ReadAllAvailable())) == [3, 4, 6, 7, 8,
                                                                                9]


def test_a_stream_behind_the_position_fails_instead_of_skipping_new_entries(redis_server,
                                                                          key) -> None:
    """audit-2 #17: a failover to a replica that lacked the newest entries, whose clock
    is behind: its new entries get ids at or below the checkpoint's position, and a read
    after the position never returns them (they were skipped silently). The stream's
    last id behind the position now fails the query (``fail_on_data_loss``)."""
    entry_ids, reader, _, end = read_all(redis_server, key)
    promote(redis_server, key, list(enumerate(entry_ids[:6])))  # entries 0..5 only
    client = redis_server.client()
    ms, seq = parse_id(entry_ids[5])
    new = client.xadd(key, {"data": json.dumps({"id": 10}), "k": "10"}, id=f"{ms}-{seq + 1}")
    assert parse_id(new.decode()) <= parse_id(end[key]["id"])  # at or below the position
    with pytest.raises(SourceError, match=r"last entry id .* is before the checkpoint's"):
        reader.latestOffset(end, ReadAllAvailable())
    lenient = RedisStreamsReader(options(redis_server, [key], fail_on_data_loss="false"))
    assert lenient.latestOffset(end, ReadAllAvailable()) == end  # said, and skipped


def test_a_replica_that_caught_up_to_the_position_with_new_entries_fails(redis_server, key,
                                                                       caplog) -> None:
    """The failover of the test above, once the promoted replica's new entries reached
    the position: its last id and its count equal the checkpoint's again, so neither
    tells; the entry at the position is not the one that was read (its fields'
    fingerprint, kept in the offset, differs). The new entries at or below the position
    were skipped silently before. An entry at the position gone is only a warning."""
    entry_ids, reader, _, end = read_all(redis_server, key)
    promote(redis_server, key, [*enumerate(entry_ids[:6]),  # entries 0..5, then 6..9 anew
                                *enumerate(entry_ids[6:], start=10)])
    client = redis_server.client()
    info = client.xinfo_stream(key)
    assert (info["last-generated-id"].decode(), info["entries-added"]) == \
        (end[key]["id"], end[key]["n"])  # nothing but the entries tells
    with pytest.raises(SourceError, match=r"entry at the checkpoint's position .* is not"):
        reader.latestOffset(end, ReadAllAvailable())
    lenient = RedisStreamsReader(options(redis_server, [key], fail_on_data_loss="false"))
    assert lenient.latestOffset(end, ReadAllAvailable()) == end  # said, and skipped

    # a replica with entries 0..7, then one past the position: the entry at the
    promote(redis_server, key, list(enumerate(entry_ids[:8])))  # position is missing;
    client.xadd(key, {"data": json.dumps({"id": 20}), "k": "20"},  # most such failovers
                id=next_id(end[key]["id"]))  # skip nothing (and Redis 8.2's ACKED trims
    with caplog.at_level("WARNING", logger="lakesink.sources.redis_streams"):  # look
        later = reader.latestOffset(end, ReadAllAvailable())  # the same): a warning
        reader.latestOffset(end, ReadAllAvailable())
    assert len([r for r in caplog.records if "is gone" in r.message]) == 1  # once
    assert ids(reader, end, later) == [20]

    # what is not a loss: the stream as it was, the entry at the position deleted
    promote(redis_server, key, list(enumerate(entry_ids)))  # (XDEL) or trimmed
    add(redis_server, key, range(10, 12))
    assert ids(reader, end, reader.latestOffset(end, ReadAllAvailable())) == [10, 11]
    client.xdel(key, end[key]["id"])
    assert ids(reader, end, reader.latestOffset(end, ReadAllAvailable())) == [10, 11]
    client.xtrim(key, minid=next_id(end[key]["id"]), approximate=False)
    assert ids(reader, end, reader.latestOffset(end, ReadAllAvailable())) == [10, 11]


def test_entries_trimmed_by_a_producer_before_they_were_read_fail_the_query(
        redis_server, key) -> None:
    add(redis_server, key, range(10))
    reader = RedisStreamsReader(options(redis_server, [key]))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(3))
    reader.commit(end)
    add(redis_server, key, range(10, 12))
    assert reader.latestOffset(end, ReadMaxRows(3)) != end  # no loss yet
    redis_server.client().xtrim(key, maxlen=4, approximate=False)  # 3..7 gone unread
    with pytest.raises(SourceError, match=r"were trimmed \(5 entries\)"):
        reader.latestOffset(end, ReadAllAvailable())


def test_a_trim_past_the_position_of_a_group_start_with_pending_entries_fails(
        redis_server, key) -> None:
    """audit-2 #6: a new checkpoint on a group with pending entries starts before the
    oldest one; its count was unknown (-1), so capped batches never proved it and a
    producer's MAXLEN trim past the position lost entries without an error. The count is
    now the group's entries-read less the pending range."""
    client = redis_server.client()
    client.xgroup_create(key, "g", id="$", mkstream=True)
    add(redis_server, key, range(1))
    client.xreadgroup("g", "crashed", {key: ">"}, count=1)  # entry 0 pending, never acked
    add(redis_server, key, range(1, 50))
    reader = RedisStreamsReader(options(redis_server, [key], group="g"))
    start = reader.initialOffset()
    assert start[key]["n"] == 0, start  # known: nothing before the pending entry
    end = reader.latestOffset(start, ReadMaxRows(10))
    assert ids(reader, start, end) == list(range(10)) and end[key]["n"] == 10
    reader.commit(end)
    client.xadd(key, {"data": json.dumps({"id": 50}), "k": "50"}, maxlen=30,
                approximate=False)  # 10..20 gone unread
    with pytest.raises(SourceError, match=r"were trimmed \(11 entries\)"):
        reader.latestOffset(end, ReadMaxRows(10))


def test_a_pending_entry_past_the_groups_last_delivered_one_leaves_the_count_unknown(
        redis_server, key) -> None:
    """A group moved back (XGROUP SETID) behind its pending entries: the pending range
    is empty up to the last delivered entry, so entries-read says nothing about the
    position before the oldest pending one; a count taken from it would be too small
    and later report a trim that never happened."""
    entry_ids = add(redis_server, key, range(10))
    client = redis_server.client()
    client.xgroup_create(key, "g", id="0", entries_read=0)
    client.xreadgroup("g", "c", {key: ">"}, count=5)  # 0..4 pending
    client.xack(key, "g", *entry_ids[:3])  # 3, 4 still pending
    client.xgroup_setid(key, "g", entry_ids[1], entries_read=2)
    reader = RedisStreamsReader(options(redis_server, [key], group="g"))
    start = reader.initialOffset()
    assert start[key] == {"id": previous_id(entry_ids[3]), "n": -1, "d": "0-0"}, start
    assert ids(reader, start, reader.latestOffset(start, ReadAllAvailable())) == list(
        range(3, 10))


def test_a_trim_between_the_position_check_and_the_page_read_is_found(
        redis_server, key, monkeypatch) -> None:
    """audit-2 #6: a producer trimming while a capped batch reads its page left the
    batch's count unknown (-1) from then on, and later trims past the position went
    unseen. The loss check runs again instead: a trim that took unread entries fails the
    query; one that took only read entries keeps the count."""
    add(redis_server, key, range(40))
    reader = RedisStreamsReader(options(redis_server, [key]))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(10))
    reader.commit(end)
    client = redis_server.client()
    real = type(reader.client).xrange
    trim_to: list[int] = []

    def trimming_xrange(self, name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if trim_to and "count" in kwargs:  # a producer's MAXLEN trim, just before the
            # page is read (not the read of the entry at the position)
            client.xtrim(key, maxlen=trim_to.pop(), approximate=False)
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(type(reader.client), "xrange", trimming_xrange)
    trim_to.append(35)  # only entries 0..4, read already, go
    second = reader.latestOffset(end, ReadMaxRows(10))
    assert second[key]["n"] == 20, second  # the count stays known
    trim_to.append(15)  # 10..24: 10 unread entries of the next page go
    with pytest.raises(SourceError, match=r"were trimmed"):
        reader.latestOffset(end, ReadMaxRows(10))


def test_earliest_after_a_deleted_entry_and_latest_after_a_deleted_last_one(redis_server, key
                                                                           ) -> None:
    entry_ids = add(redis_server, key, range(10))
    client = redis_server.client()
    client.xdel(key, entry_ids[5], entry_ids[9])
    reader = RedisStreamsReader(options(redis_server, [key]))
    start = reader.initialOffset()
    assert ids(reader, start, reader.latestOffset(start, ReadAllAvailable())) == [
        0, 1, 2, 3, 4, 6, 7, 8]
    latest = RedisStreamsReader(options(redis_server, [key], starting_position="latest"))
    at = latest.initialOffset()
    assert latest.latestOffset(at, ReadAllAvailable()) == at, "no loss, nothing new"
    add(redis_server, key, range(10, 12))
    assert ids(latest, at, latest.latestOffset(at, ReadAllAvailable())) == [10, 11]


def test_a_key_added_to_the_configuration_joins_without_a_batch(redis_server, key) -> None:
    """A stream or list added to a running checkpoint joins at its starting position
    with nothing read in that batch; the next batch reads from there."""
    other = key + "-new"
    add(redis_server, key, range(3))
    add(redis_server, other, range(100, 105))
    before = RedisStreamsReader(options(redis_server, [key]))
    start = before.initialOffset()
    end = before.latestOffset(start, ReadAllAvailable())
    after = RedisStreamsReader(options(redis_server, [key, other], starting_position="latest"))
    joined = after.latestOffset(end, ReadAllAvailable())
    assert other in joined and ids(after, end, joined) == []
    add(redis_server, other, range(105, 107))
    assert ids(after, joined, after.latestOffset(joined, ReadAllAvailable())) == [105, 106]
    push(redis_server, other + "-l", range(4))
    lists = RedisListsReader(options(redis_server, [other + "-l"]))
    old_start = {"gone": 0}  # the offsets of a checkpoint from before the list was added
    first = lists.latestOffset(old_start, lists.getDefaultReadLimit())
    assert ids(lists, old_start, first) == [] and redis_server.client().llen(other + "-l") == 4
    assert ids(lists, first, lists.latestOffset(first, lists.getDefaultReadLimit())) == [
        0, 1, 2, 3]


def test_a_stream_removed_and_added_back_goes_on_from_its_position(redis_server,
                                                                   key) -> None:
    """audit-2 #7: a stream taken out of the configuration and put back was read again
    from starting_position (earliest: its rows twice). Its position stays in the
    offsets while it is out, and it goes on from there."""
    other = key + "-b"
    add(redis_server, key, range(3))
    add(redis_server, other, range(100, 110))
    both = RedisStreamsReader(options(redis_server, [key, other]))
    start = both.initialOffset()
    read = both.latestOffset(start, ReadAllAvailable())
    assert sorted(ids(both, start, read)) == [0, 1, 2, *range(100, 110)]
    alone = RedisStreamsReader(options(redis_server, [key]))
    add(redis_server, key, range(3, 5))
    out = alone.latestOffset(read, ReadAllAvailable())
    assert other in out and ids(alone, read, out) == [3, 4]
    add(redis_server, other, range(110, 112))
    back = RedisStreamsReader(options(redis_server, [key, other]))
    assert ids(back, out, back.latestOffset(out, ReadAllAvailable())) == [110, 111]


def test_a_trimmed_stream_read_from_the_start_is_no_loss(redis_server, key) -> None:
    add(redis_server, key, range(10))
    redis_server.client().xtrim(key, maxlen=4, approximate=False)
    reader = RedisStreamsReader(options(redis_server, [key]))
    start = reader.initialOffset()
    assert ids(reader, start, reader.latestOffset(start, ReadAllAvailable())) == [6, 7, 8, 9]


def test_available_now_stops_at_what_was_there(redis_server, key) -> None:
    add(redis_server, key, range(5))
    reader = RedisStreamsReader(options(redis_server, [key]))
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    add(redis_server, key, range(5, 9))
    end = reader.latestOffset(start, ReadAllAvailable())
    assert ids(reader, start, end) == list(range(5))
    assert reader.latestOffset(end, ReadAllAvailable()) == end


def push(server, key: str, rng: range) -> None:
    server.client().rpush(key, *[json.dumps({"id": i}) for i in rng])


def test_list_items_move_once_and_leave_only_in_commit(redis_server, key) -> None:
    push(redis_server, key, range(12))
    client = redis_server.client()
    reader = RedisListsReader(options(redis_server, [key], max_records="5"))
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert client.llen(key) == 7
    # the driver crashes before Spark logs the offsets; it asks again from the same start
    restarted = RedisListsReader(options(redis_server, [key], max_records="5"))
    assert restarted.latestOffset(start, restarted.getDefaultReadLimit()) == end
    assert client.llen(key) == 7, "the batch's items are taken again, no more moved"
    assert ids(restarted, start, end) == ids(restarted, start, end) == list(range(5))
    lists, index = names("lakesink:", key, "lakesink")
    restarted.commit(end)
    assert not client.exists(f"{lists}{end[key]}") and not client.hlen(index)
    rest = restarted.latestOffset(end, restarted.getDefaultReadLimit())
    assert ids(restarted, end, rest) == list(range(5, 10))


def test_a_list_move_goes_on_only_once_its_replicas_have_it(redis_server, key, tmp_path
                                                          ) -> None:
    """audit-2 #17 (lists): Redis replicates asynchronously, so a failover right after
    a move can lose it while the batch's items are written: the new master hands them
    out again (duplicates). With ``wait_replicas`` a move is followed by WAIT, and a
    move no replica has stops the run before its items are written; the restart takes
    the same items from their processing list, once a replica has them."""
    import time

    from lakesink.local.redisserver import RedisServer

    push(redis_server, key, range(6))
    opts = options(redis_server, [key], max_records="3", wait_replicas="1",
                   wait_timeout_ms="200")
    reader = RedisListsReader(opts)
    start = reader.initialOffset()
    with pytest.raises(SourceError, match=r"reached 0 of source.redis.wait_replicas=1"):
        reader.latestOffset(start, reader.getDefaultReadLimit())
    replica = RedisServer(work_dir=tmp_path / "replica").start()
    try:
        replica.client().replicaof("127.0.0.1", redis_server.port)
        deadline = time.monotonic() + 30
        while replica.client().info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.1)
        restarted = RedisListsReader(opts)
        end = restarted.latestOffset(start, restarted.getDefaultReadLimit())
        lists, _ = names("lakesink:", key, "lakesink")
        assert [json.loads(v)["id"] for v in replica.client().lrange(
            f"{lists}{end[key]}", 0, -1)] == [0, 1, 2]  # the replica has the move
        assert ids(restarted, start, end) == [0, 1, 2]
        assert redis_server.client().llen(key) == 3  # the same batch, nothing more moved
    finally:
        replica.stop()


def test_a_lost_checkpoint_reads_the_processing_lists_first(redis_server, key) -> None:
    push(redis_server, key, range(8))
    reader = RedisListsReader(options(redis_server, [key], max_records="3"))
    start = reader.initialOffset()
    reader.latestOffset(start, reader.getDefaultReadLimit())  # taken, never committed
    fresh = RedisListsReader(options(redis_server, [key], max_records="3"))
    begin = fresh.initialOffset()
    seen, at = [], begin
    while (end := fresh.latestOffset(at, fresh.getDefaultReadLimit())) != at:
        seen += ids(fresh, at, end)
        fresh.commit(end)
        at = end
    assert seen == list(range(8))


def test_a_second_deployment_with_the_same_consumer_is_refused(redis_server, key) -> None:
    """Two checkpoints, one consumer name: the second must not take the first's
    processing list as its own batch (both would write its items); a checkpoint made
    again at the same place is the same owner and reads it first."""
    push(redis_server, key, range(6))
    first = RedisListsReader(options(redis_server, [key], max_records="3", owner="/ck/a"))
    start = first.initialOffset()
    end = first.latestOffset(start, first.getDefaultReadLimit())  # taken, not committed
    other = RedisListsReader(options(redis_server, [key], max_records="3", owner="/ck/b"))
    with pytest.raises(SourceError, match="consumer_name 'lakesink' is used by the "
                                          "deployment with checkpoint /ck/a"):
        other.latestOffset(other.initialOffset(), other.getDefaultReadLimit())
    assert redis_server.client().llen(key) == 3, "the refused one moved nothing"
    again = RedisListsReader(options(redis_server, [key], max_records="3", owner="/ck/a"))
    begin = again.initialOffset()
    assert again.latestOffset(begin, again.getDefaultReadLimit()) == end
    assert ids(again, begin, end) == [0, 1, 2]
    other.commit({key: 5000})  # the refused one settling: deletes none of /ck/a's lists
    lists, _ = names("lakesink:", key, "lakesink")
    assert redis_server.client().llen(f"{lists}{end[key]}") == 3
    again.commit(end)  # nothing in flight: nothing to take over, the owner key goes
    assert not redis_server.client().exists(owner_key("lakesink:", key, "lakesink"))


def test_list_available_now_takes_only_what_was_there(redis_server, key) -> None:
    push(redis_server, key, range(4))
    reader = RedisListsReader(options(redis_server, [key], max_records="3"))
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    push(redis_server, key, range(4, 6))
    seen, at = [], start
    while (end := reader.latestOffset(at, reader.getDefaultReadLimit())) != at:
        seen += ids(reader, at, end)
        at = end
    assert seen == [0, 1, 2, 3]
    assert redis_server.client().llen(key) == 2


def test_a_group_start_after_old_deletes_and_trims_is_no_false_alarm(redis_server, key
                                                                      ) -> None:
    """A group at entry 5, entry 6 deleted and entries up to 5 trimmed before the
    checkpoint started: nothing unread is missing, so nothing may fail."""
    entry_ids = add(redis_server, key, range(10))
    client = redis_server.client()
    client.xgroup_create(key, "g", id=entry_ids[4], entries_read=5)
    client.xdel(key, entry_ids[5])
    client.xtrim(key, minid=entry_ids[6], approximate=False)
    reader = RedisStreamsReader(options(redis_server, [key], group="g"))
    start = reader.initialOffset()
    assert ids(reader, start, reader.latestOffset(start, ReadAllAvailable())) == [6, 7, 8, 9]


def test_a_replayed_batch_whose_entries_are_gone_fails_instead_of_reading_fewer(
        redis_server, key) -> None:
    entry_ids = add(redis_server, key, range(10))
    reader = RedisStreamsReader(options(redis_server, [key]))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(6))
    redis_server.client().xdel(key, entry_ids[2])  # after the offsets were logged
    with pytest.raises(SourceError, match="deleted"):
        reader.partitions(start, end)


def test_lag_is_what_the_stream_and_the_list_hold_beyond_the_batch(redis_server, key) -> None:
    from lakesink.sources.offsets import lag

    add(redis_server, key, range(30))
    streams = RedisStreamsReader(options(redis_server, [key], max_records="10"))
    start = streams.initialOffset()
    end = streams.latestOffset(start, streams.getDefaultReadLimit())
    assert lag(end, streams.reportLatestOffset()) == {(key, ""): 20}
    add(redis_server, key, range(30, 35))
    assert lag(end, streams.reportLatestOffset()) == {(key, ""): 25}

    listed = f"{key}:list"
    push(redis_server, listed, range(12))
    lists = RedisListsReader(options(redis_server, [listed], max_records="5"))
    start = lists.initialOffset()
    end = lists.latestOffset(start, lists.getDefaultReadLimit())
    assert lag(end, lists.reportLatestOffset()) == {(listed, ""): 7}
    lists.commit(end)  # taken items no longer count, committed or not
    assert lag(end, lists.reportLatestOffset()) == {(listed, ""): 7}
