"""The guides' Python samples run, against the real API, Redis and database.

Every ```` ```python ```` block of ``docs/*.md`` runs, in order, in one namespace per guide
(so later blocks build on earlier ones, as a reader would), with a few stand-ins for "your own
code" the samples call (a payment client, a warehouse...); example tests a guide defines are
called when they take no fixture. A block preceded by
``<!-- not run: <why> -->`` needs something a test cannot give it here (a Celery worker, a
second process); it is still compiled, and every ``reactor_app`` name it imports must exist.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import itertools
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PROJECT_ROOT

DOCS = PROJECT_ROOT / "docs"
GUIDES = [
    "getting-started.md",
    "reactors-and-steps.md",
    "coordination.md",
    "operations.md",
    "testing.md",
    "tasks.md",
]
BLOCK = re.compile(
    r"(?:<!-- not run: (?P<why>[^>]+?) -->\n)?^```python\n(?P<code>.*?)^```", re.S | re.M
)

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Sample:
    guide: str
    line: int
    code: str
    not_run: str | None


def samples(guide: str) -> list[Sample]:
    text = (DOCS / guide).read_text()
    return [
        Sample(
            guide,
            text.count("\n", 0, match.start("code")) + 1,
            match.group("code"),
            match.group("why"),
        )
        for match in BLOCK.finditer(text)
    ]


# -- stand-ins for the reader's own code ----------------------------------------------------

_ids = itertools.count(1)


class Payments:
    """A payment service client."""

    def __init__(self) -> None:
        self.charges: dict[str, tuple[int, int, int | None]] = {}
        self.refunded: list[str] = []

    def charge(self, account_id: int, amount: int, fencing_token: int | None = None) -> str:
        charge_id = f"ch_{next(_ids)}"
        self.charges[charge_id] = (account_id, amount, fencing_token)
        return charge_id

    def refund(self, charge_id: str) -> None:
        self.refunded.append(charge_id)


@dataclass
class Warehouse:
    stock: dict[str, int] = field(default_factory=lambda: {"tea": 10, "cups": 10})
    released: list[Any] = field(default_factory=list)

    def available(self, sku: str, quantity: int) -> bool:
        return self.stock.get(sku, 0) >= quantity

    def reserve(self, sku: str, quantity: int) -> tuple[str, int]:
        self.stock[sku] -= quantity
        return (sku, quantity)

    def release(self, reservation: Any) -> None:
        self.released.append(tuple(reservation))


def namespace(guide: str) -> dict[str, Any]:
    # the model the fencing sample shows (a not-run block: a model of the reader's app)
    from demo_project.shop.models import Account

    receipts: list[tuple[str, str]] = []
    return {
        "Account": Account,
        "__name__": f"docs_{Path(guide).stem.replace('-', '_')}",
        "payments": Payments(),
        "send_receipt": lambda charge_id, via: receipts.append((charge_id, via)),
        "receipts": receipts,
        "audit_log": [],
        "warehouse": Warehouse(),
        "balances": {},
    }


def _check_imports(sample: Sample) -> None:
    """Every name a sample imports from reactor_app (or the demo) exists."""
    for node in ast.walk(ast.parse(sample.code)):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and (node.module.startswith(("reactor_app", "demo_project")))
        ):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"
                ), f"{sample.guide}:{sample.line}: {node.module} has no {alias.name}"


@pytest.mark.parametrize("guide", GUIDES)
def test_the_guides_python_samples_run(guide: str, reactor_redis: Any) -> None:
    found = samples(guide)
    assert found, f"{guide} has no Python samples"
    names = namespace(guide)
    for sample in found:
        compiled = compile(sample.code, f"docs/{guide}:{sample.line}", "exec")
        _check_imports(sample)
        if sample.not_run:
            continue
        exec(compiled, names)  # running the documentation is the point
    # example tests in a guide run too (those that need no fixture)
    for name, value in list(names.items()):
        runnable = inspect.isfunction(value) and not inspect.signature(value).parameters
        if name.startswith("test_") and runnable:
            value()


def test_every_guide_is_linked_from_the_readme() -> None:
    readme = (PROJECT_ROOT / "README.md").read_text()
    repository = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["urls"][
        "Repository"
    ]
    for guide in [*GUIDES, "benchmarks.md"]:
        # absolute: the README is the package's long description, read on PyPI too
        assert f"({repository}/blob/main/docs/{guide})" in readme, guide
        assert (DOCS / guide).exists(), guide


def _imported_modules(code: str) -> list[str]:
    modules: list[str] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.append(node.module)
        elif isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
    return modules


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(f"docs/{path.name}" for path in DOCS.glob("*.md"))]
)
def test_no_sample_imports_the_demo_project(page: str) -> None:
    """A reader's project has no ``demo_project``: a sample importing it cannot be copied."""
    text = (PROJECT_ROOT / page).read_text()
    for match in BLOCK.finditer(text):
        line = text.count("\n", 0, match.start("code")) + 1
        for module in _imported_modules(match.group("code")):
            assert not module.startswith("demo_project"), f"{page}:{line} imports {module}"
