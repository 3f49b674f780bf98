"""A worker delivery that dies inside its rollback: the next delivery goes on with the rollback
(``engine.rollback_progress``), never with the steps — generated over where the rollback dies.

The delivery dies at a drawn hook of the rollback (an undo of a plain step or of a map
element, or the failing step's compensate), before or after that hook's effect, by a
``BaseException`` the engine does not catch (as a ``SIGKILL`` leaves nothing behind; the real
kill on a real worker is tests/sagas/test_regressions_workers.py). The property: the failing
body never runs again once its rollback started; every completed effect is undone exactly
once — the hook that died after its effect twice, at least once being the rule for a hook
killed mid-way — newest first; the run ends ``failed`` with the failing step's error.

Deliveries run in this process (``deliver`` is the task body), stepped by the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reactor_app import (
    Failure,
    Reactor,
    Step,
    Success,
    element,
    from_input,
    map_step,
    step,
    value,
)
from reactor_app.coordination.keys import key as redis_key
from reactor_app.coordination.redis import get_client
from reactor_app.engine.dispatch import deliver
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)

#: what the bodies and hooks did, in order: (label, kind)
LOG: list[tuple[str, str]] = []
#: where the current delivery dies: (label, kind, "before" | "after" its effect), once
DEATH: dict[str, Any] = {}


class Died(BaseException):
    """The delivery's process is gone (nothing of the engine runs after it)."""


def _hook(label: str, kind: str) -> None:
    if DEATH.get("at") == (label, kind) and DEATH["when"] == "before":
        DEATH.clear()
        raise Died
    LOG.append((label, kind))
    if DEATH.get("at") == (label, kind):
        DEATH.clear()
        raise Died


class Plain(Step):
    inputs = ("label",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append((args["label"], "do"))
        return Success(args["label"])

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        _hook(args["label"], "undo")


class Each(Step):
    inputs = ("item",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append((f"m[{args['item']}]", "do"))
        return Success(args["item"])

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        _hook(f"m[{args['item']}]", "undo")


class Fails(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append(("f", "enter"))
        return Failure("f fails for good", retryable=False)

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> None:
        _hook("f", "compensate")


class Resumable(Reactor):
    inputs = ("items",)
    a = step(Plain, label=value("a"))
    m = map_step(Each, over=from_input("items"), item=element())
    b = step(Plain, label=value("b"))
    f = step(Fails)


@pytest.fixture(autouse=True)
def in_process(settings: Any) -> Iterator[None]:
    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{uuid.uuid4().hex[:8]}"
    yield


def _die_in_delivery(execution_id: str) -> None:
    """One delivery that dies: its claim lapses (deleted here, as its TTL would)."""
    with pytest.raises(Died):
        deliver(execution_id)
    get_client().delete(redis_key("claim", execution_id))


@settings(max_examples=12)
@given(
    items=st.integers(0, 3),
    where=st.data(),
    when=st.sampled_from(["before", "after"]),
)
def test_a_delivery_that_dies_in_its_rollback_is_gone_on_with(
    items: int, where: Any, when: str
) -> None:
    LOG.clear()
    hooks = [("f", "compensate"), ("b", "undo")]
    hooks += [(f"m[{i}]", "undo") for i in reversed(range(items))] + [("a", "undo")]
    at = where.draw(st.sampled_from(hooks), label="dies at")
    DEATH.update(at=at, when=when)
    execution = Resumable.run_async(items=list(range(items)))
    execution_id = str(execution.id)
    _die_in_delivery(execution_id)
    deliver(execution_id)
    row = Execution.objects.get(pk=execution_id)
    assert row.status == ExecutionStatus.FAILED, (row.status, LOG)
    assert (row.error or {}).get("step") == "f", row.error
    assert LOG.count(("f", "enter")) == 1 + (at == ("f", "compensate")), LOG
    expected = [(label, kind) for label, kind in hooks if kind == "undo"]
    done = [entry for entry in LOG if entry[1] == "undo"]
    if when == "after" and at[1] == "undo":
        expected.insert(expected.index(at), at)  # the hook that died after its effect: again
    assert done == expected, LOG
    assert "rolling_back" not in (row.context or {}), row.context
