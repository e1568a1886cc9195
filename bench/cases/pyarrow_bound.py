"""Upper bound without Kafka or Spark: pyarrow decodes the same JSON bytes and writes
the same Hive-partitioned Parquet (location/year/month/day), in one process.

    python bench/cases/pyarrow_bound.py --input values.ndjson --out DIR

Prints ``PROGRESS <rows>`` per decoded block.
"""

from __future__ import annotations

import argparse
import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.json as pj

CHUNK = 64 * 1024 * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    part_schema = pa.schema([("location", pa.string()), ("year", pa.string()),
                             ("month", pa.string()), ("day", pa.string())])
    n = 0
    print("READY", flush=True)
    with open(args.input, "rb") as f:
        while True:
            block = f.read(CHUNK)
            if not block:
                break
            block += f.readline()  # end on a record boundary
            table = pj.read_json(io.BytesIO(block),
                                 read_options=pj.ReadOptions(block_size=8 << 20))
            ts = pc.cast(table.column("ts_ms"), pa.timestamp("ms", tz="UTC"))
            table = (table.append_column("year", pc.strftime(ts, "%Y"))
                     .append_column("month", pc.strftime(ts, "%m"))
                     .append_column("day", pc.strftime(ts, "%d")))
            ds.write_dataset(table, args.out, format="parquet",
                             partitioning=ds.partitioning(part_schema, flavor="hive"),
                             basename_template=f"part-{n:012d}-{{i}}.parquet",
                             existing_data_behavior="overwrite_or_ignore")
            n += table.num_rows
            print("PROGRESS", table.num_rows, flush=True)


if __name__ == "__main__":
    main()
