"""The writer lease protocol on a store double (no JVM): every step is a
create-if-absent, staleness is watched on the taker's own clock, a writer that lost its
lease (or cannot renew it) is stopped before its next commit (issue 17 scenarios 5, 6)."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any

import pytest

from lakesink.tables import lease as lease_module
from lakesink.tables.lease import LeaseLost, SecondWriterError, WriterLease


@dataclass(frozen=True)
class _Info:
    path: str
    relative: str


class Store:
    """Files in a dict; ``write_once`` is the store's create-if-absent."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def write_once(self, path: str, text: str) -> bool:
        if path in self.files:
            return False
        self.files[path] = text
        return True

    def read_json(self, path: str) -> Any:  # noqa: ANN401
        return json.loads(self.files[path]) if path in self.files else None

    def list_files(self, folder: str, suffix: str = "") -> list[_Info]:
        return sorted((_Info(p, p[len(folder) + 1:]) for p in self.files
                       if p.startswith(folder + "/") and p.endswith(suffix)),
                      key=lambda f: f.relative)

    def delete(self, path: str, recursive: bool = True) -> bool:  # noqa: ARG002
        return self.files.pop(path, None) is not None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.on_sleep: list[Any] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        for hook in self.on_sleep:
            hook()


FOLDER = "/lake/.lakesink/t/writer"


def make(store: Store, clock: Clock, ttl_s: float = 60) -> WriterLease:
    return WriterLease(store, FOLDER, app_id="app", ttl_s=ttl_s, table="/lake/t",
                       clock=clock, sleep=clock.sleep)


def foreign(store: Store, seq: int, **fields: Any) -> None:
    """A lease step written by another process (another host unless said)."""
    record = {"writer": "other", "app_id": "x", "host": "elsewhere", "pid": 1, "ttl_s": 6,
              "released": False, **fields}
    assert store.write_once(f"{FOLDER}/lease-{seq:012d}.json", json.dumps(record))


@pytest.fixture(autouse=True)
def _no_renew_thread(monkeypatch: pytest.MonkeyPatch) -> Any:  # noqa: ANN401
    # the background renewal is driven by hand here
    monkeypatch.setattr(WriterLease, "_renew_loop", lambda self: None)
    yield
    lease_module._HELD.clear()  # a failed test must not leave its lease "held"


def test_acquire_renew_release_then_the_next_writer_goes_on_at_once() -> None:
    store, clock = Store(), Clock()
    first = make(store, clock)
    first.acquire()
    assert first.renew() and first.renew()
    first.release()
    assert store.read_json(first._path(3))["released"] is True
    second = make(store, clock)
    started = clock.now
    second.acquire()
    assert clock.now == started  # no wait after a release
    assert second.seq == 4
    second.release()


def test_a_second_writer_in_this_process_is_refused_at_once() -> None:
    store, clock = Store(), Clock()
    first = make(store, clock)
    first.acquire()
    try:
        with pytest.raises(SecondWriterError, match="held in this process"):
            make(store, clock).acquire()
    finally:
        first.release()


def test_a_live_holder_elsewhere_is_refused_when_it_renews() -> None:
    store, clock = Store(), Clock()
    foreign(store, 5)
    clock.on_sleep.append(lambda: clock.now > 1002 and foreign(store, 6)
                          if f"{FOLDER}/lease-{6:012d}.json" not in store.files else None)
    with pytest.raises(SecondWriterError, match="host elsewhere"):
        make(store, clock).acquire()
    assert clock.now - 1000 < 6  # refused at the renewal, not after a TTL


def test_a_holder_that_stops_renewing_is_taken_over_after_its_ttl_on_our_clock() -> None:
    store, clock = Store(), Clock()
    # its own clock says it renewed "in the future": no clock is compared
    foreign(store, 5, at=10**12)
    taker = make(store, clock)
    taker.acquire()
    assert taker.seq == 6 and clock.now - 1000 >= 6
    taker.release()


def test_a_restarted_container_with_the_same_host_and_pid_takes_its_lease_back() -> None:
    store, clock = Store(), Clock()
    foreign(store, 2, host=socket.gethostname(), pid=os.getpid(), ttl_s=600,
            pidns=lease_module.PID_NAMESPACE, boot=lease_module.BOOT_ID)
    again = make(store, clock)
    again.acquire()
    assert again.seq == 3 and clock.now == 1000  # at once, not after 600 s
    again.release()


def test_pids_of_another_pid_namespace_on_this_host_are_not_judged() -> None:
    """Containers sharing a host name (host networking) each have their own pid 1: a
    lease of another namespace is watched for its TTL, never taken at once."""
    store, clock = Store(), Clock()
    foreign(store, 2, host=socket.gethostname(), pid=os.getpid(), ttl_s=6,
            pidns="pid:[1]")
    lease = make(store, clock)
    lease.acquire()
    assert lease.seq == 3 and clock.now - 1000 >= 6
    lease.release()


