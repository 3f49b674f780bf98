"""Celery dispatch: the names callers use to hand executions to workers (docs/design.md).

This module only gathers them; each concern lives in its own module, read in this order:

* ``engine.enqueueing`` — ``run_async`` / ``hand_off_new`` persist an execution and enqueue it
  after commit (the row is the outbox); ``enqueue``; ``wake`` re-enqueues parked waiters a
  release let through.
* ``engine.claim`` — the execution claim: one delivery at a time runs one execution.
* ``engine.delivery`` — ``deliver``, the body of the ``reactor_app.run_execution`` task: claim,
  one pass of the engine, follow-up (requeue a park, wake a waiting parent).
* ``engine.interrupt_delivery`` — ``resume`` / ``resume_by_correlation`` continue an
  interrupted execution; overdue interrupts are timed out.
* ``engine.sweeper`` — ``sweep`` re-enqueues executions whose delivery vanished, renews holds
  kept across parks, times out interrupts; and the worker timers that run it.
"""

from __future__ import annotations

from reactor_app.engine.claim import CLAIM_WAIT, ExecutionClaim, claim_ttl, delivery_owner
from reactor_app.engine.delivery import RUNNABLE, deliver
from reactor_app.engine.enqueueing import (
    _worker_context,
    enqueue,
    enqueue_on_commit,
    enqueue_quietly,
    hand_off_new,
    run_async,
    wake,
)
from reactor_app.engine.interrupt_delivery import resume, resume_by_correlation
from reactor_app.engine.state import kept_hold
from reactor_app.engine.sweeper import renew_kept_holds, sweep

__all__ = [
    "CLAIM_WAIT",
    "RUNNABLE",
    "ExecutionClaim",
    "_worker_context",
    "claim_ttl",
    "deliver",
    "delivery_owner",
    "enqueue",
    "enqueue_on_commit",
    "enqueue_quietly",
    "hand_off_new",
    "kept_hold",
    "renew_kept_holds",
    "resume",
    "resume_by_correlation",
    "run_async",
    "sweep",
    "wake",
]
