"""``manage.py reactor_sweep`` — re-enqueue executions whose worker vanished.

The same work as the periodic ``reactor_app.sweep`` task (see ``engine.sweeper.sweep``): a
worker execution whose heartbeat is older than ``REACTOR_SWEEP_AFTER`` seconds and whose claim
is free is sent to the queue again, and an interrupt past its timeout is failed (the execution
rolls back on a worker). ``--after`` overrides the staleness threshold for this run.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.test.utils import override_settings

from reactor_app.engine.sweeper import sweep


class Command(BaseCommand):
    help = "Re-enqueue reactor executions whose worker vanished; time out overdue interrupts."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--after",
            type=float,
            default=None,
            help="seconds without a heartbeat before an execution counts as abandoned "
            "(default: REACTOR_SWEEP_AFTER)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["after"] is not None:
            with override_settings(REACTOR_SWEEP_AFTER=options["after"]):
                requeued = sweep()
        else:
            requeued = sweep()
        for execution_id in requeued:
            self.stdout.write(f"requeued {execution_id}")
        self.stdout.write(f"{len(requeued)} execution(s) requeued")
