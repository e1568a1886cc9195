"""``lakesink status``: what a table holds and how far behind it is, without Spark.

Per table of the config: the last committed batch and its time, batches, rows and files
committed, dead letters by reason, the schema version, and — for a Kafka source — the
lag: for Kafka per partition, the broker's end offset minus the offset the last
committed batch read up to (the Spark checkpoint's ``offsets/<batch>`` file for the
newest batch in its ``commits/``); for a Redis stream the entries added after that
batch's end; for a Redis list the items still in it; for Danube the records in the spool
after that batch (:mod:`lakesink.sources.offsets`).

Read directly with pyarrow's filesystems (local disk and S3 with the ``storage.s3``
settings), delta-rs for Delta logs and ``confluent_kafka`` for the broker's offsets.
Parquet tables list their manifests (one small JSON per committed batch); Delta tables
read the log. Message-type routes' tables are not listed (their names come with the
data; see ``docs/routing.md``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from lakesink.errors import one_line
from lakesink.runtime.lake import delta_table, filesystem, list_files, read_json
from lakesink.sources.kinds import source_kind
from lakesink.tables.formats import table_format

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from lakesink.config.models import LakesinkConfig


@dataclass
class TableStatus:
    table: str
    format: str
    path: str
    batches: int = 0
    last_batch: int | None = None
    last_commit: str | None = None
    rows: int = 0
    files: int = 0
    bytes: int = 0
    mean_file_bytes: int | None = None
    #: said when the table's files are many and small (readers pay per file)
    hint: str | None = None
    schema_version: int | None = None
    rejected: dict[str, int] = field(default_factory=dict)
    lag: dict[str, int] | None = None  # "topic/partition" -> records behind
    lag_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def table_status(cfg: LakesinkConfig, app_id: str | None = None) -> TableStatus:
    """The status of the single table ``cfg`` describes (a route's: its route config);
    ``app_id``: the checkpoint's (Delta tables key their batches by it)."""
    from lakesink.tables.layout import TableLayout

    layout = TableLayout.of(cfg.table.base_path, cfg.table_name)
    fs, root = filesystem(cfg, layout.base)
    meta = f"{root}/.lakesink/{layout.name}"
    status = TableStatus(layout.name, cfg.table.format, layout.table)
    schema = read_json(fs, f"{meta}/schema.json")
    status.schema_version = schema.get("version") if isinstance(schema, dict) else None
    if table_format(cfg.table.format).has_log:  # the log says what the table holds
        _delta(status, layout.table, cfg, app_id)
    else:  # lakesink's manifests do
        _parquet(status, fs, meta)
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


def _parquet(status: TableStatus, fs: pafs.FileSystem, meta: str) -> None:
    from lakesink.tables.manifests import PREFIX as ROLLUP_PREFIX
    from lakesink.tables.manifests import TableFile, apply_compactions

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
            status.batches += 1
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
    status.files = len(files)
    status.rows = sum(f.rows for f in files.values())
    status.bytes = sum(f.bytes for f in files.values())
    if latest is not None:
        status.last_batch = latest.get("batch_id")
        status.last_commit = latest.get("committed_at")


def _delta(status: TableStatus, uri: str, cfg: LakesinkConfig, app_id: str | None) -> None:
    import datetime as dt

    from deltalake.exceptions import TableNotFoundError

    try:
        table = delta_table(cfg, uri)
    except TableNotFoundError:
        return
    actions = table.get_add_actions(flatten=True)
    status.files = actions.num_rows
    if "size_bytes" in actions.column_names:
        status.bytes = int(sum(v or 0 for v in actions.column("size_bytes").to_pylist()))
    if "num_records" in actions.column_names:
        status.rows = int(sum(v or 0 for v in actions.column("num_records").to_pylist()))
    history = table.history()
    # appends, less the table's creation (lakesink creates it empty before batch 0)
    appends = [h for h in history if h.get("operation") in ("WRITE", "STREAMING UPDATE")
               and not (h.get("version") == 0
                        and (h.get("operationMetrics") or {}).get("numOutputRows") == "0")]
    status.batches = len(appends)
    if appends:
        newest = max(appends, key=lambda h: h.get("timestamp", 0))
        status.last_commit = dt.datetime.fromtimestamp(
            newest.get("timestamp", 0) / 1000, dt.UTC).isoformat(timespec="milliseconds")
    if app_id:  # the batch id is the txn version lakesink commits under its app id
        status.last_batch = table.transaction_version(app_id)


def _rejected(fs: pafs.FileSystem, folder: str) -> dict[str, int]:
    import pyarrow.dataset as ds

    files = [p for p in list_files(fs, folder, recursive=True)
             if p.endswith(".parquet") and "/_delta_log/" not in p]
    if not files:
        return {}
    reasons = ds.dataset(files, filesystem=fs, format="parquet").to_table(
        columns=["reason"]).column("reason").value_counts()
    return {str(v["values"]): int(v["counts"]) for v in reasons.to_pylist()}


def checkpoint_sources(cfg: LakesinkConfig, checkpoint: str) -> list[dict[str, Any]] | None:
    """The end offsets of the newest committed batch, one dict per source (see
    :mod:`lakesink.sources.offsets` for their shapes), from a Spark checkpoint; None
    before the first commit or for an offset log in a format lakesink does not read."""
    from lakesink.sources.offsets import log_sources

    fs, root = filesystem(cfg, checkpoint)
    commits = [p.rsplit("/", 1)[1] for p in list_files(fs, f"{root}/commits")]
    done = sorted(int(n) for n in commits if n.isdigit())
    if not done:
        return None
    try:
        with fs.open_input_stream(f"{root}/offsets/{done[-1]}") as f:
            return log_sources(f.read().decode())
    except (FileNotFoundError, OSError):
        return None


def checkpoint_offsets(cfg: LakesinkConfig, checkpoint: str) -> dict[str, dict[str, int]] | None:
    """The Kafka offsets the newest committed batch read up to (``{topic: {partition:
    offset}}``), from a Spark checkpoint; None before the first commit."""
    sources = checkpoint_sources(cfg, checkpoint)
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


def lag(cfg: LakesinkConfig, checkpoint: str) -> dict[str, int]:
    """Records behind per ``topic/partition`` (``key`` for Redis and Danube), from the
    checkpoint's newest committed batch: see :func:`lakesink.sources.offsets.lag`."""
    from lakesink.sources.offsets import lag as behind

    sources = checkpoint_sources(cfg, checkpoint) or []
    out: dict[tuple[str, str], int] = {}
    for end in sources:
        out.update(behind(end, source_kind(cfg.source).latest(checkpoint, end)))
    return {(f"{k}/{p}" if p else k): n for (k, p), n in sorted(out.items())}


def _at_once(source: Any) -> Any:  # noqa: ANN401 - a SourceConfig
    """``source`` with its server tried once (``connect_timeout_s`` 0)."""
    for name in ("kafka", "redis", "danube"):
        section = getattr(source, name, None)
        if section is not None:
            return source.model_copy(update={
                name: section.model_copy(update={"connect_timeout_s": 0.0})})
    return source


def status(cfg: LakesinkConfig) -> list[TableStatus]:
    """Every (static) table of ``cfg``, with the lag of the query's checkpoint."""
    from lakesink.tables.fs import to_uri
    from lakesink.tables.identity import IDENTITY_FILE
    from lakesink.tables.layout import TableLayout

    if cfg.routes:
        from lakesink.config.plan import plan

        configs = [t.config for t in plan(cfg).tables]
        checkpoint = to_uri(cfg.checkpoint or cfg.routed_checkpoint)
    else:
        configs = [cfg]
        checkpoint = to_uri(cfg.checkpoint) if cfg.checkpoint else TableLayout.of(
            cfg.table.base_path, cfg.table_name).default_checkpoint
    fs, root = filesystem(cfg, checkpoint)
    identity = read_json(fs, f"{root}/{IDENTITY_FILE}")
    app_id = identity.get("app_id") if isinstance(identity, dict) else None
    tables = [table_status(c, app_id) for c in configs]
    behind: dict[str, int] | None = None
    error = None
    if cfg.source.kafka is not None or cfg.source.redis is not None \
            or cfg.source.danube is not None:
        try:
            # once, not for source.*.connect_timeout_s: a refused connection is said at
            # once instead of after the start-up wait of `run`
            source_kind(_at_once(cfg.source)).check_reachable()
            behind = lag(cfg, checkpoint)
        except Exception as exc:  # noqa: BLE001 - the rest of the status still shows
            error = one_line(exc, 200)
    for t in tables:
        t.lag, t.lag_error = behind, error
    return tables
