"""A locked step recording its holds, for the fault schedule on real workers
(tests/chaos/test_fault_histories.py), in a module of its own so that Celery worker processes
import the reactor by its registered path.

The body records into the schedule's history file (``reactor_app.testing.history``: one
``O_APPEND`` write per event, so the worker processes and the test share it): that it entered,
with its fencing token, then — as its last act — the release it is about to make, left open
(the release happens after the body and nobody is told whether it freed the hold). While it
holds the key it names its process in Redis, so the schedule can kill the holder.
"""

from __future__ import annotations

import os
import time
from typing import Any

from reactor_app import Reactor, Step, Success, from_input, step, with_lock
from reactor_app.conf import reactor_settings
from reactor_app.coordination.redis import get_client
from reactor_app.testing.history import History

#: the lock's lease (not renewed past the body: the bodies are shorter); shorter than the
#: claim TTL of the schedule's worker, so a killed holder's lease has lapsed before its
#: redelivery takes over (and drops the dead delivery's holds)
LEASE = 1.0


def holder_key() -> str:
    return f"{reactor_settings.KEY_PREFIX}:test:lock-holder-pid"


@with_lock(lambda args: f"acct:{args['account']}", ttl=LEASE)
class RecordedHold(Step):
    inputs = ("account", "history", "hold")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        history = History(args["history"])
        key = f"acct:{args['account']}"
        # one session per admission: a redelivery of the same execution is a new hold
        session = f"{context.execution_id}:{os.getpid()}:{time.monotonic_ns()}"
        entered = history.invoke(
            session, "entered", key, session=session, execution=context.execution_id
        )
        entered.ok(token=context.fencing_token())
        client = get_client()
        client.set(holder_key(), os.getpid(), px=int(LEASE * 1000))
        time.sleep(args["hold"])
        client.delete(holder_key())
        history.invoke(session, "release", key, session=session)
        return Success(session)


class RecordedHoldReactor(Reactor):
    inputs = ("account", "history", "hold")

    held = step(
        RecordedHold,
        account=from_input("account"),
        history=from_input("history"),
        hold=from_input("hold"),
    )
