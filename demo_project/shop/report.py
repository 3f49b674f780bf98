"""Rendering the showcase: a timeline per key (text, JSON, HTML) and the verdicts.

The timeline of a key is read back from the database after the path ran: its
``CoordinationEvent`` rows (acquired, released, refused, parked, resumed ...) and the step
bodies that ran under it (``Activity`` rows of the steps that declared the key), on a time axis
that starts when the path started. Hold and park bars are paired by ``reactor_app.timeline``,
the same code that draws the admin's timeline, and the HTML file embeds that SVG.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.utils.html import escape

from demo_project.shop.models import Activity
from demo_project.shop.showcase import PathReport
from reactor_app import timeline as hold_timeline
from reactor_app.models import CoordinationEvent, StepRun
from reactor_app.status import CoordinationEventKind as Kind
from reactor_app.status import StepRunStatus

#: columns of the text bar chart
CHART_WIDTH = 56
#: seconds read before the path's start and after its end
MARGIN = timedelta(seconds=1)
GLYPHS = {"hold": "█", "park": "░", "body": "▒"}


@dataclass
class KeyTimeline:
    """Everything drawn for one key of one path."""

    key: str
    zero: datetime
    end: datetime
    events: list[CoordinationEvent]
    bodies: list[Activity]
    skips: list[StepRun]
    holds: hold_timeline.Timeline


def key_timeline(report: PathReport, key: str) -> KeyTimeline:
    zero = report.started
    end = report.finished or zero
    events = list(
        CoordinationEvent.objects.filter(
            key=key, at__gte=zero - MARGIN, at__lte=end + MARGIN
        ).order_by("at", "id")
    )
    steps = {e.step for e in events if e.step}
    bodies = list(
        Activity.objects.filter(
            execution_id__in=list(report.labels), step__in=steps, started_at__gte=zero - MARGIN
        ).order_by("started_at")
    )
    # a step skipped by its period (or a failed ordered chain) took no hold: no event to show
    skips = list(
        StepRun.objects.filter(
            execution_id__in=list(report.labels), step__in=steps, status=StepRunStatus.SKIPPED
        ).order_by("started_at")
    )
    last = max([end, *(e.at for e in events), *(b.finished_at for b in bodies)])
    return KeyTimeline(
        key=key,
        zero=zero,
        end=last,
        events=events,
        bodies=bodies,
        skips=skips,
        holds=hold_timeline.build(key, zero, last, events),
    )


def _t(moment: datetime, zero: datetime) -> float:
    return round((moment - zero).total_seconds(), 3)


def describe_event(report: PathReport, event: CoordinationEvent) -> str:
    detail = event.detail or {}
    primitive = event.primitive
    if event.kind == Kind.ACQUIRED:
        text = f"acquired {primitive}"
        if event.token is not None:
            text += f" · token {event.token}"
        if detail.get("reentrant"):
            text += " (re-entered)"
        return text
    if event.kind == Kind.RELEASED:
        outcome = detail.get("outcome")
        return f"released {primitive}" + (f" ({outcome})" if outcome else "")
    if event.kind == Kind.ACQUISITION_FAILED:
        blocker = detail.get("blocker") or {}
        if blocker.get("owner") or blocker.get("execution"):
            who = report.label(blocker.get("execution") or blocker.get("owner"))
            step = blocker.get("step")
            return f"refused {primitive}: held by {who}" + (f" (step {step})" if step else "")
        retry_after = detail.get("retry_after")
        return f"refused {primitive}" + (
            f": retry after {float(retry_after):.2f}s" if retry_after is not None else ""
        )
    if event.kind == Kind.PARKED:
        return (
            f"parked on {primitive} (attempt {detail.get('attempts')}, "
            f"backoff requeue in {detail.get('requeue_in')}s)"
        )
    if event.kind == Kind.RESUMED:
        return "resumed (delivered again)"
    return f"{event.kind} {primitive}"


def event_rows(report: PathReport, timeline: KeyTimeline) -> list[dict[str, Any]]:
    """One row per coordination event and per body start/end, in time order."""
    rows: list[dict[str, Any]] = [
        {
            "t": _t(e.at, timeline.zero),
            "who": report.label(e.execution_id),
            "step": e.step or "(reactor)",
            "event": e.kind,
            "primitive": e.primitive,
            "token": e.token,
            "text": describe_event(report, e),
        }
        for e in timeline.events
    ]
    for body in timeline.bodies:
        what = "refund body" if body.kind == Activity.Kind.UNDO else "body"
        for moment, edge in ((body.started_at, "began"), (body.finished_at, "ended")):
            rows.append(
                {
                    "t": _t(moment, timeline.zero),
                    "who": report.label(body.execution_id),
                    "step": body.step,
                    "event": f"{'undo' if body.kind == Activity.Kind.UNDO else 'run'}_{edge}",
                    "primitive": None,
                    "token": body.fencing_token,
                    "text": f"{what} {edge}" + (f" (pid {body.pid})" if edge == "began" else ""),
                }
            )
    for skipped in timeline.skips:
        reason = (skipped.detail or {}).get("reason")
        rows.append(
            {
                "t": _t(skipped.started_at, timeline.zero),
                "who": report.label(skipped.execution_id),
                "step": skipped.step,
                "event": "step_skipped",
                "primitive": None,
                "token": None,
                "text": "step skipped, took no hold" + (f" (reason: {reason})" if reason else ""),
            }
        )
    rows.sort(key=lambda row: row["t"])
    return rows


def _lanes(
    report: PathReport, timeline: KeyTimeline
) -> list[tuple[str, list[tuple[str, float, float]]]]:
    """``(label, [(glyph kind, start s, end s)])`` rows: hold/park lanes, then bodies."""
    lanes: dict[str, list[tuple[str, float, float]]] = {}
    end_s = _t(timeline.end, timeline.zero)
    for bar in timeline.holds.bars:
        lane = bar.lane
        who = report.label(lane.execution or lane.owner)
        label = f"{who} {lane.step or '(reactor)'} {lane.primitive}"
        stop = _t(bar.end, timeline.zero) if bar.end else end_s
        lanes.setdefault(label, []).append((bar.kind, _t(bar.start, timeline.zero), stop))
    for body in timeline.bodies:
        label = f"{report.label(body.execution_id)} {body.step} body"
        lanes.setdefault(label, []).append(
            ("body", _t(body.started_at, timeline.zero), _t(body.finished_at, timeline.zero))
        )
    return sorted(lanes.items(), key=lambda item: (item[0].split(" ", 1)[0], item[0]))


def chart_lines(report: PathReport, timeline: KeyTimeline, width: int = CHART_WIDTH) -> list[str]:
    span = max(_t(timeline.end, timeline.zero), 0.001)
    lanes = _lanes(report, timeline)
    label_width = max([len(label) for label, _ in lanes] + [10])
    scale = f"0s{' ' * (width - len(f'{span:.1f}s') - 2)}{span:.1f}s"
    lines = [f"  {' ' * label_width}  {scale}"]
    for label, segments in lanes:
        cells = [" "] * width
        for kind, start, stop in segments:
            first = min(width - 1, max(0, int(start / span * width)))
            last = min(width - 1, max(first, int(stop / span * width) - 1))
            for column in range(first, last + 1):
                cells[column] = GLYPHS.get(kind, "?")
        lines.append(f"  {label:<{label_width}} |{''.join(cells)}|")
    lines.append(f"  {' ' * label_width}  █ hold   ░ parked   ▒ step body")
    return lines


def text_timeline(report: PathReport) -> list[str]:
    """The printed timeline of every key of ``report``."""
    lines: list[str] = []
    for key in report.keys:
        timeline = key_timeline(report, key)
        zero = f"{timeline.zero:%H:%M:%S.%f}"[:-3]  # milliseconds
        lines.append(f"\n-- timeline of {key} ({report.name}; t=0 at {zero} UTC)")
        lines.append(f"  {'t (s)':>7}  {'who':<4} {'step':<10} event")
        for row in event_rows(report, timeline):
            lines.append(f"  {row['t']:>7.3f}  {row['who']:<4} {row['step']:<10} {row['text']}")
        lines.extend(chart_lines(report, timeline))
    return lines


def verdict_lines(report: PathReport) -> list[str]:
    lines = [f"\n{'PASS' if report.passed else 'FAIL'}  {report.title} — {report.runs_on}"]
    for observation in report.observations:
        lines.append(f"      seen: {observation}")
    for verdict in report.verdicts:
        lines.append(f"  [{'PASS' if verdict.passed else 'FAIL'}] {verdict.claim}")
        lines.append(f"         {verdict.evidence}")
    return lines


def as_json(reports: Sequence[PathReport], meta: dict[str, Any]) -> dict[str, Any]:
    paths = []
    for report in reports:
        timelines = {}
        for key in report.keys:
            timeline = key_timeline(report, key)
            timelines[key] = event_rows(report, timeline)
        paths.append(
            {
                "name": report.name,
                "title": report.title,
                "runs_on": report.runs_on,
                "passed": report.passed,
                "error": report.error,
                "started": report.started.isoformat(),
                "finished": report.finished.isoformat() if report.finished else None,
                "executions": {label: execution for execution, label in report.labels.items()},
                "keys": report.keys,
                "observations": report.observations,
                "claims": [v.as_dict() for v in report.verdicts],
                "timeline": timelines,
            }
        )
    return {"ok": all(r.passed for r in reports), **meta, "paths": paths}


# -- HTML -------------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; max-width: 1200px; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2.5rem; }
.pass { color: #1e7e34; font-weight: bold; } .fail { color: #b21f2d; font-weight: bold; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .9rem; }
td, th { border: 1px solid #ddd; padding: .25rem .5rem; text-align: left; vertical-align: top; }
pre { background: #f6f8fa; padding: .75rem; overflow-x: auto; font-size: .85rem; }
.meta { color: #555; }
"""


