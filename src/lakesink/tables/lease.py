"""One writer per table: a lease whose every change is a create-if-absent.

Two lakesink processes on one checkpoint (a rolling deploy that starts the new process
before the old one stopped) must not both write its tables; nor two processes of any
checkpoints one Delta table on S3 with the single-driver log store (or on Azure), where
two drivers committing the same version silently lose one commit. Each table writer holds a lease
while it writes: per checkpoint (app id), or per table for that Delta case.

The lease is a sequence of small files ``<meta>/writer/lease-<seq>.json`` (``{writer,
app_id, host, pid, ttl_s, released}``); the newest one says who holds the table. Every
step creates the *next* file only if it does not exist — a conditional PUT
(``If-None-Match: *``) on S3 and Azure, a rename that refuses an existing name on HDFS, a hard
link on local disk (:meth:`HadoopFS.write_once`) — so of two processes that try the
same step, exactly one succeeds and the other learns that it lost (a create whose
answer was lost is recognised by the attempt id it wrote):

* **acquire** — the newest file is a release, or names this host, pid namespace and
  kernel boot and a process that is gone, or this very pid without this process holding it (a process
  restarted in the same namespace with the same pid): take it at once (create
  ``seq + 1``). Pids of another pid namespace (containers sharing a host name) or of
  another boot (a pod rescheduled to another node keeps its host name) are never judged.
  Otherwise watch it for the holder's ``ttl_s``: a holder that renews is alive, and the
  start is refused (:class:`SecondWriterError`, naming it); one that does not renew for
  a whole TTL is gone, and its lease is taken over. Staleness is measured on this
  process's own clock only; no two machines' clocks are compared.
* **renew** — every ``ttl_s / 3`` the holder creates ``seq + 1``. If that file exists,
  another process took the table: the lease is **lost**.
* **check** (before every commit point: Parquet's publish and manifest, Delta's
  append) — a lost lease, or one not renewed for two thirds of ``ttl_s`` (a pause, a
  storage outage: a taker may be about to take over) is renewed right then. If the
  renewal finds the next step taken, the batch stops with :class:`LeaseLost`: a writer
  that lost its lease never commits again; its query stops (not retried). If the
  store cannot be reached, the batch fails with that storage error and is retried
  like any other (nothing was committed; the retry's check decides).
* **release** (a clean stop) — create ``seq + 1`` marked ``released``: the next start
  takes over at once.

What is left: a commit that began before the check and runs past a takeover (the
check is made right before the commit point, so that window is the commit's own
duration, milliseconds for a Parquet manifest, the append's job for Delta). With Delta
on S3 and several writers by design, use the DynamoDB log store (no lease).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from lakesink.errors import LeaseLost, SecondWriterError

if TYPE_CHECKING:
    from lakesink.tables.fs import HadoopFS

logger = logging.getLogger(__name__)

#: files of older lease steps kept (the rest are deleted as the lease moves on)
KEEP = 3
#: this process's pid namespace (Linux), so pids of other containers are never judged
try:
    PID_NAMESPACE: str | None = os.readlink("/proc/self/ns/pid")
except OSError:
    PID_NAMESPACE = None
#: this kernel's boot (Linux: a random UUID per boot): a pid namespace's id is an inode
#: number, unique within one kernel only, so a pod rescheduled to another node with the
#: same host name, pid and namespace number is not taken for this process's restart
try:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as _f:
        BOOT_ID: str | None = _f.read().strip() or None
except OSError:
    BOOT_ID = None
#: leases this process holds, by path: another holder in this process is live
_HELD: dict[str, WriterLease] = {}
_HELD_LOCK = threading.Lock()


__all__ = ["LeaseLost", "SecondWriterError", "WriterLease"]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


class WriterLease:
    def __init__(self, fs: HadoopFS, folder: str, *, app_id: str, ttl_s: float,
                 table: str, refusal: str | None = None,
                 clock: Any = time.monotonic, sleep: Any = time.sleep) -> None:  # noqa: ANN401
        """``folder`` holds the lease files; ``refusal``: why a second holder is refused
        (said in the error); ``clock``/``sleep``: for tests."""
        self.fs = fs
        self.folder = folder.rstrip("/")
        self.app_id = app_id
        self.ttl_s = ttl_s
        self.table = table
        self.refusal = refusal or "Two writers on one table would overwrite each other's " \
            "files and commits."
        self.writer = uuid.uuid4().hex
        self.clock = clock
        self.sleep = sleep
        self.seq: int | None = None  # the step this writer created last
        self.renewed_at = 0.0  # clock() when that step was started
        self.lost = False
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one step at a time (renewal thread vs check)
        self._thread: threading.Thread | None = None

    # -- the files -----------------------------------------------------------------------

    def _path(self, seq: int) -> str:
        return f"{self.folder}/lease-{seq:012d}.json"

    def newest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest lease step and its record (None: no lease yet)."""
        steps = [f for f in self.fs.list_files(self.folder, suffix=".json")
                 if f.relative.startswith("lease-")]
        if not steps:
            return None
        f = max(steps, key=lambda f: f.relative)
        try:
            record = self.fs.read_json(f.path) or {}
        except ValueError:  # unreadable (a store without atomic creates): a holder we
            record = {}     # cannot name, taken over only if it does not renew
        return int(f.relative[len("lease-"):-len(".json")]), record

    def _record(self, step: str, *, released: bool = False) -> str:
        import json

        return json.dumps({"writer": self.writer, "step": step, "app_id": self.app_id,
                           "host": socket.gethostname(), "pidns": PID_NAMESPACE,
                           "boot": BOOT_ID, "pid": os.getpid(), "ttl_s": self.ttl_s, "released": released,
                           "at": time.time()})

    def _step(self, seq: int, *, released: bool = False) -> bool:
        """Create step ``seq``; False if another process created it first."""
        started = self.clock()
        step = uuid.uuid4().hex
        if not self.fs.write_once(self._path(seq), self._record(step, released=released)):
            # a create that succeeded but whose answer was lost (and retried) looks
            # like "exists": the step is ours if it carries this attempt's id
            # -- or one this writer made in an earlier call that failed after the create
            # (the store went down before the answer or the listing below): a renewal
            # must not mistake its own step for a takeover
            try:
                record = self.fs.read_json(self._path(seq)) or {}
            except ValueError:
                record = {}
            if record.get("step") != step and record.get("writer") != self.writer:
                return False
            if record.get("step") != step:
                # its own step of an earlier call: made back then, so a taker may have
                # watched it for most of a TTL already. Adopt it, then renew at once
                # (the next step proves this writer alive now; if a taker made it
                # first, the lease is lost)
                newest = self.newest()
                if newest is not None and newest[0] > seq:
                    return False
                self.seq = seq
                return self._step(seq + 1, released=released)
        # a writer that stalled while others moved the lease on (and deleted their old
        # steps) can create a step number that is free again: a higher step means the
        # lease is someone else's
        newest = self.newest()
        if newest is not None and newest[0] > seq:
            return False
        self.seq, self.renewed_at = seq, started
        if seq >= KEEP:
            self.fs.delete(self._path(seq - KEEP), recursive=False)
        return True

    # -- acquire -------------------------------------------------------------------------

    def _free(self, record: dict[str, Any]) -> str | None:
        """Why a lease step can be taken at once (None: its holder may be alive). Process
        ids are only compared within one host *and* one pid namespace of one kernel boot:
        containers that share a host name (host networking) have pid spaces of their
        own, and a namespace's number repeats on another machine."""
        if record.get("released"):
            return "released"
        if (record.get("host") != socket.gethostname() or PID_NAMESPACE is None
                or record.get("pidns") != PID_NAMESPACE or BOOT_ID is None
                or record.get("boot") != BOOT_ID):
            return None
        pid = int(record.get("pid", -1))
        if pid == os.getpid():
            with _HELD_LOCK:
                held = _HELD.get(self.folder)
            if held is None or held.lost:
                return "left by an earlier process with this host name and pid"
            return None
        return None if pid_alive(pid) else f"its process {pid} is gone"

    def acquire(self) -> None:
        """Hold the lease, or raise SecondWriterError naming the live holder."""
        with _HELD_LOCK:
            other = _HELD.get(self.folder)
        if other is not None and not other.lost:
            raise self._refused({"host": socket.gethostname(), "pid": os.getpid(),
                                 "app_id": other.app_id}, "held in this process")
        for _ in range(20):
            newest = self.newest()
            if newest is None:
                if self._step(0):
                    return self._held()
                continue
            seq, record = newest
            why = self._free(record)
            if why is None:
                why = self._watch(seq, record)  # raises when the holder renews
            if why != "released":
                logger.warning("taking over the writer lease of %s (host %s, pid %s): %s",
                               self.table, record.get("host"), record.get("pid"), why)
            if self._step(seq + 1):
                return self._held()
        raise SecondWriterError(f"could not take the writer lease of {self.table} "
                                f"({self.folder}); other writers keep taking it")

    def _watch(self, seq: int, record: dict[str, Any]) -> str:
        """Watch step ``seq`` for its holder's TTL: a newer step means a live holder
        (refused); none means the holder is gone."""
        ttl = float(record.get("ttl_s") or self.ttl_s)
        logger.info("the writer lease of %s is held by host %s pid %s; waiting up to %.0fs "
                    "for it to renew or expire", self.table, record.get("host"),
                    record.get("pid"), ttl)
        start = self.clock()
        while self.clock() - start < ttl:
            self.sleep(min(1.0, ttl / 10))
            newest = self.newest()
            if newest is not None and newest[0] != seq:
                if newest[1].get("released"):
                    return "released"
                raise self._refused(newest[1], "it renewed its lease")
        return f"not renewed for {ttl:.0f}s"

    def _refused(self, held: dict[str, Any], seen: str) -> SecondWriterError:
        return SecondWriterError(
            f"table {self.table} is being written by another lakesink (host "
            f"{held.get('host')}, pid {held.get('pid')}, checkpoint app id "
            f"{held.get('app_id')}; {seen}). {self.refusal} Stop the other writer; if it "
            f"died on another machine, its lease is taken over once it has not been "
            f"renewed for {self.ttl_s:.0f}s")

    def _held(self) -> None:
        with _HELD_LOCK:
            _HELD[self.folder] = self
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name=f"lease-{self.table[-40:]}")
        self._thread.start()

    # -- renew, check, release -----------------------------------------------------------

    def renew(self) -> bool:
        """Create the next step; False (and ``lost``) if another process took it."""
        with self._lock:
            if self.lost or self.seq is None:
                return False
            if not self._step(self.seq + 1):
                self.lost = True
                newest = self.newest()
                holder = newest[1] if newest else {}
                logger.error("the writer lease of %s was taken over by host %s pid %s: this "
                             "writer commits nothing more", self.table, holder.get("host"),
                             holder.get("pid"))
                return False
            return True

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if not self.renew():
                    return
            except Exception as exc:  # a storage hiccup: try again next round
                logger.warning("could not renew the writer lease of %s: %s", self.table, exc)

    def check(self) -> None:
        """Raise LeaseLost unless this writer surely still holds the lease (called right
        before a commit point)."""
        if not self.lost and self.clock() - self.renewed_at < self.ttl_s * 2 / 3:
            return
        try:
            if self.renew():
                return
        except Exception as exc:
            # the store is down: the lease cannot be confirmed, so nothing is committed,
            # but it is not known lost either. The batch fails like any storage error
            # and is retried; the retry's check renews (or finds the lease taken)
            logger.warning("could not renew the writer lease of %s: %s", self.table, exc)
            raise
        raise LeaseLost(
            f"the writer lease of {self.table} was lost or could not be renewed for "
            f"{self.clock() - self.renewed_at:.0f}s (TTL {self.ttl_s:.0f}s): another writer "
            "may hold the table, so this one stops before committing (the batch is redone "
            "by whoever holds the table)")

    def prove(self) -> None:
        """Prove at the store, right before a step that deletes, renames or commits on the
        table's shared paths, that this writer's lease step is still the newest (one
        listing of the lease folder: a LIST on S3): a writer frozen past its TTL while
        another took the table over learns it here, before it touches the taker's
        files, instead of by its own clock. Raises :class:`LeaseLost`.

        What remains: the time between this listing and the step itself (one request),
        and a store that lists stale (none of the stores lakesink supports: S3,
        SeaweedFS, HDFS and local disk list what was created)."""
        with self._lock:
            if self.lost or self.seq is None:
                if self.lost:
                    raise LeaseLost(f"the writer lease of {self.table} was taken over: "
                                    "this writer commits nothing more")
                return
            steps = [int(f.relative[len("lease-"):-len(".json")])
                     for f in self.fs.list_files(self.folder, suffix=".json")
                     if f.relative.startswith("lease-")]
            if steps and max(steps) == self.seq:
                return  # one listing, no read: the common case
            newest = self.newest()
            if newest is not None and newest[0] > self.seq:
                if newest[1].get("writer") == self.writer:  # our renewal whose answer
                    self.seq = newest[0]                     # was lost: ours all the same
                    return
                self.lost = True
                raise LeaseLost(
                    f"the writer lease of {self.table} was taken over by host "
                    f"{newest[1].get('host')} pid {newest[1].get('pid')} (step "
                    f"{newest[0]}, this writer's {self.seq}): this writer stops before "
                    "touching the table again (the batch is the new holder's)")
            if newest is None or newest[0] < self.seq:
                # our own step is gone: only a taker moving the lease on deletes it
                self.lost = True
                raise LeaseLost(f"the writer lease of {self.table} moved on without this "
                                "writer (its step was removed): it stops")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        with _HELD_LOCK:
            if _HELD.get(self.folder) is self:
                del _HELD[self.folder]
        with self._lock:
            if self.lost or self.seq is None:
                return
            try:
                self._step(self.seq + 1, released=True)
            except Exception as exc:  # the next start waits one TTL instead
                logger.warning("could not release the writer lease of %s: %s", self.table, exc)
            self.seq = None
