"""The package's metadata, as PyPI and a newcomer read it (issue 30, item 5).

* ``[project.urls]`` gives the Project-URLs (home, repository, documentation, changelog).
* The README is the long description: on PyPI a relative link (``docs/getting-started.md``)
  leads nowhere, so every link is absolute, under the Repository URL — the one address the
  project writes down — and names a file this checkout has.
* Until the package is published, the README says how to install it from a checkout or git.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest

from tests.conftest import PROJECT_ROOT

#: a Markdown link or image target: [text](target)
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    return tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]


def test_the_metadata_has_project_urls(project: dict[str, Any]) -> None:
    urls = project["urls"]
    assert {"Homepage", "Repository", "Documentation", "Changelog"} <= set(urls)
    repository = urls["Repository"]
    assert repository.startswith("https://")
    for name, url in urls.items():
        assert url.startswith(repository), (name, url)
    readme = project["readme"]
    assert readme["file"] == "README.md" and readme["content-type"] == "text/markdown"


def test_every_readme_link_is_absolute_and_names_a_file_of_the_repository(
    project: dict[str, Any],
) -> None:
    repository = project["urls"]["Repository"]
    text = (PROJECT_ROOT / "README.md").read_text()
    targets = LINK.findall(text)
    assert targets, "the README has no links"
    ours = 0
    for target in targets:
        assert target.startswith(("https://", "http://", "#")), f"relative link: {target}"
        if target.startswith(repository + "/"):
            ours += 1
            kind, branch, path = target[len(repository) + 1 :].split("/", 2)
            assert (kind, branch) in {("blob", "main"), ("tree", "main")}, target
            assert (PROJECT_ROOT / path.split("#")[0]).exists(), target
    assert ours >= 8  # the guides, the changelog and the license


def test_the_readme_says_how_to_install_from_a_checkout_or_git(project: dict[str, Any]) -> None:
    text = (PROJECT_ROOT / "README.md").read_text()
    assert "Until `reactor-app` is published on PyPI" in text
    assert re.search(r'pip install -e "[^"]*\[api\]"', text)
    assert f"@ git+{project['urls']['Repository']}.git" in text
