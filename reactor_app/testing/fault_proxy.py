"""A TCP proxy that loses replies on request: the "reply lost" fault of coordination tests.

A Redis call whose reply never arrives is the fault a retry-safe admission exists for: the
script ran (a lock was taken, a window charged, a place in line assigned) but the client saw a
connection error, so it cannot tell whether anything happened. Killing the server or the client
cannot produce that state on demand; a proxy between them can:

    proxy = FaultProxy("127.0.0.1", redis_port)
    proxy.start()                        # listens on a free loopback port: proxy.port
    client = redis.Redis(port=proxy.port)
    proxy.lose_next_reply(matching=b"EVALSHA")
    client.evalsha(...)                  # runs on the server; the client gets ConnectionError
    proxy.stop()

Traffic passes through unchanged until ``lose_next_reply`` arms the fault. The next request that
matches (``matching``: bytes the request must contain, case-insensitively, or a predicate on the
request's bytes; ``None`` matches any) is forwarded to the server; the proxy then waits for the
server's first reply bytes — proof that the command ran — discards them and closes both sides of
that connection. The client sees its connection end with no reply; the server has done the work.

Why the proxy waits for the reply instead of closing right after forwarding: a server that reads
the request and the end of the connection together may or may not run the command first; waiting
makes "the script ran, the reply was lost" certain, which is the case a test wants to prove is
handled. ``lost`` counts the replies thrown away, so a test can assert the fault really happened.

Threads only (one accept thread, one thread per proxied connection), loopback only; one request
is matched per chunk of bytes read from the client, which is one command for the non-pipelined
script calls under test.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Callable

#: what ``lose_next_reply(matching=...)`` accepts: bytes a request must contain, or a predicate
Matcher = bytes | Callable[[bytes], bool] | None

#: requests that run a script or a function: the commands whose reply a retry must recover
SCRIPT_CALLS = (b"EVALSHA", b"EVAL", b"FCALL")

_CHUNK = 65536


def is_script_call(request: bytes) -> bool:
    """Whether ``request`` (raw RESP bytes) runs a script or a function."""
    upper = request.upper()
    return any(name in upper for name in SCRIPT_CALLS)


def _predicate(matching: Matcher) -> Callable[[bytes], bool]:
    if matching is None:
        return lambda request: True
    if isinstance(matching, bytes):
        needle = matching.upper()
        return lambda request: needle in request.upper()
    if callable(matching):
        return matching
    raise TypeError(f"matching must be bytes, a predicate or None, not {matching!r}")


class FaultProxy:
    """A loopback TCP proxy in front of ``target_host:target_port`` that can lose replies."""

    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1") -> None:
        self.target = (target_host, int(target_port))
        self.host = host
        self.port = 0
        #: replies thrown away so far (each one a request the server ran)
        self.lost = 0
        #: connections accepted so far
        self.connections = 0
        self._armed: list[Callable[[bytes], bool]] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._sockets: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._lost_event = threading.Condition(self._lock)

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen on a free port of ``host`` (``self.port``) and start accepting."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        listener.listen(64)
        listener.settimeout(0.1)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._spawn(self._accept_loop, "fault-proxy-accept")
        return self

    def stop(self) -> None:
        """Stop accepting, close every proxied connection and wait for the threads."""
        self._stopping.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _close(sock)
        for thread in list(self._threads):
            thread.join(timeout=5)
        if self._listener is not None:
            _close(self._listener)
            self._listener = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults ----------------------------------------------------------------------------

    def lose_next_reply(self, matching: Matcher = None, *, times: int = 1) -> None:
        """Lose the reply of the next ``times`` requests that match (see the module docstring).

        ``matching``: bytes the request contains (case-insensitive, e.g. ``b"EVALSHA"``), a
        predicate on the request's bytes (e.g. ``is_script_call``), or None for any request.
        """
        if times < 1:
            raise ValueError(f"times must be at least 1, not {times!r}")
        predicate = _predicate(matching)
        with self._lock:
            self._armed.extend([predicate] * times)

    def disarm(self) -> None:
        """Forget faults armed and not yet used: traffic passes unchanged again."""
        with self._lock:
            self._armed.clear()

    @property
    def armed(self) -> int:
        """Faults armed and not yet used."""
        with self._lock:
            return len(self._armed)

    def wait_lost(self, count: int, timeout: float = 5.0) -> bool:
        """Wait until ``lost`` reaches ``count``; whether it did within ``timeout`` seconds."""
        with self._lost_event:
            return self._lost_event.wait_for(lambda: self.lost >= count, timeout=timeout)

    def _take_fault(self, request: bytes) -> bool:
        """Whether ``request`` uses up the first armed fault it matches."""
        with self._lock:
            for i, predicate in enumerate(self._armed):
                if predicate(request):
                    del self._armed[i]
                    return True
        return False

    # -- plumbing --------------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        listener = self._listener
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(None)
            with self._lock:
                self.connections += 1
                self._sockets.update((client, upstream))
                self._threads = [t for t in self._threads if t.is_alive()]
            self._spawn(self._pump, "fault-proxy-pump", client, upstream)

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        """Carry bytes both ways on one proxied connection until either side ends."""
        doomed = False  # a request was forwarded whose reply is to be lost
        with selectors.DefaultSelector() as selector:
            selector.register(client, selectors.EVENT_READ, upstream)
            selector.register(upstream, selectors.EVENT_READ, client)
            try:
                while not self._stopping.is_set():
                    for event, _ in selector.select(timeout=0.1):
                        source = event.fileobj
                        assert isinstance(source, socket.socket)
                        data = source.recv(_CHUNK)
                        if not data:
                            return
                        if source is client:
                            if not doomed and self._take_fault(data):
                                doomed = True
                            upstream.sendall(data)
                        elif doomed:
                            # the server answered: the command ran; its reply is thrown away
                            with self._lost_event:
                                self.lost += 1
                                self._lost_event.notify_all()
                            return
                        else:
                            client.sendall(data)
            except OSError:
                return
            finally:
                for sock in (client, upstream):
                    with self._lock:
                        self._sockets.discard(sock)
                    _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
