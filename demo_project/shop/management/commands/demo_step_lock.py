"""``manage.py demo_step_lock`` — the step-lock showcase, end to end on real infrastructure.

On a machine with nothing running it needs nothing else: the embedded Redis server starts on
demand, missing migrations are applied, and two real Celery worker processes
(``celery -A <app> worker``, on a queue of their own) are started here and stopped at exit.
``--no-worker`` uses workers you run yourself on ``REACTOR_CELERY_QUEUE`` instead.

It then runs the demo shop's paths (``demo_project.shop.showcase``): **serialized** (in-process
payments of one account: ``charge`` bodies never overlap, ``audit``/``notify`` do),
**contended** (worker payments park on the held account key, are woken by its release, and all
complete without compensation), **compensated** (a failed receipt refunds the charge while
holding the account key; a concurrent payment waits for the refund), a step-level **period**
skip and a **rate-limited** step. It prints a timeline per key and a PASS/FAIL verdict, with
its evidence, per claim; writes the timelines to ``demo-output/step_lock_timeline.html``; and
exits non-zero if any claim failed. ``--json`` prints the whole report as JSON instead. It ends
with what to open next (the timeline file, the admin), and says that the embedded server is left
running — the admin and the next runs use it — and how to stop it.

The command belongs to the demo project: it needs ``demo_project.shop`` in ``INSTALLED_APPS``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import override_settings

from reactor_app.conf import reactor_settings

#: where the HTML timeline goes (relative to the current folder; gitignored)
DEFAULT_OUTPUT = Path("demo-output") / "step_lock_timeline.html"
#: the demo's workers back off for at least half of this on contention, so that a wake-up by
#: the release (milliseconds) cannot be mistaken for the backoff requeue (seconds)
DEMO_CONTENTION_BACKOFF = (4.0, 30.0)
#: how long the demo's worker deliveries wait in-process before parking: shorter than the
#: contended path's charge, so the second payment visibly parks and is woken by the release
DEMO_WORKER_WAIT = 0.2
MAX_EXECUTIONS = 10


class Command(BaseCommand):
    help = (
        "Run the step-lock showcase (serialized, contended and compensated paths, a period "
        "skip and a rate-limited step) against real Redis and real Celery workers, print a "
        "timeline per key and a verdict per claim; exit 1 if any claim fails."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--executions",
            type=int,
            default=3,
            help=f"payments per serialized/contended path (2-{MAX_EXECUTIONS}, default 3)",
        )
        parser.add_argument(
            "--json", action="store_true", help="print the report as JSON (progress to stderr)"
        )
        parser.add_argument(
            "--no-worker",
            action="store_true",
            help="use Celery workers you run yourself (on REACTOR_CELERY_QUEUE) instead of "
            "starting two here",
        )
        parser.add_argument(
            "--workers", type=int, default=2, help="worker processes to start (default 2)"
        )
        parser.add_argument(
            "--output",
            default=str(DEFAULT_OUTPUT),
            help=f"HTML timeline file (default {DEFAULT_OUTPUT})",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not apps.is_installed("demo_project.shop"):
            raise CommandError(
                "demo_step_lock runs the demo project's shop reactors: add "
                "'demo_project.shop' to INSTALLED_APPS (or run it from this repository)"
            )
        executions = int(options["executions"])
        if not 2 <= executions <= MAX_EXECUTIONS:
            raise CommandError(f"--executions must be between 2 and {MAX_EXECUTIONS}")
        as_json = bool(options["json"])
        # Progress goes to stderr under --json, so stdout is exactly one JSON document.
        progress = self.stderr if as_json else self.stdout
        started = time.monotonic()

        def say(line: str) -> None:
            progress.write(line)
            progress.flush()

        say("reactor_app step-lock demo")
        self._migrate(say)
        redis_where = self._redis(say)
        with self._workers(options, say) as worker_info:
            from demo_project.shop.showcase import Showcase

            reports = Showcase(executions, say=say).run()

        from demo_project.shop import report as render

        meta: dict[str, Any] = {
            "executions": executions,
            "database": connection.vendor,
            "redis": redis_where,
            "key_prefix": reactor_settings.KEY_PREFIX,
            "workers": worker_info,
            "duration_s": round(time.monotonic() - started, 1),
        }
        output = render.write_html(reports, Path(options["output"]), meta)
        meta["html"] = str(output)
        if as_json:
            self.stdout.write(json.dumps(render.as_json(reports, meta), indent=2, default=str))
        else:
            for report in reports:
                for line in render.text_timeline(report):
                    self.stdout.write(line)
            self.stdout.write("\n" + "=" * 78)
            for report in reports:
                for line in render.verdict_lines(report):
                    self.stdout.write(line)
            self.stdout.write("")
        failed = [v for r in reports for v in r.verdicts if not v.passed]
        total = sum(len(r.verdicts) for r in reports)
        summary = (
            f"{total - len(failed)}/{total} claims passed in {meta['duration_s']}s; "
            f"timeline written to {output}"
        )
        if failed:
            for line in closing_lines(output, embedded=redis_where == EMBEDDED_WHERE):
                say(line)
            raise CommandError(f"{len(failed)} claim(s) FAILED — {summary}", returncode=1)
        say(self.style.SUCCESS(f"every claim passed: {summary}"))
        for line in closing_lines(output, embedded=redis_where == EMBEDDED_WHERE):
            say(line)

    # -- setup ----------------------------------------------------------------------------

    def _migrate(self, say: Any) -> None:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if plan:
            say(f"- applying {len(plan)} migration(s) to the {connection.vendor} database")
            call_command("migrate", interactive=False, verbosity=0)

    def _redis(self, say: Any) -> str:
        from reactor_app.coordination.redis import get_client, redis_url

        url = redis_url()  # starts the embedded server when no URL is configured
        try:
            get_client(url).ping()
        except Exception as exc:
            raise CommandError(f"the coordination Redis at {url} does not answer: {exc}") from exc
        where = redis_source()
        say(
            f"- coordination Redis: {where} ({_redacted(url)}), key prefix "
            f"{reactor_settings.KEY_PREFIX!r}"
        )
        return where

    @contextmanager
    def _workers(self, options: dict[str, Any], say: Any) -> Iterator[dict[str, Any]]:
        if options["no_worker"]:
            queue = reactor_settings.CELERY_QUEUE
            consumers = _consumers_of(queue)
            if not consumers:
                raise CommandError(
                    f"--no-worker: no Celery worker consumes the queue {queue!r}. Start one "
                    f"(celery -A demo_project worker -Q {queue}) or run without --no-worker"
                )
            say(f"- using running Celery workers on {queue!r}: {', '.join(consumers)}")
            yield {"started_here": False, "queue": queue, "nodes": consumers}
            return

        from reactor_app.testing.workers import (
            WorkerProcess,
            delete_broker_queue,
            settings_environment,
        )

        count = max(1, int(options["workers"]))
        queue = f"reactor-demo-{secrets.token_hex(3)}"
        shared = {"REACTOR_CELERY_QUEUE": queue, "CELERY_TASK_DEFAULT_QUEUE": queue}
        env = settings_environment(
            {
                **shared,
                "REACTOR_CONTENTION_BACKOFF": list(DEMO_CONTENTION_BACKOFF),
                "REACTOR_WORKER_WAIT": DEMO_WORKER_WAIT,
            }
        )
        log_dir = Path(options["output"]).parent
        workers = [
            WorkerProcess(
                _celery_app(),
                queues=(queue,),
                concurrency=2,
                name=f"{queue}-{n}",
                env=env,
                cwd=settings.BASE_DIR if hasattr(settings, "BASE_DIR") else None,
                log_path=log_dir / f"worker-{n}.log",
            )
            for n in range(1, count + 1)
        ]
        say(
            f"- starting {count} Celery worker processes (prefork, 2 children each) on {queue!r}; "
            f"their contention backoff is {DEMO_CONTENTION_BACKOFF[0]:g}-"
            f"{DEMO_CONTENTION_BACKOFF[1]:g}s, so a wake-up by a release stands out; they "
            f"wait {DEMO_WORKER_WAIT:g}s in-process before parking"
        )
        # override_settings, not setattr: reactor_app reads its settings once per settings
        # object (reactor_app.conf)
        shared_here = override_settings(**shared)
        shared_here.enable()
        stop_on_sigterm = _raise_on_sigterm()
        try:
            for worker in workers:
                worker.spawn()
            for worker in workers:
                try:
                    worker.wait_ready()
                except Exception as exc:
                    raise CommandError(f"a Celery worker did not start: {exc}") from exc
            say(f"  ready: pids {', '.join(str(w.pid) for w in workers)} (logs in {log_dir}/)")
            yield {
                "started_here": True,
                "queue": queue,
                "processes": count,
                "contention_backoff": list(DEMO_CONTENTION_BACKOFF),
            }
        finally:
            for worker in workers:
                worker.stop()
            delete_broker_queue(queue)
            shared_here.disable()
            stop_on_sigterm()
            say(f"- stopped the {count} Celery worker processes")


#: how the report names the embedded server (``redis_source``)
EMBEDDED_WHERE = "embedded redis-server"
#: the demo's admin page for the coordination holds and timelines (``demo_project.urls``)
ADMIN_URL = "http://127.0.0.1:8000/admin/reactor_app/coordination/"


def redis_source() -> str:
    """Where the coordination Redis comes from, as the demo reports it: the embedded server
    (``REACTOR_REDIS_URL = "embedded"``, the demo's default) or the setting naming a server."""
    if reactor_settings.REDIS is not None:
        return "REACTOR_REDIS"
    if reactor_settings.USES_EMBEDDED_REDIS:
        return EMBEDDED_WHERE
    return "REACTOR_REDIS_URL"


def closing_lines(output: Path, *, embedded: bool) -> list[str]:
    """What the demo ends with: what it left running, and what to open next."""
    lines = []
    if embedded:
        lines.append(
            "- the embedded redis-server is still running (the admin, the workers and your "
            "next runs use it); stop it with: python manage.py reactor_redis stop "
            "(or make redis-stop)"
        )
    lines += [
        "next:",
        f"  open the timeline: {output.resolve().as_uri()}",
        "  open the admin: python manage.py reactor_demo_user  (a superuser admin / admin),",
        f"    python manage.py runserver, then {ADMIN_URL}",
    ]
    return lines


def _celery_app() -> str:
    """The ``-A`` of the workers: the package of the settings module (``demo_project``)."""
    module = str(os.environ.get("DJANGO_SETTINGS_MODULE") or settings.SETTINGS_MODULE)
    if module == "reactor_app.testing.worker_settings":
        module = os.environ.get("REACTOR_TEST_BASE_SETTINGS", "demo_project.settings")
    return module.split(".", 1)[0]


def _consumers_of(queue: str) -> list[str]:
    """Names of the running workers that consume ``queue`` (asked over the broker)."""
    from reactor_app.tasks import run_execution

    replies = run_execution.app.control.inspect(timeout=2.0).active_queues() or {}
    return sorted(
        node for node, queues in replies.items() if any(q.get("name") == queue for q in queues)
    )


def _raise_on_sigterm() -> Any:
    """Turn SIGTERM into ``SystemExit`` so the workers are stopped; returns the undo."""
    if sys.platform == "win32":
        return lambda: None
    try:
        previous = signal.getsignal(signal.SIGTERM)

        def stop(signum: int, frame: FrameType | None) -> None:
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)


def _redacted(url: str) -> str:
    from reactor_app.management.commands.reactor_redis import redacted

    return redacted(url)
