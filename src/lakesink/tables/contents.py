"""What a table holds, read without Spark: its committed batches, rows, files and bytes.

Each table format reads it from its own source of truth
(:meth:`~lakesink.tables.formats.TableFormat.read_contents`): a Parquet table from
lakesink's manifests (one per committed batch, or a roll-up of many) less the files its
compactions replaced; a Delta table from its log, with delta-rs. ``lakesink status`` and
the status page show it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow.fs as pafs


@dataclass
class TableContents:
    batches: int = 0
    last_batch: int | None = None
    last_commit: str | None = None
    rows: int = 0
    files: int = 0
    bytes: int = 0


#: opens a Delta table's log by its URI (delta-rs' ``DeltaTable``, with the store's
#: settings); raises ``TableNotFoundError`` when there is none yet
OpenLog = Callable[[str], Any]


def from_manifests(fs: pafs.FileSystem, meta: str) -> TableContents:
    """A Parquet table's contents from its manifests under ``meta`` (a path of ``fs``:
    the table's ``.lakesink/<name>`` folder)."""
    from lakesink.tables.manifests import PREFIX as ROLLUP_PREFIX
    from lakesink.tables.manifests import TableFile, apply_compactions

    out = TableContents()
    latest: dict[str, Any] | None = None
    files: dict[str, TableFile] = {}
    seen: set[tuple[str, Any]] = set()
    for path in list_files(fs, f"{meta}/manifests", recursive=True):
        if not path.endswith(".json"):
            continue
        value = read_json(fs, path)
        if not isinstance(value, dict):
            continue
        rolled = path.rsplit("/", 1)[1].startswith(ROLLUP_PREFIX)
        for manifest in (value["batches"].values() if rolled else [value]):
            key = (path.rsplit("/", 2)[-2], manifest.get("batch_id"))
            if key in seen:
                continue
            seen.add(key)
            out.batches += 1
            for e in manifest.get("files", []):
                files[e["path"]] = TableFile(e["path"], int(e["rows"]), int(e["bytes"]))
            if latest is None or (str(manifest.get("committed_at"))
                                  > str(latest.get("committed_at"))):
                latest = manifest
    outcomes = sorted(p for p in list_files(fs, f"{meta}/compactions")
                      if p.endswith(".outcome.json"))
    done = [(p, o) for p in outcomes if isinstance(o := read_json(fs, p), dict)
            and o.get("outcome") == "done"]
    files = apply_compactions(files, ((read_json(fs, p.replace(".outcome.json", ".json")), o)
                                      for p, o in done))
    out.files = len(files)
    out.rows = sum(f.rows for f in files.values())
    out.bytes = sum(f.bytes for f in files.values())
    if latest is not None:
        out.last_batch = latest.get("batch_id")
        out.last_commit = latest.get("committed_at")
    return out


def from_delta_log(open_log: OpenLog, uri: str, app_id: str | None) -> TableContents:
    """A Delta table's contents from its log; ``app_id``: the checkpoint's, whose txn
    version is the last batch lakesink committed."""
    from deltalake.exceptions import TableNotFoundError

    out = TableContents()
    try:
        table = open_log(uri)
    except TableNotFoundError:
        return out
    actions = table.get_add_actions(flatten=True)
    out.files = actions.num_rows
    if "size_bytes" in actions.column_names:
        out.bytes = int(sum(v or 0 for v in actions.column("size_bytes").to_pylist()))
    if "num_records" in actions.column_names:
        out.rows = int(sum(v or 0 for v in actions.column("num_records").to_pylist()))
    history = table.history()
    # appends, less the table's creation (lakesink creates it empty before batch 0)
    appends = [h for h in history if h.get("operation") in ("WRITE", "STREAMING UPDATE")
               and not (h.get("version") == 0
                        and (h.get("operationMetrics") or {}).get("numOutputRows") == "0")]
    out.batches = len(appends)
    if appends:
        newest = max(appends, key=lambda h: h.get("timestamp", 0))
        out.last_commit = dt.datetime.fromtimestamp(
            newest.get("timestamp", 0) / 1000, dt.UTC).isoformat(timespec="milliseconds")
    if app_id:  # the batch id is the txn version lakesink commits under its app id
        out.last_batch = table.transaction_version(app_id)
    return out


def read_json(fs: pafs.FileSystem, path: str) -> Any:  # noqa: ANN401
    """A small JSON file of ``fs`` (None: missing or unreadable)."""
    try:
        with fs.open_input_stream(path) as f:
            return json.loads(f.read())
    except (FileNotFoundError, OSError, ValueError):
        return None


def list_files(fs: pafs.FileSystem, folder: str, *, recursive: bool = False) -> list[str]:
    import pyarrow.fs as pafs

    try:
        infos = fs.get_file_info(pafs.FileSelector(folder, recursive=recursive,
                                                   allow_not_found=True))
    except (FileNotFoundError, OSError):
        return []
    return [i.path for i in infos if i.type == pafs.FileType.File]
