"""The execution state: what the engine keeps between passes — in ``Execution.context``, and
its growing parts (results, the rollback log, sequential maps' progress) in ``ExecutionProgress``
rows (``engine.progress`` writes and assembles them; ``ROWS`` / ``FOLDED`` below).

``ExecutionState`` is the checkpoint a later pass resumes from (a park, an interrupt, a
hand-off, a redelivery): results, the rollback log (``CompletedStep``), ordered-lock positions,
contention counters and the next step — and, grouped by concern, what the engine notes on the
way:

* ``origin`` (``Origin``): where the execution runs and why it exists — on workers, the step a
  child delivery runs, the execution it retries;
* ``children`` (``Children``): children not settled yet — composed runs, dispatched async
  children, a parallel map's elements, a sequential map's progress;
* ``interrupts``: the interrupt steps reached, with their correlation id, deadline and payload;
* ``continuation`` (``Continuation``): what one pass leaves for the next — the reactor gate's
  admission, holds kept across a park, the park itself, its requeue, outages met, failed
  attempts spent before a park, the last failed attempt of a unit waiting for its retry
  (compensated if the run ends first), and a worker's rollback under way
  (``engine.rollback_progress``);
* ``ending`` (``Ending``): what a finished execution tells its parent (skipped, halt reason).

The JSON layout is flat and fixed — rows written by one version are read by another — so each
typed field names its top-level key (``metadata={"key": ...}``), and a field that is None is a
key that is absent. Entries inside those keys are ``TypedDict``s: JSON objects whose keys the
type checker knows. Keys this version does not know are kept in ``unknown`` and written back
as they came.

``ExecutionState.peek`` reads those notes from a row this process does not run (the sweeper, a
parent reading a child) without decoding results.

One module past ~450 lines on purpose: every part above is a slice of one flat JSON object
whose keys the parts share, and its reader and writer (``_read``, ``to_json``) walk them all;
split apart, one format would be spread over files.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, NotRequired, TypedDict, TypeVar

from reactor_app.coordination import primitives
from reactor_app.coordination.claims import Hold
from reactor_app.models import CONTEXT_SCHEMA_VERSION
from reactor_app.serialization import decode, encode

# --------------------------------------------------------------------------------------------
# top-level keys that ORM filters name too

#: the ordered-lock position slot of a reactor-level gate in ``state.ordered`` (steps use
#: their labels)
REACTOR_SLOT = ""
#: the execution runs on workers: the sweeper re-enqueues it when its delivery vanishes
WORKER = "worker"
#: the reactor-level lock/semaphore holds kept across a park (``Gate.suspend``), re-adopted by
#: the next delivery (``Gate.enter``)
KEPT_HOLDS = "kept_holds"
#: the growing parts of the state (results, the rollback log, sequential maps' progress) are
#: kept in ``ExecutionProgress`` rows, not in the context (``engine.progress``): ``ROWS`` is the
#: number of those rows, ``FOLDED`` the number already folded into the context's own copy of
#: the growing parts (a whole context written from an assembled state); a reader applies the
#: rows past ``FOLDED`` up to ``ROWS``
ROWS, FOLDED = "progress_rows", "progress_folded"


# --------------------------------------------------------------------------------------------
# entries (JSON objects)

#: what a rollback-log entry undoes: one step, a composed child, or a map's elements
RecordKind = Literal["step", "compose", "map"]
#: what a child delivery runs: one step of its parent's reactor, or a reactor of its own
ChildKind = Literal["async_step", "async_reactor"]


@dataclass
class CompletedStep:
    """One entry of the rollback log: a step that completed and may need undoing."""

    step: str
    kind: RecordKind
    args: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    child_execution: str | None = None
    elements: list[dict[str, Any]] = field(default_factory=list)  # map: one per iteration
    #: when it entered the log (ns, monotonic across the tree): where a rollback undoes it
    #: among the entries of composed children and ancestors' async steps
    #: (``engine.async_order``); None in a log written before it existed
    at: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Its JSON object: without ``at`` when it has none (a log written before stamps is
        written back as it came)."""
        data = vars(self)
        return data if self.at is not None else {k: v for k, v in data.items() if k != "at"}


class DispatchMarker(TypedDict):
    """What a child delivery runs: ``kind="async_step"`` runs one step of its reactor (a
    parallel map's element names its label); ``"async_reactor"`` the whole reactor."""

    kind: ChildKind
    step: str
    label: NotRequired[str]


class RetryOrigin(TypedDict):
    """The execution a retry re-runs (``engine.retry``)."""

    of: str
    from_step: str
    reused: list[str]
    by: str


