"""The Danube Delta Lake sink's TOML configuration, read as a lakesink configuration.

``lakesink run --config connector.toml`` (a ``.toml`` file with a ``[deltalake]``
section) maps the sink's settings (``../shared/reference/peers.md`` §2.4, v0.1.4 and the
v0.3.0 names) to lakesink's:

================================================  ========================================
Danube sink                                       lakesink
================================================  ========================================
``danube_service_url`` / ``connector_name``       ``source.danube.service_url`` /
                                                  ``consumer_name`` (their env overrides,
                                                  ``DANUBE_SERVICE_URL`` / ``CONNECTOR_NAME``,
                                                  apply as there)
``[[deltalake.topic_mappings]]`` (``routes``)     one route per mapping: ``topic`` (``from``)
                                                  → a Delta table at ``delta_table_path``
                                                  (``to``)
``subscription``                                  ``source.danube.subscriptions`` (per topic)
``schema_type`` Json / String / Int64 / Bytes     ``decode.format`` json / string / int64 /
                                                  bytes
``schema = [{name, data_type, nullable}]``        ``decode.schema`` (the same Arrow names)
``include_danube_metadata``                       ``table.metadata_column: _danube_metadata``
                                                  (a struct, not a JSON string)
``s3_region`` / ``s3_endpoint``                   ``storage.s3.region`` / ``endpoint``
``azure_storage_account`` / ``gcp_project_id``    ``storage.azure.account`` /
                                                  ``storage.gcs.project_id``
``batch_size`` / ``flush_interval_ms``            ``max_records_per_trigger`` /
                                                  ``trigger.interval``
================================================  ========================================

Settings with no meaning here (``[retry]``: lakesink's own retry applies;
``write_mode``; ``metrics_port``; ``log_level``) are accepted and listed by
:func:`ignored`.
"""

from __future__ import annotations

from typing import Any

from lakesink.errors import ConfigError

_FORMATS = {"json": "json", "string": "string", "int64": "int64", "bytes": "bytes"}


def is_danube_toml(data: dict[str, Any]) -> bool:
    return isinstance(data.get("deltalake"), dict)


def translate(data: dict[str, Any]) -> dict[str, Any]:
    """The lakesink configuration (a nested dict) of a Danube sink TOML document."""
    lake = data["deltalake"]
    mappings = lake.get("topic_mappings") or lake.get("routes") or []
    if not mappings:
        raise ConfigError("deltalake.topic_mappings", "names no topic")
    topics = [m.get("topic") or m.get("from") for m in mappings]
    danube: dict[str, Any] = {"topics": topics, "subscriptions": {
        t: m["subscription"] for t, m in zip(topics, mappings, strict=True)
        if m.get("subscription")}}
    for key, ours in (("danube_service_url", "service_url"), ("connector_name", "consumer_name")):
        if data.get(key):
            danube[ours] = data[key]
    processing = data.get("processing") or {}
    batch = lake.get("batch_size") or processing.get("batch_size")
    if batch:
        danube["max_records_per_trigger"] = int(batch)
    out: dict[str, Any] = {"source": {"danube": danube},
                           "table": {"format": "delta", "partition_by": [],
                                     "timestamp_column": None}, "routes": []}
    interval = lake.get("flush_interval_ms") or processing.get("batch_timeout_ms")
    if interval:
        out["trigger"] = {"interval": f"{int(interval)} milliseconds"}
    storage: dict[str, Any] = {}
    if lake.get("s3_region") or lake.get("s3_endpoint"):
        storage["s3"] = {k: v for k, v in (("region", lake.get("s3_region")),
                                           ("endpoint", lake.get("s3_endpoint"))) if v}
    if lake.get("azure_storage_account"):
        storage["azure"] = {"account": lake["azure_storage_account"]}
    if lake.get("gcp_project_id"):
        storage["gcs"] = {"project_id": lake["gcp_project_id"]}
    if storage:
        out["storage"] = storage
    bases = set()
    for i, m in enumerate(mappings):
        path = str(m.get("delta_table_path") or m.get("to") or "").rstrip("/")
        base, _, name = path.rpartition("/")
        if not base or not name:
            raise ConfigError(f"deltalake.topic_mappings.{i}.delta_table_path",
                              f"{path!r} is not <folder>/<table>")
        bases.add(base)
        table: dict[str, Any] = {"name": name, "base_path": base}
        if m.get("include_danube_metadata"):
            table["metadata_column"] = "_danube_metadata"
        decode: dict[str, Any] = {"format": _FORMATS.get(
            str(m.get("schema_type", "Bytes")).lower(), "bytes")}
        if decode["format"] == "json":
            schema = m.get("schema") or []
            if not schema:
                raise ConfigError(f"deltalake.topic_mappings.{i}.schema",
                                  "schema_type Json needs a schema")
            decode["schema"] = [{"name": f["name"], "type": f["data_type"],
                                 "nullable": f.get("nullable", True)} for f in schema]
        out["routes"].append({"topics": [danube["topics"][i]], "table": table,
                              "decode": decode})
    out["table"]["base_path"] = min(bases)
    out["checkpoint"] = "./lakesink-checkpoint"
    return out


def ignored(data: dict[str, Any]) -> list[str]:
    """The sink's settings that have no meaning in lakesink (logged once at start)."""
    names = [f"retry.{k}" for k in data.get("retry") or {}]
    names += [k for k in ("metrics_port", "log_level") if k in data]
    names += [f"processing.{k}" for k in data.get("processing") or {}
              if k not in ("batch_size", "batch_timeout_ms")]
    for m in (data.get("deltalake") or {}).get("topic_mappings") or []:
        if "write_mode" in m:
            names.append("topic_mappings.write_mode")
    return sorted(set(names))
