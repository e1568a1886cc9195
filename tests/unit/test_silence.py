"""Silence detection without Spark: the verdict, the config rules (Quix's), the callback
in bounded time, the event's Kafka value."""

from __future__ import annotations

import json
import threading
from collections import namedtuple
from typing import Any

import pytest

from lakesink.config import load_config
from lakesink.errors import ConfigError
from lakesink.silence.outputs import Callback, event_value, load_callback
from lakesink.silence.tracker import stream_text, verdict

BASE = {"source": {"kafka": {"bootstrap_servers": "b:9092", "topics": ["events"]}}}
Event = namedtuple("Event", "key stream event ts_ms last_seen_ms silent_ms")


def silence(**values: Any) -> Any:  # noqa: ANN401
    cfg = load_config(flags={f"silence.{k}": v for k, v in values.items()},
                      env={"LAKESINK_SOURCE__KAFKA__BOOTSTRAP_SERVERS": "b:9092",
                           "LAKESINK_SOURCE__KAFKA__TOPICS": "events"})
    return cfg.silence


@pytest.mark.parametrize(("now", "expected"), [
    (1000 + 4999, "wait"), (1000 + 5000, "fire"), (1000 + 14_999, "fire"),
    (1000 + 15_000, "sweep"), (1000 + 10**9, "sweep"), (1000, "wait")])
def test_verdict(now: int, expected: str) -> None:
    assert verdict(now, 1000, 5000, 3.0) == expected


def test_off_by_default_and_on_with_a_timeout_and_an_output() -> None:
    assert not silence().enabled
    on = silence(timeout_ms=60_000, topic="alerts")
    assert on.enabled and on.time == "processing" and on.ttl_factor == 3
    assert on.interval == "12000 milliseconds"  # timeout / 5
    assert silence(timeout_ms=500, table="t").interval == "1000 milliseconds"  # at least 1 s
    assert silence(timeout_ms=10**7, table="t").interval == "30000 milliseconds"  # at most 30
    assert silence(timeout_ms=500, table="t", trigger_interval="2 seconds").interval == \
        "2 seconds"
    # short forms are turned into what Spark's interval parser takes (it refuses "ms")
    assert silence(timeout_ms=500, table="t", trigger_interval="100 ms").interval == \
        "100 milliseconds"
    assert silence(timeout_ms=500, table="t", watermark_delay="5s").watermark_delay == \
        "5 seconds"


