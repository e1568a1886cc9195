"""``lakesink status``: what a table holds and how far behind it is, without Spark.

Per table of the config: the last committed batch and its time, batches, rows and files
committed, dead letters by reason, the schema version, and — for a Kafka source — the
lag: for Kafka per partition, the broker's end offset minus the offset the last
committed batch read up to (the Spark checkpoint's ``offsets/<batch>`` file for the
newest batch in its ``commits/``); for a Redis stream the entries added after that
batch's end; for a Redis list the items still in it; for Danube the records in the spool
after that batch (:mod:`lakesink.sources.offsets`).

Read directly with pyarrow's filesystems (local disk, S3 and Azure with the ``storage``
settings), delta-rs for Delta logs and ``confluent_kafka`` for the broker's offsets.
Parquet tables list their manifests (one small JSON per committed batch); Delta tables
read the log (:meth:`~lakesink.tables.formats.TableFormat.read_contents`). Message-type routes' tables are not listed (their names come with the
data; see ``docs/routing.md``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from lakesink.errors import one_line
from lakesink.runtime.lake import delta_table, filesystem
from lakesink.tables.contents import TableContents, list_files, read_json
from lakesink.sources.kinds import source_kind
from lakesink.tables.formats import table_format

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from lakesink.config.plan import RunPlan, TableSpec
    from lakesink.config.source import SourceConfig
    from lakesink.config.storage import StorageConfig


@dataclass(kw_only=True)
class TableStatus(TableContents):
    """What ``lakesink status`` says of a table: what it holds (its format's own
    reading, :class:`~lakesink.tables.contents.TableContents`) and more."""

    table: str
    format: str
    path: str
    mean_file_bytes: int | None = None
    #: said when the table's files are many and small (readers pay per file)
    hint: str | None = None
    schema_version: int | None = None
    rejected: dict[str, int] = field(default_factory=dict)
    lag: dict[str, int] | None = None  # "topic/partition" -> records behind
    lag_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "format": self.format, "path": self.path,
                **asdict(self)}


def table_status(spec: TableSpec, app_id: str | None = None) -> TableStatus:
    """The status of one table; ``app_id``: the checkpoint's (Delta tables key their
    batches by it)."""
    from lakesink.tables.layout import TableLayout

    layout = TableLayout.of(spec.table.base_path, spec.name)
    fs, root = filesystem(spec.storage, layout.base)
    meta = f"{root}/.lakesink/{layout.name}"
    contents = table_format(spec.format).read_contents(
        fs, meta, layout, partial(delta_table, spec.storage), app_id)
    status = TableStatus(table=layout.name, format=spec.format, path=layout.table,
                         **asdict(contents))
    schema = read_json(fs, f"{meta}/schema.json")
    status.schema_version = schema.get("version") if isinstance(schema, dict) else None
    status.rejected = _rejected(fs, f"{root}/_rejected/{layout.name}")
    if status.files:
        status.mean_file_bytes = status.bytes // status.files
        status.hint = small_files_hint(status.files, status.mean_file_bytes)
    return status


#: a table of at least this many files whose mean size is under SMALL_FILE_BYTES gets
#: the hint (a reader opens each file: small files cost more than their bytes)
SMALL_FILES = 20
SMALL_FILE_BYTES = 8 << 20


def small_files_hint(files: int, mean_bytes: int) -> str | None:
    if files < SMALL_FILES or mean_bytes >= SMALL_FILE_BYTES:
        return None
    return (f"{files} files of {mean_bytes / 1024:,.0f} KiB on average: small files slow "
            "readers down; `lakesink compact` merges them (docs/maintenance.md)")


def _rejected(fs: pafs.FileSystem, folder: str) -> dict[str, int]:
    import pyarrow.dataset as ds

    files = [p for p in list_files(fs, folder, recursive=True)
             if p.endswith(".parquet") and "/_delta_log/" not in p]
    if not files:
        return {}
    reasons = ds.dataset(files, filesystem=fs, format="parquet").to_table(
        columns=["reason"]).column("reason").value_counts()
    return {str(v["values"]): int(v["counts"]) for v in reasons.to_pylist()}


def checkpoint_sources(storage: StorageConfig, checkpoint: str) -> list[dict[str, Any]] | None:
    """The end offsets of the newest committed batch, one dict per source (see
    :mod:`lakesink.sources.offsets` for their shapes), from a Spark checkpoint; None
    before the first commit or for an offset log in a format lakesink does not read."""
    from lakesink.sources.offsets import log_sources

    fs, root = filesystem(storage, checkpoint)
    commits = [p.rsplit("/", 1)[1] for p in list_files(fs, f"{root}/commits")]
    done = sorted(int(n) for n in commits if n.isdigit())
    if not done:
        return None
    try:
        with fs.open_input_stream(f"{root}/offsets/{done[-1]}") as f:
            return log_sources(f.read().decode())
    except (FileNotFoundError, OSError):
        return None


def checkpoint_offsets(storage: StorageConfig, checkpoint: str
                       ) -> dict[str, dict[str, int]] | None:
    """The Kafka offsets the newest committed batch read up to (``{topic: {partition:
    offset}}``), from a Spark checkpoint; None before the first commit."""
    sources = checkpoint_sources(storage, checkpoint)
    if sources is None:
        return None
    offsets: dict[str, dict[str, int]] = {}
    for value in sources:
        for topic, parts in value.items():
            if isinstance(parts, dict):
                offsets.setdefault(topic, {}).update(
                    {str(p): int(o) for p, o in parts.items()
                     if str(p).isdigit() and isinstance(o, int)})
    return offsets


def lag(source: SourceConfig, storage: StorageConfig, checkpoint: str) -> dict[str, int]:
    """Records behind per ``topic/partition`` (``key`` for Redis and Danube), from the
    checkpoint's newest committed batch: see :func:`lakesink.sources.offsets.lag`."""
    from lakesink.sources.offsets import lag as behind

    sources = checkpoint_sources(storage, checkpoint) or []
    kind = source_kind(source)
    out: dict[tuple[str, str], int] = {}
    for end in sources:
        out.update(behind(end, kind.latest(checkpoint, end)))
    return {(f"{k}/{p}" if p else k): n for (k, p), n in sorted(out.items())}


def status(run_plan: RunPlan) -> list[TableStatus]:
    """Every (static) table of the run, with the lag of the query's checkpoint."""
    from lakesink.tables.identity import IDENTITY_FILE

    checkpoint = run_plan.checkpoint_uri()
    fs, root = filesystem(run_plan.storage, checkpoint)
    identity = read_json(fs, f"{root}/{IDENTITY_FILE}")
    app_id = identity.get("app_id") if isinstance(identity, dict) else None
    tables = [table_status(t, app_id) for t in run_plan.tables]
    behind: dict[str, int] | None = None
    error = None
    try:
        # once, not for source.*.connect_timeout_s: a refused connection is said at once
        # instead of after the start-up wait of `run`
        source_kind(run_plan.source).check_reachable(timeout_s=0)
        behind = lag(run_plan.source, run_plan.storage, checkpoint)
    except Exception as exc:  # noqa: BLE001 - the rest of the status still shows
        error = one_line(exc, 200)
    for t in tables:
        t.lag, t.lag_error = behind, error
    return tables
