"""Local stand-ins for outside services, on 127.0.0.1 only, for the demo, the tests and
the benchmark: a KRaft Kafka broker (with secured listeners), SeaweedFS for S3, HDFS
(MiniDFSCluster), a GCS emulator, Redis, a schema registry, a Hive metastore and a Spark
standalone cluster. ``lakesink run`` never imports this package; the product's own
runtime (Spark session, jars, storage options, shutdown) is :mod:`lakesink.runtime`."""
