"""The registration marks of one table for one catalog, and the catalog table's
generation they stand for (the layout and the rules: :mod:`lakesink.catalog.outbox`).

``registered/<catalog id>/`` holds ``<run>/<batch>.<tag>.json`` per registered batch
(the tag: :func:`generation_tag` of the generation it was registered to) and
``table.json``: the generation the marks stand for, and ``"tagged": true`` once every
mark that counts carries a tag.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any

from lakesink.tables.fs import join

if TYPE_CHECKING:
    from lakesink.tables.fs import HadoopFS

logger = logging.getLogger(__name__)

#: in the marks folder: the catalog table's generation the marks were written for
GENERATION = "table.json"


def generation_tag(generation: str | None) -> str | None:
    """The short name of a table generation in its marks' file names (None: untold)."""
    if generation is None:
        return None
    return hashlib.blake2b(generation.encode(), digest_size=6).hexdigest()


class Marks:
    """One catalog's marks of one table's registered batches (``folder``)."""

    def __init__(self, fs: HadoopFS, folder: str, *, catalog: str, describe: str) -> None:
        self.fs = fs
        self.folder = folder
        self.catalog = catalog  #: the catalog's id, written into the records
        self.describe = describe  #: the catalog as the logs name it
        self._generation: str | None = None  #: the marks' table generation, once read
        self._tagged = False  #: ``table.json`` says every valid mark carries a tag
        self._read = False  #: ``table.json`` was read

    # -- reading -----------------------------------------------------------------------

    def recorded(self, *, fresh: bool = False) -> str | None:
        """The table generation the marks stand for (``table.json``), read once (again
        when ``fresh``: another process may have moved on)."""
        if fresh or not self._read:
            data = self.fs.read_json(join(self.folder, GENERATION)) or {}
            self._generation = data.get("generation")
            self._tagged = bool(data.get("tagged")) and self._generation is not None
            self._read = True
        return self._generation

    def _untagged_hold(self) -> bool:
        """Untagged marks hold (for the recorded generation) until the flag is set."""
        self.recorded()
        return not self._tagged

    def path(self, run: str, batch_id: int, tag: str | None) -> str:
        return join(self.folder, run, f"{batch_id:010d}{'' if tag is None else '.' + tag}.json")

    def mark(self, run: str, batch_id: int) -> str:
        """A batch's mark for the table generation the marks stand for now."""
        return self.path(run, batch_id, generation_tag(self.recorded()))

    def marked(self, run: str, batch_id: int) -> bool:
        if self.fs.exists(self.mark(run, batch_id)):
            return True
        untagged = self.path(run, batch_id, None)
        return (self._untagged_hold() and self.mark(run, batch_id) != untagged
                and self.fs.exists(untagged))

    def listed(self) -> list[tuple[str, int, str | None]]:
        """Every mark: (run, batch, generation tag or None)."""
        out = []
        for f in self.fs.list_files(self.folder, suffix=".json"):
            run, _, name = f.relative.rpartition("/")
            batch, _, tag = name[:-5].partition(".")
            if run and batch.isdigit():
                out.append((run, int(batch), tag or None))
        return out

    def done(self) -> set[tuple[str, int]]:
        """The batches marked for the generation recorded now. A mark of another one is
        another process's, written for the table before (it had not seen the new one
        yet): its batch is not in this table."""
        tag = generation_tag(self.recorded())
        return {(run, b) for run, b, t in self.listed()
                if t == tag or (t is None and self._untagged_hold())}

    # -- writing -----------------------------------------------------------------------

    def write(self, run: str, batch_id: int, record: dict[str, Any]) -> None:
        self.fs.write_json(self.mark(run, batch_id), {**record, "catalog": self.catalog})

    def reconcile(self, now: str | None) -> bool:
        """The marks stand for the catalog table (generation ``now``) they were written
        for: another generation drops them. True when this process's view of the marks
        changed (dropped here or by another process): every committed batch is to be
        queued again."""
        cached = self.recorded()
        if now is None or (now == cached and self._tagged):
            return False
        was = self.recorded(fresh=True)  # another process may have moved on already
        tag = generation_tag(now)
        if was is not None and now.startswith(was + "@"):  # the same table, told more
            # precisely (Hive's generation before it carried the creation time)
            self._retag({None, generation_tag(was)}, tag)
            was, self._tagged = now, False
        if was is not None and was != now:
            stale = self._drop(tag)
            logger.warning("catalog %s: the catalog's table is another one than the batches "
                           "were registered to (generation %s, was %s): it was dropped or "
                           "replaced; %d batch(es) registered before are registered again",
                           self.describe, now, was, stale)
        elif not self._tagged:  # first recorded, or recorded before marks carried a tag
            self._retag({None}, tag)
        # the generation last: a kill before it leaves the old one, and the next start
        # finishes the job (a recursive delete is not atomic, and marks left under the
        # new generation kept their batches out for good)
        if was != now or not self._tagged:
            self.fs.write_json(join(self.folder, GENERATION), {
                "generation": now, "tagged": True, "catalog": self.catalog,
                "at": time.time()})
        self._generation, self._tagged = now, True
        return (cached is not None and cached != now) or (was is not None and was != now)

    def _retag(self, old: set[str | None], tag: str | None) -> None:
        """Rename the marks tagged with any of ``old`` (None: untagged) to carry ``tag``."""
        for run, b, t in self.listed():
            if t in old:
                self.fs.rename(self.path(run, b, t), self.path(run, b, tag))

    def _drop(self, tag: str | None) -> int:
        """Delete the marks of any generation but ``tag``'s: a run's folder at once when
        it holds none of ``tag``'s, else mark by mark (those are another process's, which
        saw the new table first). Returns how many were dropped."""
        marks = self.listed()
        keep = {run for run, _, t in marks if t == tag}
        stale = [(run, b, t) for run, b, t in marks if t != tag]
        for run in sorted({run for run, _, _ in stale} - keep):
            self.fs.delete(join(self.folder, run))
        for run, b, t in stale:
            if run in keep:
                self.fs.delete(self.path(run, b, t), recursive=False)
        return len(stale)
