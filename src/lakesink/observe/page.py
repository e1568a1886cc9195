"""The status page at ``/`` of the metrics port: plain HTML and inline SVG made by the
process (no script, no build step, no CDN), refreshed by the browser every 10 s.

Per table: the last batches (rows, dead letters, files, their mean size, duration), a
hint when this run's files are many and small, dead letters by reason, rows written per
minute over the last hour; and the Kafka lag per partition.
Everything comes from :class:`~lakesink.observe.metrics.Metrics` (table, topic and
reason names, numbers), never from the configuration.
"""

from __future__ import annotations

import datetime as dt
import html
import time
from typing import TYPE_CHECKING

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
"""


def _samples(metrics: Metrics, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(s.labels), s.value) for family in metrics.registry.collect()
            for s in family.samples if s.name == name]


def _chart(per_minute: dict[int, int], now: float) -> str:
    """Rows written per minute, the last 60 minutes, as an SVG bar chart."""
    current = int(now // 60)
    values = [per_minute.get(current - 59 + i, 0) for i in range(60)]
    top = max(values) or 1
    width, height = 600, 90
    bars = "".join(
        f'<rect x="{i * 10}" y="{height - v * (height - 10) / top:.1f}" width="8" '
        f'height="{v * (height - 10) / top:.1f}" fill="#2f81f7"><title>{v} rows</title></rect>'
        for i, v in enumerate(values))
    return (f'<svg width="{width}" height="{height + 16}" role="img" aria-label="rows per '
            f'minute"><line x1="0" y1="{height}" x2="{width}" y2="{height}" '
            f'stroke="#d0d7de"/>{bars}<text x="0" y="{height + 14}" class="muted" '
            f'font-size="11">-60 min</text><text x="{width - 30}" y="{height + 14}" '
            f'font-size="11">now</text><text x="{width - 120}" y="12" font-size="11">'
            f'max {top} rows/min</text></svg>')


def _kib(size: int, files: int) -> str:
    return f"{size / files / 1024:,.0f} KiB" if files else "—"


def render(metrics: Metrics, health: Health) -> str:
    now = time.time()
    ready, why = health.ready()
    esc = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' "
             f"content='10'><title>lakesink</title><style>{_STYLE}</style></head><body>",
             "<h1>lakesink</h1>",
             f"<p class='{'ok' if ready else 'bad'}'>{esc(why)}</p>",
             f"<p class='muted'>up since {dt.datetime.fromtimestamp(metrics.started, dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
             " · <a href='/metrics'>/metrics</a> · <a href='/readyz'>/readyz</a></p>"]
    from lakesink.status import small_files_hint

    written = {name: {labels["table"]: value for labels, value in _samples(metrics, name)}
               for name in ("lakesink_files_written_total", "lakesink_bytes_written_total")}
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
        parts.append(f"<div class='card'><h2>{esc(table)}</h2>")
        parts.append(_chart(minutes[table], now))
        rows = "".join(
            f"<tr><td>{b['batch_id']}</td><td>{dt.datetime.fromtimestamp(b['at'], dt.UTC):%H:%M:%S}"
            f"</td><td>{b['written']}</td><td>{b['rejected']}</td><td>{b['files']}</td>"
            f"<td>{_kib(b['bytes'], b['files'])}</td>"
            f"<td>{b['seconds']:.2f} s</td></tr>" for b in recent[table][:10])
        parts.append("<table><tr><th>batch</th><th>committed (UTC)</th><th>rows</th>"
                     "<th>dead letters</th><th>files</th><th>mean file</th><th>duration</th>"
                     f"</tr>{rows}</table>")
        files = int(written["lakesink_files_written_total"].get(table, 0))
        size = int(written["lakesink_bytes_written_total"].get(table, 0))
        hint = small_files_hint(files, size // files) if files else None
        if hint:
            parts.append(f"<p class='bad'>this run: {esc(hint)}</p>")
        reasons = rejected.get(table, {})
        if reasons:
            parts.append("<p>dead letters by reason: " + ", ".join(
                f"{esc(r)} <b>{int(n)}</b>" for r, n in sorted(reasons.items())) + "</p>")
        parts.append("</div>")
    # Kafka's partitions are numbers; a Redis stream or list, a Danube topic has none
    lag = sorted(_samples(metrics, "lakesink_consumer_lag_records"),
                 key=lambda s: (s[0]["topic"], s[0]["partition"].isdigit(),
                                int(s[0]["partition"] or 0) if s[0]["partition"].isdigit()
                                else 0, s[0]["partition"]))
    if lag:
        cells = "".join(f"<tr><td>{esc(l['topic'])}</td><td>{esc(l['partition'])}</td>"
                        f"<td>{int(v)}</td></tr>" for l, v in lag)
        parts.append("<div class='card'><h2>lag</h2><table><tr><th>topic</th>"
                     f"<th>partition</th><th>records behind</th></tr>{cells}</table></div>")
    parts.append("</body></html>")
    return "".join(parts)