class AsyncChild(TypedDict):
    """A dispatched ``async_step`` / ``async_reactor`` whose result is not read yet."""

    child: str
    kind: ChildKind
    args: dict[str, Any]
    timeout: float
    #: the step whose rollback-log entry came after this child ended (``engine.children``)
    before: NotRequired[str]
    #: when this run first saw the child ended, as it added an entry to a rollback log of the
    #: tree (its own, or a composed child's): the latest its entry may take
    #: (``engine.async_order``)
    before_at: NotRequired[int]
    #: a stamp of the tree when it was dispatched: the earliest its entry may take
    since: NotRequired[int]


class MapElement(TypedDict):
    """One element execution of a parallel ``map_step``."""

    label: str
    execution: str
    args: dict[str, Any]


class ParallelMap(TypedDict):
    """A parallel ``map_step`` whose elements are being joined; ``looks``: passes that found
    one still running (its requeue backs off with them)."""

    elements: list[MapElement]
    looks: NotRequired[int]


class MapProgress(TypedDict):
    """A sequential ``map_step`` part-way: the rollback-log entries of the elements that
    completed, the values so far, the next element."""

    elements: list[dict[str, Any]]
    values: list[Any]
    index: int


class InterruptEntry(TypedDict):
    """An interrupt step reached: paused since, until ``deadline`` (None: no timeout); the
    resume adds the payload, the sweeper ``timed_out``."""

    since: str
    correlation_id: str
    deadline: str | None
    payload: NotRequired[Any]
    resumed_at: NotRequired[str]
    timed_out: NotRequired[bool]


class KeptHold(TypedDict):
    """A lock or semaphore hold kept across a park (``Gate.suspend``)."""

    primitive: str
    key: str
    token: NotRequired[int]
    limit: NotRequired[int]
    #: a semaphore slot's acquisition (``Hold.lease``)
    lease: NotRequired[str]


def kept_hold(entry: KeptHold) -> Hold | None:
    """A hold described by ``Gate.suspend`` (primitive, key, token, limit, lease)."""
    primitive, key = entry.get("primitive"), entry.get("key")
    if not key:
        return None
    if not primitives.holds(str(primitive)):
        return None
    claim = primitives.holding(str(primitive)).hold_claim(str(key), entry.get("limit"))
    # only a lock has a token, only a semaphore a lease (older states have neither)
    return Hold(claim=claim, fresh=True, token=entry.get("token"), lease=entry.get("lease"))


class PendingFailure(TypedDict):
    """A unit's failed attempt that is to be retried (``engine.runner``): if the run ends before
    the retry's body starts, it was the final attempt, compensated by the rollback
    (``engine.settling.compensate_pending``). Also a unit a lost delivery may have been running
    (``lost``, ``engine.in_flight``): compensated alike if the run ends before it runs again."""

    #: the step of the reactor (a map's step for one of its elements)
    step: str
    args: dict[str, Any]
    #: the failure as the step's history recorded it (``ReactorError.as_dict``)
    error: dict[str, Any]
    #: not a failed attempt: a lost delivery may have been running the unit's body
    #: (``engine.in_flight``); not progress, so the lost deliveries' point leaves it out
    lost: NotRequired[bool]


def is_lost_mark(entry: Any) -> bool:
    """Whether a stored pending failure is a lost delivery's mark (``engine.in_flight``), not
    a failed attempt."""
    return isinstance(entry, dict) and bool(entry.get("lost"))


class RollingBack(TypedDict):
    """A worker's rollback under way (``engine.rollback_progress``): what the run ends in, and
    how many of the rollback's hooks ran (a redelivery passes over them)."""

    status: str  # PassEnd: failed | cancelled
    error: dict[str, Any] | None
    #: what could not be rolled back so far (``rollback_failures``)
    failures: list[dict[str, Any]]
    done: int


class LostDeliveries(TypedDict):
    """Worker deliveries of this execution lost in a row (``engine.lost_deliveries``):
    ``count`` of them, all at the point of the work ``at`` names (a fingerprint of the
    progress made), and whether a unit there was failed for them."""

    count: int
    at: str
    #: the count at which the verdict was given at ``at`` (the unit it went to failed)
    given: NotRequired[int]


class ParkedOn(TypedDict):
    """The contention a park met, reported as ``resumed`` by the next delivery; ``at`` is wall
    clock (older parks did not record it)."""

    execution: str
    step: str
    primitive: str
    key: str
    at: NotRequired[float]


# --------------------------------------------------------------------------------------------
# the parts of the state, one per concern


# Each field below names its top-level key (``metadata["key"]``); None means the key is absent.


