"""``on_contention`` is checked at definition time, and rollback always queues."""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app import Step, Success, with_lock, with_semaphore
from reactor_app.exceptions import DefinitionError


class Body(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


@pytest.mark.parametrize("strategy", ["queue", "skip", "cancel_newest", "cancel_in_progress"])
def test_a_lock_takes_each_strategy(strategy: str) -> None:
    declared = with_lock(lambda args: "k", on_contention=strategy)(type("Locked", (Body,), {}))
    assert declared.lock_config.on_contention == strategy


def test_a_semaphore_has_no_holder_to_cancel() -> None:
    with pytest.raises(DefinitionError, match="'queue', 'skip', 'cancel_newest', got"):
        with_semaphore(lambda args: "k", limit=2, on_contention="cancel_in_progress")


def test_an_unknown_strategy_names_the_choices() -> None:
    with pytest.raises(DefinitionError, match="on_contention must be one of"):
        with_lock(lambda args: "k", on_contention="drop")


def test_rollback_re_takes_a_skipping_lock_by_queueing() -> None:
    declared = with_lock(lambda args: "k", on_contention="skip")(type("Skipping", (Body,), {}))
    [rollback] = declared.declarations().for_rollback()
    assert rollback.on_contention == "queue"  # an undo must run, never be skipped
    assert declared.lock_config.on_contention == "skip"