def test_the_same_host_pid_and_namespace_number_of_another_boot_are_not_judged() -> None:
    """audit-2 #23: a StatefulSet pod rescheduled to another node keeps its host name
    and pid 1, and its pid namespace's inode number may repeat there: its lease is
    watched for its TTL (the old pod may still be alive), never taken at once."""
    store, clock = Store(), Clock()
    foreign(store, 2, host=socket.gethostname(), pid=os.getpid(), ttl_s=6,
            pidns=lease_module.PID_NAMESPACE, boot="another-machine")
    lease = make(store, clock)
    lease.acquire()
    assert lease.seq == 3 and clock.now - 1000 >= 6
    lease.release()


def test_a_lease_of_a_dead_process_on_this_host_is_taken_at_once(tmp_path) -> None:  # noqa: ANN001
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store, clock = Store(), Clock()
    foreign(store, 0, host=socket.gethostname(), pid=dead.pid, ttl_s=600,
            pidns=lease_module.PID_NAMESPACE, boot=lease_module.BOOT_ID)
    lease = make(store, clock)
    lease.acquire()
    assert lease.seq == 1 and clock.now == 1000
    lease.release()


def test_a_writer_whose_lease_was_taken_stops_before_its_next_commit() -> None:
    """Scenario 5: renewal used to overwrite blindly, so a writer paused past the TTL
    kept committing after another took the table."""
    store, clock = Store(), Clock()
    holder = make(store, clock, ttl_s=6)
    holder.acquire()
    assert holder.seq == 0
    clock.now += 10  # a pause longer than the TTL: another process took over
    foreign(store, 1, host="newhost")
    with pytest.raises(LeaseLost):
        holder.check()  # the renewal it tries finds step 1 taken
    assert holder.lost
    assert not holder.renew()
    holder.release()  # writes nothing: the lease is not ours
    assert store.read_json(f"{FOLDER}/lease-{1:012d}.json")["host"] == "newhost"
    assert f"{FOLDER}/lease-{2:012d}.json" not in store.files


def test_a_late_check_renews_when_nobody_took_over() -> None:
    store, clock = Store(), Clock()
    holder = make(store, clock, ttl_s=6)
    holder.acquire()
    clock.now += 5  # renewals stalled (storage outage) but no taker came
    holder.check()  # renews right then, so the commit may go on
    assert holder.seq == 1
    holder.release()


def test_a_check_that_cannot_reach_the_store_stops_the_commit(monkeypatch) -> None:  # noqa: ANN001
    store, clock = Store(), Clock()
    holder = make(store, clock, ttl_s=6)
    holder.acquire()
    clock.now += 5

    def down(path: str, text: str) -> bool:
        raise OSError("store unreachable")

    monkeypatch.setattr(store, "write_once", down)
    # not LeaseLost (which stops the query for good): the batch fails like any storage
    # error and is retried once the store is back
    with pytest.raises(OSError, match="store unreachable"):
        holder.check()
    monkeypatch.undo()
    holder.check()  # the store is back: the retry's check renews
    assert not holder.lost
    holder.release()


def test_a_renewal_whose_create_landed_before_the_store_failed_is_still_ours(
        monkeypatch) -> None:  # noqa: ANN001
    """CI (stop 25): the store went down between a renewal's create and the listing
    after it. The next renewal found "its" step taken -- by itself -- and the writer
    declared its lease lost and stopped for good."""
    store, clock = Store(), Clock()
    holder = make(store, clock, ttl_s=6)
    holder.acquire()
    listing = store.list_files

    def down_after_create(folder: str, suffix: str = "") -> list:  # noqa: ANN401
        raise OSError("store unreachable")

    monkeypatch.setattr(store, "list_files", down_after_create)
    with pytest.raises(OSError):
        holder.renew()
    assert sorted(store.files) == [f"{FOLDER}/lease-000000000000.json",
                                   f"{FOLDER}/lease-000000000001.json"]
    monkeypatch.setattr(store, "list_files", listing)
    clock.now += 5
    holder.check()  # renews: step 1 is its own, so step 2 comes next
    assert not holder.lost and holder.seq == 2
    holder.release()


def test_an_adopted_old_step_is_not_a_fresh_renewal(monkeypatch) -> None:  # noqa: ANN001
    """Review: a writer that adopted its own step of an earlier (failed) call used to
    count it as renewed *now*, while a taker had been watching that step since it was
    made: the taker took over at its TTL and the old writer's checks still passed for
    two thirds of a TTL -- two writers on one table. The adoption now renews at once,
    so the taker sees a newer step and is refused."""
    store, clock = Store(), Clock()
    holder = make(store, clock, ttl_s=6)
    holder.acquire()
    listing = store.list_files

    def down_after_create(folder: str, suffix: str = "") -> list:  # noqa: ANN401
        raise OSError("store unreachable")

    monkeypatch.setattr(store, "list_files", down_after_create)
    with pytest.raises(OSError):
        holder.renew()  # step 1 created at t=0, the listing after it failed
    monkeypatch.setattr(store, "list_files", listing)
    taker = WriterLease(store, FOLDER, app_id="app", ttl_s=6, table="/lake/t",
                        clock=clock, sleep=clock.sleep)
    steps: list[Any] = []

    def holder_returns_at_5() -> None:  # the taker watches step 1 from t=0
        if clock.now >= 1005 and not steps:
            steps.append(holder.check())  # adopts step 1, renews with step 2

    clock.on_sleep.append(holder_returns_at_5)
    # the taker is another process on another host
    with monkeypatch.context() as other, pytest.raises(SecondWriterError,
                                                       match="it renewed its lease"):
        other.setattr(lease_module, "_HELD", {})
        other.setattr(lease_module.socket, "gethostname", lambda: "elsewhere")
        taker.acquire()  # the holder renewed while it watched
    assert steps and holder.seq == 2 and not holder.lost
    clock.now += 1.5
    holder.check()  # still the only writer
    holder.release()


