"""Spark's streaming progress -> lakesink's metrics and health (one listener per run,
registered on the session while the run lasts; it follows the ingestion query by its
name and ignores the others, such as the silence query)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming import StreamingQueryListener

if TYPE_CHECKING:
    from lakesink.observe.health import Health
    from lakesink.observe.metrics import Metrics


class ProgressListener(StreamingQueryListener):
    def __init__(self, query_name: str, metrics: Metrics, health: Health) -> None:
        self.query_name = query_name
        self.metrics = metrics
        self.health = health
        self.ids: set[str] = set()

    def onQueryStarted(self, event: Any) -> None:  # noqa: ANN401, N802 - Spark's API
        if event.name == self.query_name:
            self.ids.add(str(event.id))
            self.metrics.query_active.set(1)
            self.health.started()

    def onQueryProgress(self, event: Any) -> None:  # noqa: ANN401, N802
        progress = event.progress
        if progress.name != self.query_name:
            return
        self.metrics.progress([(s.endOffset, s.latestOffset) for s in progress.sources])
        self.health.committed()  # a progress report follows a batch that returned

    def onQueryIdle(self, event: Any) -> None:  # noqa: ANN401, N802
        if str(event.id) in self.ids:
            self.health.progressed()

    def onQueryTerminated(self, event: Any) -> None:  # noqa: ANN401, N802
        if str(event.id) in self.ids:
            self.metrics.query_active.set(0)
            self.health.stopped()