def write_html(reports: Sequence[PathReport], path: Path, meta: dict[str, Any]) -> Path:
    """Write a self-contained HTML page (no scripts, no external assets); returns ``path``."""
    ok = all(r.passed for r in reports)
    headline = "every claim passed" if ok else "FAILED"
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<title>reactor_app step-lock demo</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>reactor_app step-lock demo: "
        f"<span class='{'pass' if ok else 'fail'}'>{headline}</span>"
        "</h1>",
        "<p class='meta'>"
        + escape(", ".join(f"{k}: {v}" for k, v in meta.items() if not isinstance(v, dict)))
        + "</p>",
    ]
    for report in reports:
        verdict = "pass" if report.passed else "fail"
        parts.append(
            f"<h2><span class='{verdict}'>{verdict.upper()}</span> {escape(report.title)}</h2>"
            f"<p class='meta'>{escape(report.runs_on)}; executions: "
            + escape(", ".join(f"{label} = {ex}" for ex, label in report.labels.items()))
            + "</p>"
        )
        if report.observations:
            parts.append(
                "<ul>"
                + "".join(f"<li>seen: {escape(o)}</li>" for o in report.observations)
                + "</ul>"
            )
        parts.append("<table><tr><th></th><th>claim</th><th>evidence</th></tr>")
        for v in report.verdicts:
            mark = "pass" if v.passed else "fail"
            parts.append(
                f"<tr><td class='{mark}'>{mark.upper()}</td><td>{escape(v.claim)}</td>"
                f"<td>{escape(v.evidence)}</td></tr>"
            )
        parts.append("</table>")
        for key in report.keys:
            timeline = key_timeline(report, key)
            parts.append(f"<h3>Timeline of <code>{escape(key)}</code></h3>")
            parts.append(hold_timeline.render_svg(timeline.holds))
            parts.append("<pre>" + escape("\n".join(chart_lines(report, timeline))) + "</pre>")
            parts.append("<table><tr><th>t (s)</th><th>who</th><th>step</th><th>event</th></tr>")
            for row in event_rows(report, timeline):
                parts.append(
                    f"<tr><td>{row['t']:.3f}</td><td>{escape(row['who'])}</td>"
                    f"<td>{escape(row['step'])}</td><td>{escape(row['text'])}</td></tr>"
                )
            parts.append("</table>")
    parts.append("</body></html>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
