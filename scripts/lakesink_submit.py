"""The ``spark-submit`` entry of lakesink: the same command line as ``lakesink``.

    spark-submit --master spark://host:7077 --jars "$(lakesink jars -c lakesink.yaml)" \
        --py-files lakesink-0.1.0-py3-none-any.whl \
        scripts/lakesink_submit.py run -c lakesink.yaml

(with ``spark.master: null`` in the config: spark-submit gives the master). See
``docs/deploy.md``.
"""

from lakesink.cli import main

if __name__ == "__main__":
    main()
