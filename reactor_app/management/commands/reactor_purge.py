"""``manage.py reactor_purge`` — delete finished executions, their step runs and events.

The same work as the periodic ``reactor_app.purge`` task (``reactor_app.retention``), by hand:
``--older-than 30d`` (units ``s``, ``m``, ``h``, ``d``; a bare number is seconds) overrides
``REACTOR_RETENTION`` for this run, and ``--dry-run`` only counts.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from reactor_app.retention import purge_finished

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_age(text: str) -> float:
    """``"30d"`` → seconds; raises ``ValueError`` for anything else."""
    match = _AGE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not an age such as 3600, 90m, 12h or 30d")
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise ValueError("the age must be greater than zero")
    return seconds


class Command(BaseCommand):
    help = "Delete finished reactor executions (with their step runs and events) past retention."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            default=None,
            help="age of the executions to delete, e.g. 3600, 90m, 12h, 30d "
            "(default: REACTOR_RETENTION)",
        )
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        older_than = None
        if options["older_than"] is not None:
            try:
                older_than = parse_age(options["older_than"])
            except ValueError as exc:
                raise CommandError(str(exc)) from exc
        report = purge_finished(older_than, dry_run=options["dry_run"])
        if report.cutoff is None:
            self.stdout.write("REACTOR_RETENTION is None and no --older-than given: nothing to do")
            return
        verb = "would delete" if report.dry_run else "deleted"
        self.stdout.write(
            f"{verb} {report.executions} execution(s), {report.step_runs} step run(s) and "
            f"{report.events} coordination event(s) finished before {report.cutoff}"
        )
