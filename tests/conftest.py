"""Shared fixtures: one Kafka broker and one SparkSession per test run."""

pytest_plugins = ["tests.fixtures.services"]
