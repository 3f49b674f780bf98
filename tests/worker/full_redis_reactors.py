"""Reactors of the full-Redis worker test (tests/worker/test_full_redis_worker.py), importable
by workers.

``FullRedisReactor``: ``first`` sleeps ``first_seconds``, then ``locked`` takes a lock on the
account. Each body records its run as an ``Activity`` row — in the database, since the
coordination Redis is the one the test fills.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.utils import timezone

from demo_project.shop.models import Activity
from reactor_app import Reactor, Step, Success, from_input, step, value, with_lock


class Recorded(Step):
    inputs = ("account", "name", "seconds")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        started = timezone.now()
        time.sleep(args["seconds"])
        Activity.objects.create(
            execution_id=context.execution_id,
            step=args["name"],
            account_number=args["account"],
            pid=os.getpid(),
            started_at=started,
            finished_at=timezone.now(),
        )
        return Success(args["name"])


@with_lock(lambda args: f"full-redis:{args['account']}", ttl=30)
class LockedRecorded(Recorded):
    pass


class FullRedisReactor(Reactor):
    inputs = ("account", "first_seconds")

    first = step(
        Recorded,
        account=from_input("account"),
        name=value("first"),
        seconds=from_input("first_seconds"),
    )
    locked = step(
        LockedRecorded, account=from_input("account"), name=value("locked"), seconds=value(0)
    )
