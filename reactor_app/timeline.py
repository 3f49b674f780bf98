"""A per-key timeline of holds and parks, drawn as server-rendered SVG from CoordinationEvents.

The question it answers: "what happened to this key over the last hour?" Each lane is one
holder — ``(primitive, owner, step)``, so a step-level hold and the reactor-level hold of the
same execution get separate lanes — and shows

* hold bars, from the outermost ``acquired`` to the matching ``released`` (re-entrant
  acquisitions only deepen the nesting), cut short by ``forced_release`` or ``lease_lost``;
  a ``release_failed`` ends it too (its owner let go) and is marked: the key stays taken
  until the lease lapses;
* park bars, from ``parked`` to the lane's next event (resumed, acquired ...);
* marks for refusals, forced releases, lost leases, hand-off refusals and ordered-lock
  operator actions.

Events are history, not live state: a holder killed without releasing leaves an open bar,
drawn to the right edge with an arrow (its TTL freed the key in Redis; the Coordination page
shows live state). No JavaScript and no client library: tooltips are SVG ``<title>`` elements.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.html import escape

from reactor_app.datetimes import on_screen
from reactor_app.models import CoordinationEvent
from reactor_app.status import CoordinationEventKind as Kind

#: how far before the window events are read, to find holds and parks that started earlier
LOOKBACK = timedelta(hours=6)
#: the most events one timeline reads (older ones are dropped first)
MAX_EVENTS = 5000

#: point events drawn as marks, with their glyph colour
MARK_COLOURS = {
    Kind.ACQUISITION_FAILED: "#c0392b",
    Kind.FORCED_RELEASE: "#8e0000",
    Kind.LEASE_LOST: "#8e0000",
    Kind.RELEASE_FAILED: "#8e0000",
    Kind.HANDOFF_REFUSED: "#d35400",
    Kind.ORDERED_SKIPPED: "#2c3e50",
    Kind.ORDERED_RESET: "#2c3e50",
}
BAR_COLOURS = {"step": "#2e86c1", "reactor": "#7d3c98", "park": "#f39c12"}

# geometry (px)
WIDTH = 1100
LABEL_WIDTH = 300
LANE_HEIGHT = 28
BAR_HEIGHT = 16
#: the narrowest bar drawn, so a hold of a few milliseconds in a long window stays visible
MIN_BAR_WIDTH = 5
TOP = 34
BOTTOM = 54
RIGHT_PAD = 16


@dataclass(frozen=True)
class Lane:
    primitive: str
    owner: str
    step: str  # "" = reactor level
    execution: str | None

    @property
    def level(self) -> str:
        return "step" if self.step else "reactor"

    @property
    def label(self) -> str:
        who = f"step {self.step}" if self.step else "reactor"
        owner = self.execution or self.owner or "operator"
        return f"{self.primitive} · {who} · {owner[:8]}"


@dataclass
class Bar:
    lane: Lane
    kind: str  # "hold" | "park"
    start: datetime
    end: datetime | None = None  # None: still open at the end of the events
    token: int | None = None
    ended_by: str = ""

    @property
    def colour(self) -> str:
        return BAR_COLOURS["park" if self.kind == "park" else self.lane.level]


@dataclass
class Mark:
    lane: Lane
    kind: str
    at: datetime
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Timeline:
    key: str
    start: datetime
    end: datetime
    lanes: list[Lane] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    events: int = 0

    @property
    def empty(self) -> bool:
        return not (self.bars or self.marks)


def _lane(event: CoordinationEvent) -> Lane:
    return Lane(
        primitive=event.primitive,
        owner=event.owner,
        step=event.step,
        execution=str(event.execution_id) if event.execution_id else None,
    )


def build(
    key: str, start: datetime, end: datetime, events: Iterable[CoordinationEvent]
) -> Timeline:
    """Pair events (oldest first) into bars and marks, keeping what overlaps ``[start, end]``."""
    timeline = Timeline(key=key, start=start, end=end)
    depth: dict[Lane, int] = {}
    open_holds: dict[Lane, Bar] = {}
    open_parks: dict[Lane, Bar] = {}
    bars: list[Bar] = []
    marks: list[Mark] = []

    def close_park(lane: Lane, at: datetime, by: str) -> None:
        park = open_parks.pop(lane, None)
        if park is not None:
            park.end, park.ended_by = at, by
            bars.append(park)

    def close_hold(lane: Lane, at: datetime, by: str) -> None:
        depth.pop(lane, None)
        hold = open_holds.pop(lane, None)
        if hold is not None:
            hold.end, hold.ended_by = at, by
            bars.append(hold)

    for event in events:
        timeline.events += 1
        lane = _lane(event)
        kind = event.kind
        if kind != Kind.PARKED and kind != Kind.ACQUISITION_FAILED:
            close_park(lane, event.at, kind)
        if kind == Kind.ACQUIRED:
            depth[lane] = depth.get(lane, 0) + 1
            if lane not in open_holds:
                open_holds[lane] = Bar(lane, "hold", event.at, token=event.token)
        elif kind in (Kind.RELEASED, Kind.RELEASE_FAILED):
            depth[lane] = depth.get(lane, 0) - 1
            if depth[lane] <= 0:
                close_hold(lane, event.at, kind)
            if kind == Kind.RELEASE_FAILED:
                # the bar ends where its owner let go; the key stays taken until its lease
                # lapses, which the mark says
                marks.append(Mark(lane, kind, event.at, event.detail))
        elif kind in (Kind.FORCED_RELEASE, Kind.LEASE_LOST):
            # the whole hold is gone whatever its nesting: close every lane of that owner
            for other in [
                o for o in open_holds if o.owner == lane.owner and o.primitive == lane.primitive
            ]:
                close_hold(other, event.at, kind)
            marks.append(Mark(lane, kind, event.at, event.detail))
        elif kind == Kind.PARKED:
            if lane not in open_parks:
                open_parks[lane] = Bar(lane, "park", event.at)
        elif kind in MARK_COLOURS:
            marks.append(Mark(lane, kind, event.at, event.detail))

    bars.extend(open_holds.values())
    bars.extend(open_parks.values())
    timeline.bars = sorted(
        (b for b in bars if (b.end is None or b.end >= start) and b.start <= end),
        key=lambda b: b.start,
    )
    timeline.marks = [m for m in marks if start <= m.at <= end]
    # lanes in order of first appearance, so the chart reads top-down like the history
    first_seen: dict[Lane, datetime] = {}
    for bar in timeline.bars:
        first_seen[bar.lane] = min(first_seen.get(bar.lane, bar.start), bar.start)
    for mark in timeline.marks:
        first_seen[mark.lane] = min(first_seen.get(mark.lane, mark.at), mark.at)
    timeline.lanes = sorted(first_seen, key=lambda lane: (first_seen[lane], lane.step))
    return timeline


def for_key(key: str, minutes: int = 60, *, now: datetime | None = None) -> Timeline:
    """The timeline of ``key`` over the last ``minutes``, read from the event table."""
    end = now or timezone.now()
    return for_range(key, end - timedelta(minutes=minutes), end)


def zoomed_range(
    key: str, *, within_minutes: int, held_now: bool, now: datetime | None = None
) -> tuple[datetime, datetime] | None:
    """The span of ``key``'s events in the last ``within_minutes``, with a margin, ending now
    while the key is held — what the timeline opens on, so a burst of seconds an hour ago is
    not a sliver of an hour-wide chart. None when the key has no events in that time."""
    end_now = now or timezone.now()
    span = CoordinationEvent.objects.span(key, end_now - timedelta(minutes=within_minutes))
    if span is None:
        return None
    first, last = span
    if held_now:
        last = end_now
    margin = max((last - first) * 0.05, timedelta(seconds=1))
    return first - margin, min(last + margin, end_now)


def for_range(key: str, start: datetime, end: datetime) -> Timeline:
    """The timeline of ``key`` between ``start`` and ``end``, read from the event table."""
    events = list(
        CoordinationEvent.objects.timeline(key, start - LOOKBACK, end).reverse()[:MAX_EVENTS]
    )
    events.reverse()
    return build(key, start, end, events)


# -- drawing ---------------------------------------------------------------------------------


def _ticks(start: datetime, end: datetime) -> list[datetime]:
    """Round tick times, at most ten across the window: round on the wall clock they are shown
    in (``on_screen``), not in UTC — in a zone half an hour off UTC, hourly ticks rounded in
    UTC read 15:30, 16:30. A naive window is local time already (its ``timestamp()`` is taken
    in the process's zone, which is the project's), so it needs no shift."""
    span = (end - start).total_seconds()
    steps = [10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]
    step = next((s for s in steps if span / s <= 10), 86400 * math.ceil(span / (86400 * 10)))
    epoch = start.timestamp()
    offset = on_screen(start).utcoffset()
    shift = offset.total_seconds() if offset is not None else 0.0
    first = (int((epoch + shift) // step) + 1) * step - shift
    ticks = []
    at = first
    while at <= end.timestamp():
        ticks.append(datetime.fromtimestamp(at, tz=start.tzinfo))
        at += step
    return ticks


def _when(moment: datetime) -> str:
    return on_screen(moment).strftime("%H:%M:%S")


def _bar_title(bar: Bar) -> str:
    lane = bar.lane
    lines = [
        f"{'parked' if bar.kind == 'park' else 'held'}: {lane.primitive} "
        f"{'step ' + lane.step if lane.step else 'reactor level'}",
        f"owner {lane.owner}" + (f", execution {lane.execution}" if lane.execution else ""),
        f"from {_when(bar.start)} to "
        + (f"{_when(bar.end)} ({bar.ended_by})" if bar.end else "now (no release recorded)"),
    ]
    if bar.token is not None:
        lines.append(f"fencing token {bar.token}")
    return "\n".join(lines)


def _mark_title(mark: Mark) -> str:
    detail = ", ".join(f"{k}={v}" for k, v in sorted(mark.detail.items()) if v not in (None, ""))
    return f"{mark.kind} at {_when(mark.at)}" + (f"\n{detail}" if detail else "")


def render_svg(timeline: Timeline, *, width: int = WIDTH) -> str:
    """The timeline as one self-contained ``<svg>`` element (all text escaped)."""
    lanes = timeline.lanes
    plot_left, plot_right = LABEL_WIDTH, width - RIGHT_PAD
    height = TOP + max(len(lanes), 1) * LANE_HEIGHT + BOTTOM
    span = max((timeline.end - timeline.start).total_seconds(), 1.0)

    def x(moment: datetime) -> float:
        ratio = (moment - timeline.start).total_seconds() / span
        return plot_left + max(0.0, min(1.0, ratio)) * (plot_right - plot_left)

    row = {lane: index for index, lane in enumerate(lanes)}

    def y(lane: Lane) -> float:
        return TOP + row[lane] * LANE_HEIGHT

    out: list[str] = [
        # scales down to its container (viewBox), never wider than drawn
        f'<svg xmlns="http://www.w3.org/2000/svg" class="reactor-timeline" '
        f'width="100%" viewBox="0 0 {width} {height}" style="max-width:{width}px;height:auto" '
        f'role="img" aria-label="timeline of {escape(timeline.key)}" '
        'font-family="sans-serif" font-size="11">',
        f"<title>holds and parks of {escape(timeline.key)}, {_when(timeline.start)}"
        f" to {_when(timeline.end)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    # axis and grid
    axis_bottom = TOP + max(len(lanes), 1) * LANE_HEIGHT
    ticks = _ticks(timeline.start, timeline.end)
    # seconds on the labels only when ticks are closer than a minute
    tick_format = "%H:%M:%S" if len(ticks) > 1 and (ticks[1] - ticks[0]).seconds < 60 else "%H:%M"
    for tick in ticks:
        tx = x(tick)
        out.append(
            f'<line x1="{tx:.1f}" y1="{TOP - 6}" x2="{tx:.1f}" y2="{axis_bottom}" '
            'stroke="#e5e5e5"/>'
        )
        out.append(
            f'<text x="{tx:.1f}" y="{TOP - 10}" text-anchor="middle" fill="#555">'
            f"{on_screen(tick).strftime(tick_format)}</text>"
        )
    out.append(
        f'<line x1="{plot_left}" y1="{axis_bottom}" x2="{plot_right}" y2="{axis_bottom}" '
        'stroke="#999"/>'
    )
    # lanes
    for lane in lanes:
        ly = y(lane)
        if row[lane] % 2:
            out.append(
                f'<rect x="0" y="{ly}" width="{width}" height="{LANE_HEIGHT}" fill="#f7f9fb"/>'
            )
        out.append(
            f'<text x="8" y="{ly + LANE_HEIGHT / 2 + 4:.1f}" fill="#222" class="lane-label">'
            f"<title>{escape(lane.owner)}</title>{escape(lane.label)}</text>"
        )
    if not lanes:
        out.append(
            f'<text x="{(plot_left + plot_right) / 2:.0f}" y="{TOP + LANE_HEIGHT / 2 + 4:.0f}" '
            'text-anchor="middle" fill="#888">no holds or parks in this period</text>'
        )
    # bars
    for bar in timeline.bars:
        ly = y(bar.lane) + (LANE_HEIGHT - BAR_HEIGHT) / 2
        x1 = x(bar.start)
        x2 = x(bar.end) if bar.end is not None else plot_right
        if x2 - x1 < MIN_BAR_WIDTH:
            x1 = min(x1, plot_right - MIN_BAR_WIDTH)
            x2 = x1 + MIN_BAR_WIDTH
        dash = ' stroke-dasharray="4 2"' if bar.kind == "park" else ""
        out.append(
            f'<g class="bar {bar.kind}"><title>{escape(_bar_title(bar))}</title>'
            f'<rect x="{x1:.1f}" y="{ly:.1f}" width="{x2 - x1:.1f}" '
            f'height="{BAR_HEIGHT}" rx="2" fill="{bar.colour}" fill-opacity="0.85" '
            f'stroke="{bar.colour}"{dash}/>'
        )
        if bar.end is None:  # still open: an arrow at the right edge
            mid = ly + BAR_HEIGHT / 2
            out.append(
                f'<path d="M{x2 - 1:.1f},{ly:.1f} L{x2 + 8:.1f},{mid:.1f} L{x2 - 1:.1f},'
                f'{ly + BAR_HEIGHT:.1f} Z" fill="{bar.colour}"/>'
            )
        out.append("</g>")
    # marks
    for mark in timeline.marks:
        mx, my = x(mark.at), y(mark.lane) + LANE_HEIGHT / 2
        colour = MARK_COLOURS.get(Kind(mark.kind), "#000")
        out.append(
            f'<g class="mark {escape(mark.kind)}"><title>{escape(_mark_title(mark))}</title>'
            f'<path d="M{mx:.1f},{my - 7:.1f} L{mx + 6:.1f},{my:.1f} L{mx:.1f},{my + 7:.1f} '
            f'L{mx - 6:.1f},{my:.1f} Z" fill="{colour}" stroke="#fff"/></g>'
        )
    # legend
    legend_y = axis_bottom + 30
    legend: Sequence[tuple[str, str, str]] = (
        ("rect", BAR_COLOURS["step"], "step-level hold"),
        ("rect", BAR_COLOURS["reactor"], "reactor-level hold"),
        ("rect", BAR_COLOURS["park"], "parked (waiting, not failed)"),
        ("mark", MARK_COLOURS[Kind.ACQUISITION_FAILED], "refused"),
        ("mark", MARK_COLOURS[Kind.FORCED_RELEASE], "forced release / lease lost"),
        ("mark", MARK_COLOURS[Kind.ORDERED_SKIPPED], "ordered skip / reset"),
    )
    lx = 8.0
    for shape, colour, text in legend:
        if shape == "rect":
            out.append(
                f'<rect x="{lx:.0f}" y="{legend_y - 9}" width="18" height="10" rx="2" '
                f'fill="{colour}"/>'
            )
        else:
            out.append(
                f'<path d="M{lx + 9:.0f},{legend_y - 10} L{lx + 15:.0f},{legend_y - 4} '
                f'L{lx + 9:.0f},{legend_y + 2} L{lx + 3:.0f},{legend_y - 4} Z" fill="{colour}"/>'
            )
        out.append(f'<text x="{lx + 24:.0f}" y="{legend_y}" fill="#333">{escape(text)}</text>')
        lx += 34 + 6.2 * len(text)
    out.append("</svg>")
    return "".join(out)
