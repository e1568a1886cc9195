"""Per-key silence detection: a second, stateful streaming query over the same source.

- :mod:`.tracker` — the per-key state machine (last seen, timer, fire / sweep), as a
  ``StatefulProcessor`` for ``transformWithStateInPandas`` on the RocksDB state store;
- :mod:`.query` — the query: the source's keys and times, a heartbeat, the tracker;
- :mod:`.outputs` — where a silence goes: a Kafka topic, a table, a Python callback.
"""

from lakesink.silence.query import SilenceQuery, SilenceStats

__all__ = ["SilenceQuery", "SilenceStats"]
