"""Helpers of the lost-reply schedule on a real worker (``test_worker_lost_replies``): which
script call's reply the fault proxy loses (``ReplyLoser``), and what the coordination Redis
did, seen from beside the proxy (``Monitor``: ``MONITOR`` of the private server, which lists
the commands a script runs too, so the test counts the rate-limit charges the server made).

``ReplyLoser`` is the predicate the proxy is armed with (``FaultProxy.lose_next_reply``); it
reads each request (RESP bytes) and decides:

* only script calls (``FCALL`` / ``EVALSHA`` / ``EVAL``);
* a retry-safe call's request (``stored_replies.RETRY_SAFE``: it carries a request id, the
  last key — or, for ``KEEPS_ITS_REQUEST``, the argument before ``LOOK_FIRST``) loses at
  most ``stored_replies.RETRIES`` replies, the first send's and then each resend's with even
  odds — the documented bound (docs/coordination.md, "A lost reply is asked again, not
  redone"): a call is retried that many times, so its last retry gets through and
  its caller learns what the first send took. Past the bound the caller gets
  ``CoordinationUnavailable`` and what the call took lapses with its lease: that is not the
  case under test;
* an admission (``admit``, ``lock_admit``, ``ordered_position``) on the keys of a recorded
  name that has had none lost yet is aimed at (``aim``), so every primitive at every level
  meets the fault; any other script call loses its reply with odds ``ANY``, at most one such
  loss per ``SPACING`` seconds.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from reactor_app.coordination.stored_replies import (
    KEEPS_ITS_REQUEST,
    LOOK_FIRST,
    RETRIES,
    RETRY_SAFE,
)
from reactor_app.testing.redis_processes import wait_until

#: the operations that admit (their reply lost: the holder must still learn it holds)
ADMISSIONS = frozenset({"admit", "lock_admit", "ordered_position"})
#: seconds between two first losses (a resend's loss is not held back)
SPACING = 0.15
#: odds that a script call not aimed at loses its reply (once SPACING has passed)
ANY = 0.25
SCRIPT_COMMANDS = (b"FCALL", b"EVALSHA", b"EVAL")


def resp_parts(request: bytes) -> list[bytes]:
    """The bulk strings of the first command in ``request`` (a RESP array), or ``[]``."""
    if not request.startswith(b"*"):
        return []
    lines = request.split(b"\r\n")
    try:
        count = int(lines[0][1:])
        return [lines[2 + 2 * i] for i in range(count)]
    except (ValueError, IndexError):
        return []


def user_key_of(name: str) -> str | None:
    """The user key in a coordination key's hash tag (``…:lock:{acct:1}:fence`` -> ``acct:1``)."""
    opening = name.find("{")
    closing = name.find("}", opening + 1)
    return name[opening + 1 : closing] if 0 <= opening < closing else None


@dataclass(frozen=True)
class Lost:
    """One reply lost: the recorded name whose key the call was on (None: another call), the
    operation (``script`` for an ``EVALSHA`` / ``EVAL``), whether it was a resend."""

    name: str | None
    operation: str
    resend: bool


class ReplyLoser:
    """The proxy's predicate: whose reply to lose (the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        #: key stem (``lock:3fa2c1``) -> recorded name; replaced whole when extended
        self.stems: dict[str, str] = {}
        self.lost: list[Lost] = []
        self._per_request: Counter[str] = Counter()
        self._last = 0.0

    def add_stems(self, plan: list[tuple[str, str]]) -> None:
        """The (name, key) plan of executions enqueued: their keys' stems are aimed at."""
        self.stems = {**self.stems, **{key.rsplit(":", 1)[0]: name for name, key in plan}}

    def admissions_lost(self) -> Counter[str]:
        """Recorded name -> admissions whose reply was lost (first sends and resends)."""
        return Counter(o.name for o in self.lost if o.name and o.operation in ADMISSIONS)

    def _name_of(self, keys: list[bytes]) -> str | None:
        for raw in keys:
            user_key = user_key_of(raw.decode(errors="replace"))
            if user_key:
                name = self.stems.get(user_key.rsplit(":", 1)[0])
                if name:
                    return name
        return None

    def __call__(self, request: bytes) -> bool:
        parts = resp_parts(request)
        if len(parts) < 3 or parts[0].upper() not in SCRIPT_COMMANDS:
            return False
        command, target = parts[0].upper(), parts[1].decode(errors="replace")
        # a function is named reactor_<digest>_<operation>; a script by its sha
        operation = target.split("_", 2)[2] if command == b"FCALL" and "_" in target else "script"
        try:
            count = int(parts[2])
        except ValueError:
            return False
        keys, args = parts[3 : 3 + count], parts[3 + count :]
        request_id = None
        if operation in KEEPS_ITS_REQUEST and len(args) >= 2:
            request_id = args[-2].decode()  # its id travels among its arguments
        elif operation in RETRY_SAFE and keys:
            request_id = keys[-1].decode()  # its stored reply's key, the last key
        resend = bool(request_id) and bool(args) and args[-1] == LOOK_FIRST.encode()
        now = time.monotonic()
        if request_id is not None and self._per_request[request_id] >= RETRIES:
            return False  # its last retry gets through: the documented bound
        name = self._name_of(keys)
        if resend and request_id is not None and self._per_request[request_id]:
            lose = self.rng.random() < 0.5
        elif operation in ADMISSIONS and name and not self.admissions_lost()[name]:
            lose = True  # aimed at: not held back by SPACING
        elif now - self._last < SPACING:
            return False
        else:
            lose = self.rng.random() < ANY
        if lose:
            if request_id is not None:
                self._per_request[request_id] += 1
            self._last = now
            self.lost.append(Lost(name, operation, resend))
        return lose


class Monitor:
    """``redis-cli MONITOR`` of a server, into a file: every command it ran, scripts' too."""

    def __init__(self, port: int, path: Path) -> None:
        self.port, self.path = port, path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Monitor:
        with open(self.path, "wb") as out:
            self.process = subprocess.Popen(
                ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "monitor"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until(lambda: self.path.read_bytes().startswith(b"OK"), 10, "MONITOR to start")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def lines(self) -> list[str]:
        return self.path.read_text(errors="replace").splitlines()

    def rate_limit_charges(self) -> Counter[str]:
        """User key -> rate-limit charges the server made: ``rate_limit.lua`` adds each charge
        to the window's zset (``ZADD <…:rate_limit:{key}:<window>> <µs> <member>``, once per
        window; these limits have one), and nothing else ZADDs to a rate limit's keys."""
        charges: Counter[str] = Counter()
        for line in self.lines():
            if '"ZADD"' not in line:
                continue
            target = line.split('"ZADD"', 1)[1].strip().split(" ", 1)[0]
            if ":rate_limit:{" in target:
                user_key = user_key_of(target)
                if user_key:
                    charges[user_key] += 1
        return charges
