"""The Quix lakehouse catalog (``catalog.type: quix``), the calls the Quix TS Datalake
Sink makes (``docs/catalogs.md``):

* ``GET {url}/health``;
* ``GET {url}/namespaces/{ns}/tables/{table}``: an existing table's ``partition_spec``
  must hold the same columns as ``table.partition_by`` (else
  :class:`~lakesink.errors.LayoutError`, before any data moves; another order only
  warns, as there);
* ``PUT`` of the same path creates it (``auto_discover``), with the location and the
  expected partitions;
* ``POST …/manifest/add-files`` registers one batch's files, with their size, rows and
  partition values (a null folder as ``__None__``).

Every call sends ``Authorization: Bearer <token>`` when a token is configured. A refused
connection, a timeout or a 5xx answer is :class:`~lakesink.errors.CatalogUnavailable`
(the outbox retries); any other non-2xx answer is a :class:`~lakesink.errors.CatalogError`.

**Idempotency.** The API can neither say which files it holds nor take a batch key;
the outbox marks a batch right after the catalog's answer. The one window left is a
crash between that answer and the mark (fault point ``after_registration``), after
which the batch is sent again with the *same* file paths (lakesink's names derive from
the batch); Quix's open-source catalog keeps one manifest entry per path (an upsert on
``(table, file_path)``), so it still lists each file once.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from lakesink.catalog.base import Catalog, CommittedBatch
from lakesink.errors import CatalogError, CatalogUnavailable, LayoutError

if TYPE_CHECKING:
    from lakesink.config.catalog import QuixCatalogConfig

logger = logging.getLogger(__name__)

NULL_VALUE = "__None__"  # the Quix sink's null partition value


def file_uri(path: str) -> str:
    """A file's path as the Quix sink sends it: ``s3://`` for S3 (Hadoop's ``s3a://``)."""
    for scheme in ("s3a://", "s3n://"):
        if path.startswith(scheme):
            return "s3://" + path[len(scheme):]
    return path


class QuixCatalog(Catalog):
    def __init__(self, config: QuixCatalogConfig, *, table: str, location: str,
                 partition_by: list[str]) -> None:
        import requests

        assert config.url
        self.url = config.url.rstrip("/")
        self.namespace = config.namespace
        self.table = table
        self.location = file_uri(location)
        self.partition_by = list(partition_by)
        self.auto_discover = config.auto_discover
        self.timeout_s = config.timeout_s
        import hashlib

        key = "|".join((self.url, self.namespace, self.table))
        self.id = f"quix-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
        self.session = requests.Session()
        if config.auth_token is not None:
            self.session.headers["Authorization"] = (
                f"Bearer {config.auth_token.get_secret_value()}")
        self.exists = False

    def describe(self) -> str:
        return f"quix {self.url} {self.namespace}.{self.table}"

    @property
    def _table_url(self) -> str:
        return f"{self.url}/namespaces/{quote(self.namespace, safe='')}/tables/" \
               f"{quote(self.table, safe='')}"

    def _call(self, method: str, url: str, *, json: Any = None,  # noqa: ANN401
              ok: tuple[int, ...] = (200, 201, 204)) -> Any:  # noqa: ANN401
        import requests

        try:
            answer = self.session.request(method, url, json=json, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise CatalogUnavailable(f"{method} {url}: {type(exc).__name__}") from None
        if answer.status_code in ok:
            return answer
        if answer.status_code >= 500 or answer.status_code == 429:
            raise CatalogUnavailable(f"{method} {url}: HTTP {answer.status_code}")
        raise CatalogError(f"catalog {self.describe()}: {method} {url} answered HTTP "
                           f"{answer.status_code}: {answer.text[:200]}")

    def prepare(self) -> None:
        """Check the table's partitions, or create it (``auto_discover``)."""
        self._call("GET", f"{self.url}/health")
        answer = self._call("GET", self._table_url, ok=(200, 404))
        if answer.status_code == 200:
            self._check(answer.json() or {})
            self.exists = True
            return
        if not self.auto_discover:
            raise CatalogUnavailable(
                f"table {self.namespace}.{self.table} is not in the catalog and "
                "catalog.quix.auto_discover is off: create it there (files wait)")
        made = self._call("PUT", self._table_url, ok=(200, 201, 204, 409), json={
            "location": self.location, "partition_spec": [],
            "properties": {"created_by": "lakesink", "auto_discovered": "false",
                           "expected_partitions": self.partition_by}})
        self.exists = True
        if made.status_code != 409:  # 409: made meanwhile by another writer
            logger.info("catalog %s: table created", self.describe())

    def _check(self, table: dict[str, Any]) -> None:
        spec = table.get("partition_spec") or []
        names = [s if isinstance(s, str) else (s.get("name") or s.get("source_name"))
                 for s in spec]
        if not names:  # set when the first files arrive
            return
        if set(names) != set(self.partition_by):
            raise LayoutError(
                "table.partition_by",
                f"the catalog's table {self.namespace}.{self.table} is partitioned by "
                f"{names}, the config says {self.partition_by}",
                fix="use the catalog table's partition columns, or another table")
        if names != self.partition_by:
            logger.warning("catalog %s: partition columns %s in another order than the "
                           "config's %s", self.describe(), names, self.partition_by)

    def register(self, batch: CommittedBatch) -> None:
        now = dt.datetime.now(dt.UTC).isoformat()
        files = [{"file_path": file_uri(f.path), "file_size": f.bytes, "last_modified": now,
                  "partition_values": {k: NULL_VALUE if v is None else v
                                       for k, v in f.partition.items()},
                  "row_count": f.rows} for f in batch.files]
        if not files:
            return
        if not self.exists:
            self.prepare()
        answer = self._call("POST", f"{self._table_url}/manifest/add-files",
                            json={"files": files}, ok=(200, 201, 204, 404))
        if answer.status_code == 404:  # the table went away: made again at the next try
            self.exists = False
            raise CatalogUnavailable(f"table {self.namespace}.{self.table} is gone from "
                                     "the catalog; it is made again")

    def close(self) -> None:
        self.session.close()