@dataclass
class Origin:
    """Where the execution runs and why it exists."""

    #: True once it runs on workers
    worker: bool | None = field(default=None, metadata={"key": WORKER})
    #: a child delivery: what it runs
    dispatch: DispatchMarker | None = field(default=None, metadata={"key": "dispatch"})
    #: a retry: of which execution
    retry: RetryOrigin | None = field(default=None, metadata={"key": "retry"})
    #: ``run_async(priority=...)``: its place among the waiters of a contended key (and its
    #: message's priority); kept here so that every later delivery (a park's, a requeue's)
    #: waits with it
    priority: int | None = field(default=None, metadata={"key": "priority"})
    #: a debounced start: its burst's key (``engine.debounce``), looked up again at delivery
    debounce: str | None = field(default=None, metadata={"key": "debounce"})
    #: an in-process run whose row keeps only a display copy of its inputs (the codec could
    #: not hold one: its message); a retry from the row is refused (``engine.retry``)
    inputs_shown: str | None = field(default=None, metadata={"key": "inputs_shown"})


@dataclass
class Children:
    """Child executions of this run that are not settled yet (``engine.children``,
    ``engine.mapping``). Each map is by step label (composed runs) or step name."""

    #: composed runs in progress: label -> child execution id (a park continues the same one)
    composed: dict[str, str] | None = field(default=None, metadata={"key": "children"})
    #: dispatched async children whose result is not read yet
    pending_async: dict[str, AsyncChild] | None = field(default=None, metadata={"key": "async"})
    #: parallel maps whose elements are being joined
    parallel_maps: dict[str, ParallelMap] | None = field(
        default=None, metadata={"key": "map_parallel"}
    )
    #: sequential maps part-way
    map_progress: dict[str, MapProgress] | None = field(
        default=None, metadata={"key": "map_progress"}
    )

    # The methods below hand out a map for writing, created on first use; once written the
    # key stays, empty or not (rows always kept it), while readers take ``field or {}``.

    def composed_runs(self) -> dict[str, str]:
        if self.composed is None:
            self.composed = {}
        return self.composed

    def async_children(self) -> dict[str, AsyncChild]:
        if self.pending_async is None:
            self.pending_async = {}
        return self.pending_async

    def parallel(self) -> dict[str, ParallelMap]:
        if self.parallel_maps is None:
            self.parallel_maps = {}
        return self.parallel_maps

    def progress(self) -> dict[str, MapProgress]:
        if self.map_progress is None:
            self.map_progress = {}
        return self.map_progress


@dataclass
class Continuation:
    """What one pass leaves for the next."""

    #: the reactor-level gate admitted this run once: later passes continue (no new charge)
    reactor_admitted: bool | None = field(default=None, metadata={"key": "reactor_admitted"})
    #: reactor-level holds kept across the last park
    kept_holds: list[KeptHold] | None = field(default=None, metadata={"key": KEPT_HOLDS})
    #: the contention the last park met
    parked_on: ParkedOn | None = field(default=None, metadata={"key": "parked_on"})
    #: when the parked execution is due back (ISO 8601)
    requeue_at: str | None = field(default=None, metadata={"key": "requeue_at"})
    #: names the last park's countdown requeue, so that an older one is recognised and dropped
    requeue_token: str | None = field(default=None, metadata={"key": "requeue_token"})
    #: coordination outages met on workers (their requeue backs off with them)
    outages: int | None = field(default=None, metadata={"key": "outages"})
    #: failed attempts a unit spent before it parked: label -> attempts
    spent_attempts: dict[str, int] | None = field(default=None, metadata={"key": "attempts"})
    #: the last failed attempt of each unit waiting for its retry: label -> that attempt
    pending_failures: dict[str, PendingFailure] | None = field(
        default=None, metadata={"key": "pending_failures"}
    )
    #: a worker's rollback under way: a redelivery goes on with it, not with the steps
    rolling_back: RollingBack | None = field(default=None, metadata={"key": "rolling_back"})
    #: deliveries lost in a row at one point of the work (``engine.lost_deliveries``)
    lost_deliveries: LostDeliveries | None = field(
        default=None, metadata={"key": "lost_deliveries"}
    )

    def attempts(self) -> dict[str, int]:
        if self.spent_attempts is None:
            self.spent_attempts = {}
        return self.spent_attempts

    def failures(self) -> dict[str, PendingFailure]:
        if self.pending_failures is None:
            self.pending_failures = {}
        return self.pending_failures


@dataclass
class Ending:
    """What a finished execution tells its parent."""

    #: an async step's unit ended skipped (never undone), or completed (False)
    skipped: bool | None = field(default=None, metadata={"key": "skipped"})
    #: an async step's body completed at (ns, wall clock): where its parent's rollback undoes
    #: it (``engine.async_order``)
    completed_at: int | None = field(default=None, metadata={"key": "completed_at"})
    #: the execution halted; ``halt_reason`` may be None even then (``Halt()``)
    halted: bool = False
    halt_reason: str | None = None


