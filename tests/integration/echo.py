"""A one-step reactor whose step returns its input, for tests about everything but the step."""

from __future__ import annotations

from typing import Any

from reactor_app import Reactor, Step, Success, from_input, step


class Echo(Step):
    inputs = ("x",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(args["x"])


class EchoReactor(Reactor):
    inputs = ("x",)
    echo = step(Echo, x=from_input("x"))
    returns = "echo"
