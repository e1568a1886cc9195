"""The status page at ``/`` of the metrics port: plain HTML and inline SVG made by the
process (no script, no build step, no CDN), refreshed by the browser every 10 s.

At the top, what the run reads and writes (the start line's source and tables). Per
table: this run's totals (rows, rows per second over the last five minutes, files and
their mean size, the time since the last commit), rows written per minute since the
start (up to the last hour; the chart takes the page's width), the last batches (rows,
dead letters, files, their mean size, duration), a hint when this run's files are many
and small, dead letters by reason; and the lag per topic and partition with its total.
Everything comes from :class:`~lakesink.observe.metrics.Metrics` (table, topic and
reason names, numbers, the start line's texts), never from the configuration itself.
"""

from __future__ import annotations

import datetime as dt
import html
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakesink.observe.health import Health
    from lakesink.observe.metrics import Metrics

_STYLE = """
body{font:14px system-ui,sans-serif;margin:24px;color:#1b1f24;background:#f6f8fa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
.card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:12px 16px;
margin-bottom:16px} table{border-collapse:collapse} td,th{padding:3px 10px;text-align:right;
border-bottom:1px solid #eaeef2} th{color:#57606a;font-weight:600} td:first-child,
th:first-child{text-align:left} .ok{color:#1a7f37} .bad{color:#cf222e} .muted{color:#57606a}
.totals{display:flex;flex-wrap:wrap;gap:6px 28px;margin:4px 0 12px} .totals b{font-size:18px}
.totals span{color:#57606a} .axis{display:flex;justify-content:space-between;font-size:11px;
color:#57606a;margin-bottom:8px} .run{word-break:break-all}
"""


def _samples(metrics: Metrics, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(s.labels), s.value) for family in metrics.registry.collect()
            for s in family.samples if s.name == name]


