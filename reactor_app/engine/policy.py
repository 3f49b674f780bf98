"""Where a pass of an execution runs, and what that changes: the run policy.

A pass runs either in the caller's process (``Reactor.run``, ``Step.call`` inside it, the
first part of a ``background = "after:..."`` reactor) or as a Celery delivery on a worker. The
executor, the runner and the children ask the policy — never a mode string — how to behave:

* contention: wait for the declared ``wait`` then fail (in process), or wait briefly
  (``REACTOR_WORKER_WAIT``) then park the execution and requeue it (worker);
* running ``async`` children whose result a step reads: block for them, or park until they end;
* checkpoints: written behind (nothing resumes an in-process run from its row), or one statement
  per completed step (a redelivery resumes from it);
* holds: a worker mirrors them in its Redis held-key registry, so the delivery that takes over
  after a crash frees exactly those;
* ``background = "after:<step>"``: only an in-process pass hands the rest to a worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from reactor_app.conf import reactor_settings


@dataclass(frozen=True)
class RunPolicy:
    """How one pass behaves; ``IN_PROCESS`` and ``ON_WORKER`` are the two there are."""

    name: str
    #: contention parks the execution (and running children are awaited by parking)
    parks: bool
    #: every completed step is persisted at once (a redelivery resumes from it)
    persists_each_step: bool
    #: holds are mirrored in the Redis held-key registry for crash take-over
    registers_holds: bool
    #: ``background = "after:<step>"`` hands the rest of the run to a worker
    hands_off: bool

    @property
    def worker_wait(self) -> float:
        """Seconds a contended unit waits in-process before it parks (0 when it never parks:
        an in-process caller waits its declared ``wait`` instead)."""
        return reactor_settings.WORKER_WAIT if self.parks else 0.0


IN_PROCESS = RunPolicy(
    "in_process", parks=False, persists_each_step=False, registers_holds=False, hands_off=True
)
ON_WORKER = RunPolicy(
    "worker", parks=True, persists_each_step=True, registers_holds=True, hands_off=False
)
