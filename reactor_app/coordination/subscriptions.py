"""The wake subscription each waiting thread keeps between its waits.

A waiter sleeps on a pub/sub subscription to its key's wake channel (``waiting``). A PubSub
opened for one wait and closed after it costs more than the wait's own commands: redis-py
closes a PubSub by *disconnecting* its connection and handing it back to the client's pool, so
the thread's next command — on a lock's hand-off, the first one after the body — opens a new
TCP connection and repeats the handshake (docs/benchmarks.md, "Step- vs reactor-level lock":
the largest single cost of a hand-off). So each thread keeps one subscription per client and
reuses it:

* ``borrow(client)`` hands the thread its subscription (a new one the first time, after a
  fork, for another client, or while another wait on this thread has it);
* ``give_back(pubsub, channels, reusable=...)`` sends the UNSUBSCRIBE for the wait's channels
  *without* reading its confirmation — that would put a round trip between an admission and
  the body it admits — and keeps the subscription for the thread's next wait. That wait's own
  SUBSCRIBE is confirmed only after the server has processed the UNSUBSCRIBE before it, and
  ``waiting`` reads up to that confirmation, so a wake message of an earlier wait still in
  flight is consumed there and never wakes the new one.

A wait that ended in an admission may leave even that UNSUBSCRIBE for later
(``give_back(..., defer=True)``): a lock handed to a waiter is its critical section from the
admission's reply on, and the send (a system call and redis-py's command path, ~0.1 ms of the
~2 ms hand-off on the benchmark machine) would run inside it, before the body. The gate that
waited sends it once its holds are released (``settle``); the thread's next ``borrow`` sends
it too, if that comes first (a wait inside the body). Meanwhile the subscription may receive
the key's wake messages (the holder's own release publishes one): the next wait reads past
them up to its SUBSCRIBE's confirmation, as above.

A wait that ended in an error closes its subscription (the next wait opens a new one). A
cluster client gets a subscription per wait, closed after it: a cluster PubSub is bound to the
node of its first channel's slot.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from typing import Any

from reactor_app import forks
from reactor_app.coordination.redis import is_cluster


class _Kept(threading.local):
    #: (pid, client, pubsub) of this thread's subscription between two waits
    entry: tuple[int, Any, Any] | None = None
    #: channels that subscription is still subscribed to: their UNSUBSCRIBE is left to
    #: ``settle`` (``give_back(..., defer=True)``)
    pending: tuple[str, ...] = ()


_kept = _Kept()


def borrow(client: Any) -> Any:
    """This thread's subscription on ``client``, ready for ``subscribe``."""
    settle()
    entry, _kept.entry = _kept.entry, None
    if entry is not None:
        pid, kept_client, pubsub = entry
        if pid == forks.pid() and kept_client is client:
            return pubsub
        if pid == forks.pid():
            close(pubsub)
        # else: inherited through a fork — its socket is the parent's; never touch it
    return client.pubsub()


def give_back(
    pubsub: Any, client: Any, channels: Iterable[str], *, reusable: bool, defer: bool = False
) -> None:
    """End a wait: keep ``pubsub`` for this thread's next wait, unsubscribed from
    ``channels`` (confirmation left unread), or close it when it cannot be reused.
    ``defer``: leave the UNSUBSCRIBE to ``settle`` (or to the thread's next ``borrow``)."""
    channels = list(channels)
    if not reusable or is_cluster(client) or _kept.entry is not None:
        close(pubsub)
        return
    if defer:
        _kept.entry, _kept.pending = (forks.pid(), client, pubsub), tuple(channels)
        return
    if channels and not _unsubscribe(pubsub, channels):
        return
    _kept.entry = (forks.pid(), client, pubsub)


def settle() -> None:
    """Send the UNSUBSCRIBE a wait of this thread left for later (``give_back(...,
    defer=True)``); nothing when there is none. Never raises: a subscription that cannot
    unsubscribe is closed (the next wait opens a new one)."""
    channels, _kept.pending = _kept.pending, ()
    entry = _kept.entry
    if not channels or entry is None:
        return
    pid, _client, pubsub = entry
    if pid != forks.pid():
        return  # inherited through a fork: the parent's to settle (borrow drops it)
    if not _unsubscribe(pubsub, channels):
        _kept.entry = None


def _unsubscribe(pubsub: Any, channels: Iterable[str]) -> bool:
    """UNSUBSCRIBE ``channels`` without reading the confirmation; False (and the
    subscription closed) when the send failed."""
    channels = list(channels)
    try:
        pubsub.unsubscribe(*channels)
    except Exception:
        close(pubsub)
        return False
    # forget them now: a reconnect before the next wait must not subscribe them again
    # (redis-py keys them as bytes or text, by the client's decode_responses)
    for channel in channels:
        pubsub.channels.pop(channel, None)
        pubsub.channels.pop(channel.encode(), None)
    return True


def close(pubsub: Any) -> None:
    """Close a subscription (its connection goes back to the pool, disconnected)."""
    with contextlib.suppress(Exception):  # already broken: nothing left to give back
        pubsub.close()