def _chart(per_minute: dict[int, int], now: float, started: float) -> str:
    """Rows written per minute since the start (at least 10 minutes, at most the last
    60), as an SVG bar chart as wide as the page."""
    current = int(now // 60)
    span = max(10, min(60, current - int(started // 60) + 1))
    values = [per_minute.get(current - span + 1 + i, 0) for i in range(span)]
    top = max(values) or 1
    width, height, slot = 600, 90, 600 / span
    bars = "".join(
        f'<rect x="{i * slot:.1f}" y="{height - v * (height - 10) / top:.1f}" '
        f'width="{slot * 0.8:.1f}" height="{v * (height - 10) / top:.1f}" fill="#2f81f7">'
        f'<title>{v:,} rows</title></rect>' for i, v in enumerate(values))
    return (f'<svg width="100%" height="{height + 16}" viewBox="0 0 {width} {height + 16}" '
            f'preserveAspectRatio="none" role="img" aria-label="rows per minute">'
            f'<line x1="0" y1="{height}" x2="{width}" y2="{height}" stroke="#d0d7de"/>{bars}'
            f'</svg><div class="axis"><span>-{span} min</span>'
            f'<span>max {top:,} rows/min</span><span>now</span></div>')


def _size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit in ("B", "KiB") else f"{size:,.1f} {unit}"
        size /= 1024
    return ""  # not reached


def _kib(size: int, files: int) -> str:
    return _size(size / files) if files else "—"


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def _rate_text(rate: float) -> str:
    return f"{rate:,.1f}" if rate < 10 else f"{rate:,.0f}"


def _rate(per_minute: dict[int, int], now: float, started: float) -> float:
    """Rows per second over the last five minutes (or since the start, if later)."""
    current = int(now // 60)
    rows = sum(v for m, v in per_minute.items() if m > current - 5)
    window = min(now - (current - 4) * 60, now - started)
    return rows / window if window > 0 else 0.0


def render(metrics: Metrics, health: Health) -> str:
    now = time.time()
    ready, why = health.ready()
    esc = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' "
             f"content='10'><title>lakesink</title><style>{_STYLE}</style></head><body>",
             "<h1>lakesink</h1>",
             f"<p class='{'ok' if ready else 'bad'}'>{esc(why)}</p>"]
    if metrics.source:
        parts.append(f"<p class='run'>{esc(metrics.source)} &rarr; {esc(metrics.target)}</p>")
    parts.append(f"<p class='muted'>up since {dt.datetime.fromtimestamp(metrics.started, dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
                 " · <a href='/metrics'>/metrics</a> · <a href='/readyz'>/readyz</a></p>")
    totals = {name: {labels["table"]: value for labels, value in _samples(metrics, name)}
              for name in ("lakesink_files_written_total", "lakesink_bytes_written_total",
                           "lakesink_records_written_total")}
    rejected: dict[str, dict[str, float]] = {}
    for labels, value in _samples(metrics, "lakesink_records_rejected_total"):
        rejected.setdefault(labels["table"], {})[labels["reason"]] = value
    with metrics._lock:
        tables = sorted(set(metrics.recent) | set(rejected))
        recent = {t: list(metrics.recent.get(t, [])) for t in tables}
        minutes = {t: dict(metrics.per_minute.get(t, {})) for t in tables}
    if not tables:
        parts.append("<p class='muted'>no batch committed yet</p>")
    for table in tables:
        total = {name.split("_")[1]: int(by_table.get(table, 0))
                 for name, by_table in totals.items()}
        parts.append(_table_card(table, total, recent[table], minutes[table],
                                 rejected.get(table, {}), now, metrics.started))
    parts.append(_lag_card(_samples(metrics, "lakesink_consumer_lag_records")))
    parts.append("</body></html>")
    return "".join(parts)


def _table_card(table: str, total: dict[str, int], recent: list[dict[str, Any]],
                minutes: dict[int, int], reasons: dict[str, float], now: float,
                started: float) -> str:
    """One table: this run's totals (``total``: records, files, bytes), its chart, its
    last batches, the small-files hint and its dead letters by reason."""
    from lakesink.status import small_files_hint

    esc = html.escape
    files, size = total["files"], total["bytes"]
    last = _ago(now - recent[0]["at"]) if recent else "—"
    parts = [f"<div class='card'><h2>{esc(table)}</h2><div class='totals'>",
             f"<div><b>{total['records']:,}</b> <span>rows</span></div>",
             f"<div><b>{_rate_text(_rate(minutes, now, started))}</b> "
             "<span>rows/s (5 min)</span></div>",
             f"<div><b>{files:,}</b> <span>files</span></div>",
             f"<div><b>{_kib(size, files)}</b> <span>mean file</span></div>",
             f"<div><b>{last}</b> <span>last commit</span></div></div>",
             _chart(minutes, now, started)]
    rows = "".join(
        f"<tr><td>{b['batch_id']}</td><td>{dt.datetime.fromtimestamp(b['at'], dt.UTC):%H:%M:%S}"
        f"</td><td>{b['written']:,}</td><td>{b['rejected']:,}</td><td>{b['files']:,}</td>"
        f"<td>{_kib(b['bytes'], b['files'])}</td>"
        f"<td>{b['seconds']:.2f} s</td></tr>" for b in recent[:10])
    parts.append("<table><tr><th>batch</th><th>committed (UTC)</th><th>rows</th>"
                 "<th>dead letters</th><th>files</th><th>mean file</th><th>duration</th>"
                 f"</tr>{rows}</table>")
    hint = small_files_hint(files, size // files) if files else None
    if hint:
        parts.append(f"<p class='bad'>this run: {esc(hint)}</p>")
    if reasons:
        parts.append("<p>dead letters by reason: " + ", ".join(
            f"{esc(r)} <b>{int(n):,}</b>" for r, n in sorted(reasons.items())) + "</p>")
    parts.append("</div>")
    return "".join(parts)


def _lag_card(lag: list[tuple[dict[str, str], float]]) -> str:
    """Records behind per topic and partition, and their total ("" before the first
    progress report). Kafka's partitions are numbers; a Redis stream or list, a Danube
    topic has none."""
    if not lag:
        return ""
    esc = html.escape
    lag = sorted(lag, key=lambda s: (s[0]["topic"], s[0]["partition"].isdigit(),
                                     int(s[0]["partition"] or 0)
                                     if s[0]["partition"].isdigit() else 0,
                                     s[0]["partition"]))
    cells = "".join(f"<tr><td>{esc(labels['topic'])}</td><td>{esc(labels['partition'])}</td>"
                    f"<td>{int(v):,}</td></tr>" for labels, v in lag)
    return (f"<div class='card'><h2>lag</h2><div class='totals'><div><b>"
            f"{int(sum(v for _, v in lag)):,}</b> <span>records behind in all</span></div>"
            "</div><table><tr><th>topic</th><th>partition</th><th>records behind</th></tr>"
            f"{cells}</table></div>")
