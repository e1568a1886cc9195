"""The peers' surfaces: what a user of the system lakesink replaces already has, read as
a lakesink configuration (a dict of lakesink keys) — the Quix TS Datalake Sink's
environment and the Quix Portal's broker settings (:mod:`.quix_env`, :mod:`.quix_portal`),
the FS Data Sink's file (:mod:`.fds_file`), the Danube Delta Lake sink's TOML
(:mod:`.danube_toml`) and kafka-delta-ingest's command lines (:mod:`.kdi`).

These modules translate; they read no table and start no client, except the Quix
Portal's one HTTP request for the broker settings. The loader
(:func:`lakesink.config.load_config`) picks a file's or environment's surface; the
take-over from kafka-delta-ingest's offsets, which reads the table and the broker, is
:mod:`lakesink.kdi`.
"""
