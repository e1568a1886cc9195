"""Shared fixtures: one Kafka broker and one SparkSession per test run."""

import logging
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.fixtures.services"]


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A command run in this process (typer's runner) sets up logging to its own
    stderr, which the runner closes: the root logger's handlers and level go back
    as they were, so a later test's logs are not written to a closed stream."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