@pytest.mark.parametrize(("values", "key", "words"), [
    ({"timeout_ms": 5000}, "silence.timeout_ms", "no output"),
    ({"topic": "alerts"}, "silence.timeout_ms", "required when silence.topic"),
    ({"callback": "m:f"}, "silence.timeout_ms", "required when silence.callback"),
    ({"timeout_ms": 0, "topic": "x"}, "silence.timeout_ms", "greater than 0"),
    ({"timeout_ms": -5, "topic": "x"}, "silence.timeout_ms", "greater than 0"),
    ({"timeout_ms": True, "topic": "x"}, "silence.timeout_ms", "not a boolean"),
    ({"timeout_ms": 5000, "callback": "no_colon"}, "silence.callback", "module:function"),
    ({"timeout_ms": 5000, "table": "bad/name"}, "silence.table", "not a table name"),
    ({"timeout_ms": 5000, "topic": "x", "ttl_factor": 1}, "silence.ttl_factor", "greater"),
    ({"timeout_ms": 5000, "topic": "x", "time": "wall"}, "silence.time", "processing"),
    ({"timeout_ms": 5000, "topic": "x", "trigger_interval": "soon"},
     "silence.trigger_interval", "duration"),
    ({"timeout_ms": 5000, "topic": "x", "watermark_delay": "5 fortnights"},
     "silence.watermark_delay", "duration"),
])
def test_config_errors_name_the_key(values: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        silence(**values)
    assert err.value.key == key
    assert words in err.value.message


def test_callback_must_be_importable() -> None:
    assert load_callback("json:dumps") is json.dumps
    for spec in ("no_such_module_xyz:f", "json:no_such_function"):
        with pytest.raises(ConfigError) as err:
            load_callback(spec)
        assert err.value.key == "silence.callback"


def test_event_value_is_the_quix_shape() -> None:
    e = Event(b"\xffa", stream_text(b"\xffa"), "stream_timeout", 1234, 1000, 234)
    assert json.loads(event_value(e)) == {"ts_ms": 1234, "stream": "\ufffda",
                                          "event": "stream_timeout"}


def test_callback_gets_the_key_and_optionally_the_event() -> None:
    one: list[Any] = []
    two: list[Any] = []
    e = Event(b"k", "k", "stream_timeout", 10, 1, 9)
    Callback(lambda key: one.append(key), timeout_s=5)([e])
    Callback(lambda key, event: two.append((key, event)), timeout_s=5)([e])
    assert one == [b"k"]
    assert two == [(b"k", {"ts_ms": 10, "stream": "k", "event": "stream_timeout",
                           "silent_ms": 9})]


def test_a_raising_or_hanging_callback_is_logged_and_bounded(caplog) -> None:  # noqa: ANN001
    release = threading.Event()
    seen: list[bytes] = []

    def fn(key: bytes) -> None:
        seen.append(key)
        if key == b"hang":
            release.wait(60)
        if key == b"boom":
            raise RuntimeError("callback bug")

    callback = Callback(fn, timeout_s=1.0)
    events = [Event(k, k.decode(), "stream_timeout", 1, 0, 1) for k in (b"hang", b"boom", b"ok")]
    undelivered = callback(events)  # returns while the hung call still runs (timeout_s)
    assert sorted(e.key for e in undelivered) == [b"boom", b"hang"]
    hung_alive = [t.is_alive() for t in callback.hung]
    release.set()
    assert hung_alive == [True]
    assert sorted(seen) == [b"boom", b"hang", b"ok"]
    assert (callback.failures, callback.timeouts) == (1, 1)
    assert "callback raised for stream 'boom'" in caplog.text
    assert "did not return within 1s" in caplog.text


class _Markers:
    """The marker calls of :class:`Outputs` on a dict (no JVM)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def exists(self, path: str) -> bool:
        return path in self.files

    def write_text(self, path: str, text: str) -> None:
        self.files[path] = text

    def delete(self, path: str, recursive: bool = True) -> bool:  # noqa: ARG002
        return self.files.pop(path, None) is not None


def _outputs(fn, markers: _Markers) -> Any:  # noqa: ANN001, ANN401
    from lakesink.silence import outputs

    return outputs.Outputs(None, markers, "/cp", table=None, topic=None, kafka_options={},
                           callback=outputs.Callback(fn, timeout_s=1.0))


def test_failed_callback_calls_are_made_again_and_marked_only_after_success(monkeypatch
                                                                            ) -> None:
    """Issue 17 scenario 12: the delivered marker was written even when calls raised,
    so a failed event was never delivered. Now: called again, marker after success."""
    from lakesink.silence import outputs

    monkeypatch.setattr(outputs, "CALLBACK_BACKOFF_S", 0.0)
    calls: list[bytes] = []
    failures = {b"flaky": 1}

    def fn(key: bytes) -> None:
        calls.append(key)
        if failures.get(key, 0) > 0:
            failures[key] -= 1
            raise RuntimeError("transient")

    markers = _Markers()
    events = [Event(k, k.decode(), "stream_timeout", 1, 0, 1) for k in (b"ok", b"flaky")]
    _outputs(fn, markers).deliver(7, events)
    assert sorted(calls) == [b"flaky", b"flaky", b"ok"]  # only the failed one again
    assert "/cp/delivered/7.callback" in markers.files


def test_a_callback_that_keeps_failing_fails_the_batch_unmarked(monkeypatch) -> None:
    from lakesink.errors import SinkError
    from lakesink.silence import outputs

    monkeypatch.setattr(outputs, "CALLBACK_BACKOFF_S", 0.0)
    calls: list[bytes] = []

    def fn(key: bytes) -> None:
        calls.append(key)
        raise RuntimeError("down")

    markers = _Markers()
    with pytest.raises(SinkError, match="at least once"):
        _outputs(fn, markers).deliver(3, [Event(b"k", "k", "stream_timeout", 1, 0, 1)])
    assert calls == [b"k"] * outputs.CALLBACK_ATTEMPTS
    assert not markers.files  # the batch runs again and calls again


class _Value:
    def __init__(self) -> None:
        self.value: tuple[int] | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple[int]:
        assert self.value is not None
        return self.value

    def update(self, value: tuple[int]) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class _Handle:
    def __init__(self) -> None:
        self.state = _Value()
        self.timers: list[int] = []

    def getValueState(self, *_: Any) -> _Value:  # noqa: N802 - Spark's API
        return self.state

    def listTimers(self) -> list[int]:  # noqa: N802
        return list(self.timers)

    def deleteTimer(self, t: int) -> None:  # noqa: N802
        self.timers.remove(t)

    def registerTimer(self, t: int) -> None:  # noqa: N802
        self.timers.append(t)


class _Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def getCurrentWatermarkInMs(self) -> int:  # noqa: N802
        return self.ms

    def getCurrentProcessingTimeInMs(self) -> int:  # noqa: N802
        return self.ms


def _silences(batches: list[list[int]], timeout_ms: int = 10) -> list[tuple[int, int]]:
    """(last seen, silent ms) of every event of one key fed ``batches`` of record
    times, timers fired at each batch's watermark (its newest time)."""
    import pandas as pd

    from lakesink.silence.tracker import RECORD, SilenceTracker

    tracker = SilenceTracker(timeout_ms, ttl_factor=100, event_time=True)
    handle = _Handle()
    tracker.init(handle)
    out: list[tuple[int, int]] = []
    for times in batches:
        clock = _Clock(max(times))
        for t in [t for t in handle.timers if t <= clock.ms]:
            handle.timers.remove(t)
            for df in tracker.handleExpiredTimer((RECORD, b"k"), clock, None):
                out += [(r["last_seen_ms"], r["silent_ms"]) for _, r in df.iterrows()]
        half = len(times) // 2  # Spark hands a key's rows over in Arrow-sized pieces
        frames = [pd.DataFrame({"ts_ms": part}) for part in (times[:half], times[half:])
                  if part]
        for df in tracker.handleInputRows((RECORD, b"k"), iter(frames), clock):
            out += [(r["last_seen_ms"], r["silent_ms"]) for _, r in df.iterrows()]
    return sorted(out)


def test_a_silence_inside_one_batch_fires_like_across_batches() -> None:
    """Issue 17 scenario 11: the tracker compared a batch only with its first record,
    so a gap between two records of one batch never fired; the result depended on the
    batch size. Records out of order within the batch are sorted first."""
    times = [0, 3, 5, 40, 41, 43, 70, 72]  # silences 5..40 and 43..70 (timeout 10)
    one_batch = _silences([[43, 0, 72, 3, 40, 5, 41, 70]])
    per_record = _silences([[t] for t in times])
    in_threes = _silences([times[i:i + 3] for i in range(0, len(times), 3)])
    assert [last for last, _ in one_batch] == [5, 43]
    assert [last for last, _ in per_record] == [5, 43]
    assert [last for last, _ in in_threes] == [5, 43]
    assert [silent for _, silent in one_batch] == [35, 27]
