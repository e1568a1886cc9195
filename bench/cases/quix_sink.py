"""quixstreams' ``QuixTSDataLakeSink`` (the library sink of the Quix seed) on local disk.

Runs in its own virtualenv (quixstreams[quixdatalake] needs Python >= 3.12 for
quixportal); storage is quixportal's ``Local`` provider, configured through
``Quix__BlobStorage__Connection__Json``, no catalog. Same partitions as the other
cases (location/year/month/day from ``ts_ms``). Prints ``READY`` and
``PROGRESS <rows>`` per flushed batch.

    python bench/cases/quix_sink.py --bootstrap H:P --topic T --root DIR --count N
"""

from __future__ import annotations

import argparse
import json
import os
import uuid


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--root", required=True, help="local directory (the 'bucket')")
    ap.add_argument("--count", type=int, default=0, help="stop after this many records")
    ap.add_argument("--commit-interval", type=float, default=5.0)
    args = ap.parse_args()
    os.environ["Quix__BlobStorage__Connection__Json"] = json.dumps(
        {"Provider": "Local", "LocalStorage": {"DirectoryPath": args.root}})

    from quixstreams import Application
    from quixstreams.sinks.core.quix_ts_datalake_sink import QuixTSDataLakeSink

    class CountingSink(QuixTSDataLakeSink):
        def write(self, batch):  # noqa: ANN001, ANN201
            super().write(batch)
            print("PROGRESS", batch.size, flush=True)

    app = Application(broker_address=args.bootstrap, consumer_group=f"bench-{uuid.uuid4().hex}",
                      auto_offset_reset="earliest", commit_interval=args.commit_interval)
    sdf = app.dataframe(app.topic(args.topic, value_deserializer="json"))
    sdf.sink(CountingSink(s3_prefix="lake", table_name="sensors",
                          hive_columns=["location", "year", "month", "day"],
                          timestamp_column="ts_ms"))
    print("READY", flush=True)
    app.run(count=args.count, collect=False) if args.count else app.run()


if __name__ == "__main__":
    main()