def test_two_takers_of_one_stale_lease_cannot_both_win() -> None:
    store, clock = Store(), Clock()
    foreign(store, 7)
    a = make(store, clock)
    # b takes step 8 between a's watch and a's step: a must see it and not hold
    original = a._step

    def racing(seq: int, *, released: bool = False) -> bool:
        if seq == 8 and f"{FOLDER}/lease-{8:012d}.json" not in store.files:
            foreign(store, 8, host="b")
        return original(seq, released=released)

    a._step = racing  # type: ignore[method-assign]
    # b is alive: it renews while a watches its step 8
    clock.on_sleep.append(lambda: f"{FOLDER}/lease-{8:012d}.json" in store.files
                          and f"{FOLDER}/lease-{9:012d}.json" not in store.files
                          and clock.now > 1008 and foreign(store, 9, host="b"))
    with pytest.raises(SecondWriterError, match="host b"):
        a.acquire()
    assert a.seq is None  # a never held the table
    lease_module._HELD.pop(FOLDER, None)


def test_a_create_whose_answer_was_lost_still_counts_as_ours(monkeypatch) -> None:  # noqa: ANN001
    """A conditional PUT that succeeded, retried by the client, answers "exists": the
    step is ours if it carries our attempt's id (not a lost lease)."""
    store, clock = Store(), Clock()
    holder = make(store, clock)
    holder.acquire()
    real = store.write_once

    def lost_answer(path: str, text: str) -> bool:
        real(path, text)
        return False  # the retry of a create that went through

    monkeypatch.setattr(store, "write_once", lost_answer)
    assert holder.renew() and not holder.lost
    monkeypatch.undo()
    holder.release()


def test_an_unreadable_newest_step_is_watched_then_taken_over() -> None:
    store, clock = Store(), Clock()
    store.files[f"{FOLDER}/lease-{4:012d}.json"] = ""  # a partial file of an old store
    lease = make(store, clock, ttl_s=6)
    lease.acquire()
    assert lease.seq == 5
    lease.release()


def test_a_stalled_writer_cannot_take_a_step_the_new_holder_already_deleted() -> None:
    """A writer paused past the TTL comes back after the new holder moved on and deleted
    its old steps: creating the free-again next step must not count as a renewal."""
    store, clock = Store(), Clock()
    holder = make(store, clock, ttl_s=6)
    holder.acquire()
    for seq in range(1, 5):
        foreign(store, seq, host="newhost")
    del store.files[f"{FOLDER}/lease-{1:012d}.json"]  # the taker's step 4 deleted step 1
    clock.now += 20
    with pytest.raises(LeaseLost):
        holder.check()
    assert holder.lost


def test_a_frozen_writer_learns_at_the_store_that_it_was_taken_over() -> None:
    """audit-2 #1: the clock-based check passes for a writer that renewed just before it
    froze; the proof at the store (the lease folder's newest step) stops it before it
    deletes or renames anything of the new holder's — also once the taker has moved the
    lease on far enough to delete the frozen writer's own step, and not for a step of
    its own whose answer was lost."""
    store, clock = Store(), Clock()
    frozen = make(store, clock)
    frozen.acquire()
    frozen.check()
    frozen.prove()  # nobody else: proven
    mine = frozen.seq
    foreign(store, mine + 1)  # a taker's step (it watched a whole TTL on its own clock)
    frozen.check()  # the clock alone says nothing is wrong yet
    with pytest.raises(LeaseLost, match="taken over by host elsewhere"):
        frozen.prove()
    with pytest.raises(LeaseLost):
        frozen.prove()  # lost stays lost

    store2, clock2 = Store(), Clock()
    late = make(store2, clock2)
    late.acquire()
    for seq in range(late.seq + 1, late.seq + 6):  # the taker renews, old steps go
        foreign(store2, seq)
        store2.delete(f"{FOLDER}/lease-{seq - 3:012d}.json")
    with pytest.raises(LeaseLost):
        late.prove()

    store3, clock3 = Store(), Clock()
    own = make(store3, clock3)
    own.acquire()
    store3.write_once(own._path(own.seq + 1), own._record("lost-answer"))
    own.prove()  # its own renewal: still the holder
    assert own.seq == 1
