"""Table writers. Each writes one micro-batch idempotently; see :mod:`lakesink.tables.base`."""
