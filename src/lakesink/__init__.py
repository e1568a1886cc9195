"""lakesink: stream events from message brokers into an open data lake, exactly once."""

__version__ = "0.1.0"
