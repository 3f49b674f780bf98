"""The coordination Redis behind an ACL user (docs/operations.md, "Redis ACL").

Against a real server the harness starts on a free loopback port, with an ACL user per case:

* the documented rules (the prefix's keys and channels; scripting, pub/sub, reads, writes) run
  every primitive, two threads contending for each, with no two bodies of one key overlapping
  (recorded enter/exit times);
* a user refused ``FUNCTION LOAD`` or ``FCALL`` (a managed service may allow scripts and not
  Functions) still runs every primitive, as ``EVALSHA`` scripts. Before, the refusal escaped
  ``Step.call`` as redis-py's raw ``NoPermissionError``;
* a user refused scripts, the prefix's keys, or a command a script calls gets a
  ``CoordinationUnavailable`` that says the server refuses its ACL user and what to grant, and
  the body does not run. A refusal met inside a script is a plain ``ResponseError`` that
  escaped raw before.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
import redis

from reactor_app.exceptions import CoordinationUnavailable
from reactor_app.testing.servers import StandaloneServer
from tests.concurrency.guarded_steps import EXCLUSIVE, SPANS, every_primitive

pytestmark = pytest.mark.django_db(transaction=True)

PREFIX = "acl-app"
#: the rules docs/operations.md gives (with its prefix)
DOCUMENTED = [
    f"~{PREFIX}:*",
    f"&{PREFIX}:*",
    "+@scripting",
    "+@pubsub",
    "+@connection",
    "+@read",
    "+@write",
    "+@keyspace",
    "+time",
]

PROTECTED = every_primitive("acl", wait=5)


USERS = itertools.count()


@pytest.fixture
def as_user(plain_server: StandaloneServer, settings: Any) -> Any:
    """``as_user(rules)``: a new ACL user with those rules becomes this test's connection."""
    admin = redis.Redis.from_url(plain_server.url)

    def use(rules: list[str]) -> None:
        name = f"app{next(USERS)}"
        admin.execute_command(
            "ACL", "SETUSER", name, "on", ">pw", "resetkeys", "resetchannels", "-@all", *rules
        )
        settings.REACTOR_REDIS_URL = f"redis://{name}:pw@127.0.0.1:{plain_server.port}/0"
        settings.REACTOR_KEY_PREFIX = PREFIX
        admin.function_flush()  # each case loads the library itself, or cannot

    yield use
    admin.flushall()
    admin.close()


def contend(primitive: str) -> list[Any]:
    """Two threads call the primitive's step on one key at once; their outcomes."""
    step_class = PROTECTED[primitive]
    SPANS.clear()
    outcomes: list[Any] = []
    threads = [
        threading.Thread(target=lambda: outcomes.append(step_class.call(n=primitive)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


def assert_runs_guarded(primitive: str) -> None:
    outcomes = contend(primitive)
    assert len(outcomes) == 2 and all(outcome.ok for outcome in outcomes), outcomes
    if primitive in EXCLUSIVE:
        assert len(SPANS) == 2
        first, second = sorted(SPANS, key=lambda span: span[1])
        assert first[2] <= second[1], "two bodies of one key overlapped"
    else:
        assert SPANS, outcomes


@pytest.mark.parametrize("primitive", sorted(PROTECTED))
def test_the_documented_acl_runs_every_primitive(as_user: Any, primitive: str) -> None:
    as_user(DOCUMENTED)
    assert_runs_guarded(primitive)


@pytest.mark.parametrize("refused", ["-function", "-fcall"], ids=["no-function-load", "no-fcall"])
@pytest.mark.parametrize("primitive", sorted(PROTECTED))
def test_a_user_refused_functions_runs_every_primitive_as_scripts(
    as_user: Any, primitive: str, refused: str
) -> None:
    as_user([*DOCUMENTED, refused])
    assert_runs_guarded(primitive)


@pytest.mark.parametrize(
    "rules",
    [
        [rule for rule in DOCUMENTED if rule != "+@scripting"],
        ["~elsewhere:*", *DOCUMENTED[1:]],
        [f"~{PREFIX}:*", f"&{PREFIX}:*", "+@scripting", "+@pubsub", "+ping", "+time"],
    ],
    ids=["no-scripts", "other-keys", "a-command-inside-the-script"],
)
def test_an_acl_refusal_fails_the_step_clearly_and_the_body_does_not_run(
    as_user: Any, rules: list[str]
) -> None:
    as_user(rules)
    SPANS.clear()
    outcome = PROTECTED["lock"].call(n="refused")
    assert SPANS == [], "the body ran without coordination"
    assert isinstance(outcome.error, CoordinationUnavailable), repr(outcome.error)
    message = str(outcome.error)
    assert "coordination store refusing its ACL user for step 'Locked'" in message, message
    assert '"Redis ACL"' in message and "the protected work did not run" in message