#: key of ``Ending.halt_reason``: present (maybe null) exactly when the execution halted
HALT_REASON = "halt_reason"

_Part = TypeVar("_Part", Origin, Children, Continuation, Ending)


def _dump(part: Origin | Children | Continuation | Ending) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name, key in _STORED_FIELDS.get(type(part)) or _stored_fields(type(part)):
        value = getattr(part, name)
        if value is not None:
            data[key] = value
    return data


def _stored_fields(cls: type) -> tuple[tuple[str, str], ...]:
    """``(attribute, key)`` of each stored field of a part, worked out once per class
    (``dataclasses.fields`` builds its tuple anew at every call, and every write of a
    delivery dumps the state)."""
    stored = tuple((f.name, f.metadata["key"]) for f in fields(cls) if "key" in f.metadata)
    _STORED_FIELDS[cls] = stored
    return stored


_STORED_FIELDS: dict[type, tuple[tuple[str, str], ...]] = {}


def _load(cls: type[_Part], data: dict[str, Any]) -> _Part:
    """The part's keys, taken out of ``data``."""
    return cls(
        **{
            f.name: data.pop(f.metadata["key"])
            for f in fields(cls)
            if f.metadata.get("key") in data
        }
    )


# --------------------------------------------------------------------------------------------
# the state


@dataclass
class ExecutionState:
    """What a later pass of the execution resumes from (see the module docstring)."""

    results: dict[str, Any] = field(default_factory=dict)
    completed: list[CompletedStep] = field(default_factory=list)
    ordered: dict[str, dict[str, Any]] = field(default_factory=dict)
    contention: dict[str, int] = field(default_factory=dict)
    next_index: int = 0
    origin: Origin = field(default_factory=Origin)
    children: Children = field(default_factory=Children)
    interrupts: dict[str, InterruptEntry] | None = None
    continuation: Continuation = field(default_factory=Continuation)
    ending: Ending = field(default_factory=Ending)
    #: top-level keys this version does not read (a row of another version): kept as they came
    unknown: dict[str, Any] = field(default_factory=dict)
    #: the progress rows the growing parts above include (``engine.progress.load_state``):
    #: ``to_json`` writes it as both ``ROWS`` and ``FOLDED``, so a whole context written from
    #: this state reads back without applying those rows a second time
    folded: int = 0

    def reached_interrupts(self) -> dict[str, InterruptEntry]:
        if self.interrupts is None:
            self.interrupts = {}
        return self.interrupts

    def to_json(self) -> dict[str, Any]:
        # The codec, not the display encoder: a run resumed on another worker reads results
        # and arguments back as the same values (Decimal, dates, UUIDs, registered types).
        data: dict[str, Any] = {
            "version": CONTEXT_SCHEMA_VERSION,
            "results": self.results,
            "completed": [c.to_json() for c in self.completed],
            "ordered": self.ordered,
            "contention": self.contention,
            "next_index": self.next_index,
            **_dump(self.origin),
            **_dump(self.children),
            **_dump(self.continuation),
            **_dump(self.ending),
        }
        if self.interrupts is not None:
            data["interrupts"] = self.interrupts
        if self.ending.halted:
            data[HALT_REASON] = self.ending.halt_reason
        data.update(self.unknown)
        if self.folded:
            data[ROWS] = data[FOLDED] = self.folded
        encoded: dict[str, Any] = encode(data, strict=False, where="execution state")
        return encoded

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ExecutionState:
        return cls._read(decode(data or {}))

    @classmethod
    def peek(cls, data: dict[str, Any] | None) -> ExecutionState:
        """The state of a row this process does not run, read for the engine's notes (a
        child's halt reason, a parked row's requeue, ...): results and arguments stay in their
        stored form, not decoded."""
        return cls._read(data or {})

    @classmethod
    def _read(cls, data: dict[str, Any]) -> ExecutionState:
        data = dict(data)
        data.pop("version", None)
        data.pop(ROWS, None)
        folded = int(data.pop(FOLDED, 0) or 0)
        ending = _load(Ending, data)
        if HALT_REASON in data:
            ending.halted, ending.halt_reason = True, data.pop(HALT_REASON)
        return cls(
            results=data.pop("results", {}),
            completed=[CompletedStep(**c) for c in data.pop("completed", [])],
            ordered=data.pop("ordered", {}),
            contention=data.pop("contention", {}),
            next_index=data.pop("next_index", 0),
            origin=_load(Origin, data),
            children=_load(Children, data),
            interrupts=data.pop("interrupts", None),
            continuation=_load(Continuation, data),
            ending=ending,
            unknown=data,
            folded=folded,
        )
