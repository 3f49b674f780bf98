"""The checker's rule for "newest first" (``checker._against_completion``), on ledgers written
out by hand: what it must flag, and the one order it must not — found by the model's soak, two
bodies noted in two worker processes a moment apart and undone the other way round, which the
engine's stamps (taken when each body *returned*) allow."""

from __future__ import annotations

from typing import Any

from tests.sagas.checker import CONCURRENT_NS, _against_completion


def _do(label: str, t: int, pid: int) -> dict[str, Any]:
    return {"label": label, "kind": "do", "t": t, "pid": pid}


def test_an_effect_undone_before_a_later_one_of_its_own_process_is_flagged() -> None:
    dos = {"s1": _do("s1", 0, 7), "s2": _do("s2", 1_000, 7)}
    assert _against_completion(["s1", "s2"], dos) == (
        "s1 (pid 7) undone before s2 (pid 7), which completed 0.0 ms after it"
    )
    assert _against_completion(["s2", "s1"], dos) is None


def test_an_effect_undone_before_one_surely_later_in_another_process_is_flagged() -> None:
    dos = {"s1": _do("s1", 0, 7), "s2": _do("s2", CONCURRENT_NS, 8)}
    assert _against_completion(["s1", "s2"], dos) is not None
    assert _against_completion(["s2", "s1"], dos) is None


def test_regression_two_bodies_noted_a_moment_apart_in_two_processes_may_go_either_way() -> None:
    """The soak's case (``s5[0]`` noted just before ``s4``, undone first): either order."""
    dos = {
        "s2[0]": _do("s2[0]", 0, 7),
        "s5[0]": _do("s5[0]", 5 * CONCURRENT_NS, 8),
        "s4": _do("s4", 5 * CONCURRENT_NS + 3_000_000, 9),
        "s6[0]": _do("s6[0]", 7 * CONCURRENT_NS, 8),
    }
    assert _against_completion(["s6[0]", "s5[0]", "s4", "s2[0]"], dos) is None
    assert _against_completion(["s6[0]", "s4", "s5[0]", "s2[0]"], dos) is None
    # what stays an error: the oldest undone before a newer one
    assert _against_completion(["s6[0]", "s2[0]", "s4", "s5[0]"], dos) is not None
