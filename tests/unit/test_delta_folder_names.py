"""A Delta table's folder names against the two spellings of a path in its log: how
delta-rs writes it (the Arrow path's commits) and how Delta-Spark's ``VACUUM`` spells a
listed file (``java.net.URI``'s quoting of a path). They must agree for every folder
lakesink names, or Spark's VACUUM deletes live files (no Spark here: Java's rule is
written out below from the ``URI`` documentation)."""

from __future__ import annotations

import json
import string
import time
import unicodedata
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakesink.maintenance.delta import _exposed_to_vacuum
from lakesink.tables.paths import escape_value

#: what ``java.net.URI``'s multi-argument constructors leave raw in a path: unreserved
#: and the path's punctuation (RFC 2396), and any non-ASCII character that is neither a
#: space nor a control character
_JAVA_RAW = set(string.ascii_letters + string.digits + "-_.!~*'()" + ":@&=+$,;/")


def java_spelling(path: str) -> str:
    def raw(c: str) -> bool:
        if c.isascii():
            return c in _JAVA_RAW
        return not (unicodedata.category(c) in ("Zs", "Zl", "Zp") or 0x7F <= ord(c) <= 0x9F)

    return "".join(c if raw(c) else quote(c, safe="") for c in path)


def delta_rs_spellings(tmp_path: Path, folders: list[str]) -> list[str]:
    """The log paths delta-rs writes for files in ``folders`` (partition ``p``)."""
    from deltalake import DeltaTable, write_deltalake
    from deltalake.transaction import AddAction

    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"v": pa.array([], pa.int64()),
                                          "p": pa.array([], pa.string())}), partition_by=["p"])
    adds = []
    for i, folder in enumerate(folders):
        (table / folder).mkdir(exist_ok=True)
        pq.write_table(pa.table({"v": [i]}), table / folder / f"f{i}.parquet")
        adds.append(AddAction(f"{folder}/f{i}.parquet", (table / folder / f"f{i}.parquet")
                              .stat().st_size, {"p": str(i)}, int(time.time() * 1000), True,
                              json.dumps({"numRecords": 1})))
    dt = DeltaTable(str(table))
    dt.create_write_transaction(adds, "append", dt.schema(), partition_by=["p"])
    log = sorted((table / "_delta_log").glob("*.json"))[-1]
    paths = [json.loads(line)["add"]["path"] for line in log.read_text().splitlines()
             if '"add"' in line]
    return sorted(paths, key=lambda p: int(p.rpartition("/f")[2].split(".")[0]))


VALUES = [*(c for c in string.printable if c not in "\t\n\r\x0b\x0c"), "Zürich", "日本",
          "🦀", "a\u00a0b", "â\u0080\u0099", "x\u3000y", "50% ü"]


def test_delta_rs_and_java_spell_every_folder_lakesink_names_alike(tmp_path: Path) -> None:
    """Every printable ASCII character and some non-ASCII ones (no-break and ideographic
    spaces, C1 controls), in the folder a Delta table's Arrow path names: delta-rs' log
    spelling is Java's (a deltalake upgrade that changes it fails here, not in a user's
    VACUUM)."""
    folders = [f"p={escape_value(v, ascii_only=True)}" for v in VALUES]
    written = delta_rs_spellings(tmp_path, folders)
    for folder, logged in zip(folders, written, strict=True):
        assert logged.rpartition("/")[0] == java_spelling(folder), folder
        assert not _exposed_to_vacuum(logged)


def test_the_raw_non_ascii_folders_of_an_earlier_lakesink_are_exposed(tmp_path: Path) -> None:
    """The old naming (raw non-ASCII folder, committed by delta-rs): the log's spelling
    differs from Java's where a character Java leaves raw is encoded, and
    ``_exposed_to_vacuum`` says so exactly there."""
    values = ["Zürich", "日本", "a\u00a0b", "â\u0080\u0099", "plain", "a b"]
    folders = [f"p={escape_value(v)}" for v in values]
    for folder, logged in zip(folders, delta_rs_spellings(tmp_path, folders), strict=True):
        differs = logged.rpartition("/")[0] != java_spelling(folder)
        assert _exposed_to_vacuum(logged) is differs, (folder, logged)
    assert [_exposed_to_vacuum(p) for p in ("p=Zürich/f.parquet", "p=a%C2%A0b/f.parquet",
                                             "p=Z%25C3%25BCrich/f.parquet")] == [False] * 3


@pytest.mark.parametrize("path", ["p=Z%C3%BCrich/f.parquet", "p=%E6%97%A5/f.parquet",
                                  "p=%C3%A2%C2%80%C2%99/f.parquet"])
def test_a_percent_encoded_character_java_keeps_raw_is_exposed(path: str) -> None:
    assert _exposed_to_vacuum(path)
