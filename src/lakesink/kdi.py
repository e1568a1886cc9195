"""``lakesink kdi ingest``: the configuration a kafka-delta-ingest command line runs, its
start taken over from kafka-delta-ingest's offsets.

:mod:`lakesink.compat.kdi` reads the command line; this module asks the table (its
``txn`` actions ``<app_id>-<partition>``), the checkpoint (new or not) and the broker (the
topic's partitions; kafka-delta-ingest's group must be idle) where a new checkpoint
starts, and refuses what would write a row twice (:func:`takeover_start`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from lakesink.compat.kdi import (
    KdiArgs,
    parse,
    parse_seek_offsets,
    refuse_unknown_app_id,
    secret_env,
    start_reset,
    takeover_offsets,
    translate,
)
from lakesink.errors import ConfigError

logger = logging.getLogger("lakesink.kdi")


def ingest_config(argv: list[str], env: Mapping[str, str]) -> tuple[Any, bool]:
    """The lakesink config ``lakesink kdi ingest <argv>`` runs, its start taken over
    from kafka-delta-ingest (:func:`takeover_start`); and whether ``--print-config``
    was given. The printed config carries the take-over (the starting offsets after
    kafka-delta-ingest's, read now: it must stay stopped), so ``lakesink run -c`` on
    it writes nothing twice; a run of the flags alone would be refused at start
    (``table.other_writers``)."""
    from lakesink.config import load_config

    args, print_config = parse(argv, env)
    flags, ignored = translate(args)
    if ignored:
        logger.info("kafka-delta-ingest flags with no meaning in lakesink, ignored: %s",
                    "; ".join(ignored))
    env = {**env, **secret_env(args, env)}
    if args.no_takeover:  # the table's txn offsets ignored: so by the run too
        flags["table.other_writers"] = "ignore"
    cfg = load_config(flags=flags, env=env, compat="off")  # the command line is the config
    start = takeover_start(cfg, args)
    if start is not None:
        cfg = load_config(flags={**flags, "source.kafka.starting_offsets": start}, env=env,
                          compat="off")
    return cfg, print_config


def takeover_start(cfg: Any, args: KdiArgs) -> str | None:  # noqa: ANN401
    """Spark's ``startingOffsets`` for a new checkpoint on a table kafka-delta-ingest
    wrote (its ``txn`` offsets, ``--seek_offsets``), or None (the flags' own start)."""
    topic = args.topic or ""
    seek = parse_seek_offsets(args.seek_offsets) if args.seek_offsets else {}
    reset = start_reset(args)
    readable = offsets_readable(cfg)
    started, recorded = started_checkpoint(cfg) if readable else (False, None)
    if started:
        # Spark starts from the checkpoint; the start it recorded stays the config's (a
        # restart before the first commit is refused when the start setting changed)
        return recorded
    # kafka-delta-ingest must have stopped before its offsets are read (and the query
    # checks again at start: require_idle_group)
    require_idle_group(cfg, topic)
    if cfg.routes or not readable:  # a table per message type; a store read only by Spark
        partitions = topic_partitions(cfg, topic)
        if not all(str(p) in seek for p in partitions) and not args.no_takeover:
            if not readable:
                raise ConfigError("table.base_path", "kafka-delta-ingest's offsets are "
                                  "read from local disk, S3 and Azure only", fix="give "
                                  "--seek_offsets (where to start), or --no_takeover to "
                                  "start at --auto_offset_reset")
            refuse_type_tables(cfg)
        return None if not seek else takeover_offsets(
            partitions, topic=topic, seek=seek, reset=reset)
    versions, files = table_txn_versions(cfg, args.app_id, topic)
    if args.no_takeover:
        versions = dict.fromkeys(versions)
    else:
        refuse_unknown_app_id(versions, files, app_id=args.app_id, seek=seek)
        if not seek:
            refuse_after_lakesink(cfg, args.app_id)
    start = takeover_offsets(versions, topic=topic, seek=seek, reset=reset)
    if start is not None:
        logger.info(
            "taking over from kafka-delta-ingest's offsets (app id %r) in the table: a new "
            "checkpoint starts at %s", args.app_id, start)
    return start


def offsets_readable(cfg: Any) -> bool:  # noqa: ANN401
    """Whether the take-over can read the table and the checkpoint before Spark starts
    (local disk, S3 and Azure; other stores need --seek_offsets or --no_takeover)."""
    paths = [cfg.table.base_path] + ([cfg.checkpoint] if cfg.checkpoint else [])
    return all((p.split("://", 1)[0] if "://" in p else "file")
               in ("file", "s3", "s3a", "abfs", "abfss") for p in paths)


def started_checkpoint(cfg: Any) -> tuple[bool, str | None]:  # noqa: ANN401
    """Whether a query has started in the run's checkpoint (its offset or source log,
    :func:`lakesink.tables.identity.has_started`), and the ``starting_offsets`` its
    first start recorded (None: none). A take-over happens only before the start
    (afterwards Spark starts from the checkpoint, whatever the table says)."""
    from lakesink.config.plan import plan
    from lakesink.runtime.arrow_fs import ArrowFS
    from lakesink.tables.fs import join
    from lakesink.tables.identity import IDENTITY_FILE, has_started

    checkpoint = plan(cfg).checkpoint_uri()
    fs = ArrowFS.open(cfg.storage, checkpoint)
    if fs is None or not has_started(fs, checkpoint):
        return False, None
    identity = fs.read_json(join(checkpoint, IDENTITY_FILE)) or {}
    value = (identity.get("start") or {}).get("source.kafka.starting_offsets")
    return True, value if isinstance(value, str) else None


def refuse_type_tables(cfg: Any) -> None:  # noqa: ANN401
    """Message-type routing (a table per record name): taking over tables the fork wrote
    is not supported (each table holds its own position; one start for all would write
    again what the tables ahead hold). Refused when ``<base>`` holds a Delta table."""
    import pyarrow.fs as pafs

    from lakesink.runtime.lake import filesystem
    from lakesink.tables.fs import to_uri

    fs, root = filesystem(cfg.storage, to_uri(cfg.table.base_path))
    found = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    tables = sorted(f.base_name for f in found if f.type == pafs.FileType.Directory
                    and fs.get_file_info(f"{f.path}/_delta_log").type
                    == pafs.FileType.Directory)
    if tables:
        raise ConfigError(
            "--table_base_uri", f"holds Delta tables ({', '.join(tables[:5])}): taking over "
            "tables kafka-delta-ingest wrote per message type is not supported",
            fix="give --seek_offsets (where to start each partition), or --no_takeover to "
            "start at --auto_offset_reset")


def _admin(cfg: Any) -> Any:  # noqa: ANN401
    from confluent_kafka.admin import AdminClient

    from lakesink.sources.kafka_client import librdkafka_conf

    return AdminClient({k: v for k, v in librdkafka_conf(cfg.source.kafka).items()
                        if k not in ("group.id", "enable.auto.commit")})


def require_idle_group(cfg: Any, topic: str) -> None:  # noqa: ANN401
    """Before reading kafka-delta-ingest's offsets from the table: its group (``-g``)
    must have no member reading ``topic`` (it must have stopped, or what it writes after
    the read would be written again). librdkafka's view; the query checks again at
    start (``require_idle_group``)."""
    from confluent_kafka import KafkaError, KafkaException

    from lakesink.errors import SourceError
    from lakesink.sources.kafka_admin import busy_members

    coordinator_moving = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                           KafkaError.COORDINATOR_LOAD_IN_PROGRESS)

    kafka = cfg.source.kafka
    admin = _admin(cfg)  # referenced until the answer: its futures die with it
    deadline = time.monotonic() + kafka.connect_timeout_s
    while True:
        try:
            [future] = admin.describe_consumer_groups(
                [kafka.group_id], request_timeout=kafka.connect_timeout_s).values()
            described = future.result(timeout=kafka.connect_timeout_s + 5)
            break
        except (KafkaException, TimeoutError) as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if code == KafkaError.GROUP_ID_NOT_FOUND:
                return
            if ((code in coordinator_moving or (isinstance(error, KafkaError)
                                                  and error.retriable()))
                    and time.monotonic() < deadline):  # e.g. the coordinator is loading
                time.sleep(0.5)
                continue
            raise SourceError(f"source.kafka: cannot describe consumer group "
                              f"{kafka.group_id!r} at {kafka.bootstrap_servers}: "
                              f"{exc}") from None
    members = [(m.client_id, m.host, {tp.topic for tp in m.assignment.topic_partitions})
               for m in described.members]
    state = getattr(getattr(described, "state", None), "name", "")
    busy_members(kafka.group_id, [topic], members, stable=state == "STABLE")


def topic_partitions(cfg: Any, topic: str) -> dict[int, None]:  # noqa: ANN401
    """``topic``'s partitions, asked of the broker (librdkafka), each mapped to None."""
    from lakesink.errors import SourceError

    kafka = cfg.source.kafka
    try:
        meta = _admin(cfg).list_topics(topic=topic, timeout=kafka.connect_timeout_s)
    except Exception as exc:  # noqa: BLE001 - librdkafka's KafkaException
        raise SourceError(f"source.kafka: cannot list the partitions of {topic!r} at "
                          f"{kafka.bootstrap_servers}: {exc}") from None
    return dict.fromkeys(sorted(meta.topics[topic].partitions) if topic in meta.topics
                         else [])


def lakesink_wrote_last(history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest data commit of a Delta table's ``history`` (newest first) if lakesink
    made it (its commitInfo names lakesink's app id: the delta-rs path's custom metadata,
    the Spark path's ``userMetadata``); None when another writer's data commit is newer,
    or there is none. Maintenance commits (OPTIMIZE, VACUUM, …) are passed over."""
    import json

    for entry in history:
        if "operation" not in entry:
            return None  # a commit without commitInfo: not lakesink's
        if entry["operation"] not in ("WRITE", "STREAMING UPDATE", "MERGE"):
            continue
        if "lakesink.app_id" in entry:
            return entry
        try:
            meta = json.loads(entry.get("userMetadata") or "null")
        except ValueError:
            meta = None
        if isinstance(meta, dict) and "lakesink.app_id" in meta:
            return {**entry, **meta}
        return None
    return None


def refuse_after_lakesink(cfg: Any, app_id: str = "") -> None:  # noqa: ANN401
    """A new checkpoint takes over from kafka-delta-ingest's offsets (``txn``
    ``<app_id>-<partition>``) only if no lakesink run wrote after kafka-delta-ingest:
    else its checkpoint was lost or moved, and starting at kafka-delta-ingest's old
    offsets would write again everything since. A lakesink commit is known by its
    commitInfo, or (a lakesink before that) by a ``txn`` of another app id in the
    newest data commit."""
    from deltalake.exceptions import TableNotFoundError

    from lakesink.runtime.lake import delta_table

    uri = f"{cfg.table.base_path.rstrip('/')}/{cfg.table.name}"
    try:
        history = delta_table(cfg.storage, uri).history(200)
    except TableNotFoundError:
        return
    last = lakesink_wrote_last(history) or _other_txn(cfg, uri, history, app_id)
    if last is not None:
        raise ConfigError(
            "checkpoint", f"the table's newest data commit (version {last.get('version')}) "
            f"is lakesink's (app id {last['lakesink.app_id']}, batch "
            f"{last.get('lakesink.batch_id')}), newer than kafka-delta-ingest's: this new "
            "checkpoint would start at kafka-delta-ingest's old offsets and write again "
            "every row lakesink wrote since",
            fix="use the checkpoint that lakesink run had (table.checkpoint_path or its "
            "default), or give --seek_offsets (where to start)")


def _other_txn(cfg: Any, uri: str, history: list[dict[str, Any]],  # noqa: ANN401
               app_id: str) -> dict[str, Any] | None:
    """The newest data commit if its log entry holds a ``txn`` of an app id that is not
    kafka-delta-ingest's ``<app_id>-<partition>`` (a writer that says nothing in
    commitInfo: lakesink's Spark path before it did)."""
    import json
    import re

    from lakesink.runtime.lake import filesystem
    from lakesink.tables.fs import to_uri

    newest = next((e for e in history if e.get("operation") in
                   ("WRITE", "STREAMING UPDATE", "MERGE")), None)
    if not app_id or newest is None or "version" not in newest:
        return None
    fs, root = filesystem(cfg.storage, to_uri(uri))
    try:
        with fs.open_input_stream(f"{root}/_delta_log/{int(newest['version']):020d}.json") as f:
            actions = [json.loads(line) for line in f.read().decode().splitlines() if line]
    except (FileNotFoundError, OSError, ValueError):
        return None
    ours = re.compile(re.escape(app_id) + r"-\d+")
    for action in actions:
        other = (action.get("txn") or {}).get("appId")
        if other and not ours.fullmatch(other):
            return {**newest, "lakesink.app_id": other, "lakesink.batch_id":
                    action["txn"].get("version")}
    return None


def table_txn_versions(cfg: Any, app_id: str, topic: str  # noqa: ANN401
                       ) -> tuple[dict[int, int | None], int]:
    """Per partition of ``topic`` (asked of the broker), the ``txn`` version that
    kafka-delta-ingest's ``<app_id>-<partition>`` holds in the Delta table (None: none,
    or no table yet); and the number of files in the table."""
    from deltalake.exceptions import TableNotFoundError

    from lakesink.runtime.lake import delta_table

    partitions = topic_partitions(cfg, topic)
    uri = f"{cfg.table.base_path.rstrip('/')}/{cfg.table.name}"
    try:
        table = delta_table(cfg.storage, uri)
    except TableNotFoundError:  # no table yet: nothing to take over
        return dict(partitions), 0
    return ({p: table.transaction_version(f"{app_id}-{p}") for p in partitions},
            len(table.file_uris()))
