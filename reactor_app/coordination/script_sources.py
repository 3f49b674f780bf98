"""The Lua sources: every ``lua/<operation>.lua`` of the package, assembled for loading.

Read through ``importlib.resources`` (so it works from a wheel or a zip). Files starting with
``_`` are fragments spliced in by ``-- @include``; each primitive's file under
``lua/primitives/`` is cut into sections spliced in by ``-- @primitives <section>``; a
retry-safe operation is wrapped in the stored-reply fragment (``coordination.stored_replies``).
``coordination.scripts`` registers and calls what this module assembles, as ``EVALSHA``
scripts or as one Redis Functions library (``coordination.function_library``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from reactor_app.coordination.stored_replies import STORES_ITS_REPLY, wrap_source

LUA_PACKAGE = "reactor_app.coordination"
LUA_FOLDER = "lua"
#: one Lua file per primitive, in sections spliced into the general scripts
PRIMITIVES_FOLDER = "primitives"
#: the fragment a retry-safe operation is wrapped in
STORED_REPLY_WRAPPER = "_stored_reply.lua"
_INCLUDE = re.compile(r"^-- @include (\S+\.lua)\s*$", re.MULTILINE)
_PRIMITIVES = re.compile(r"^-- @primitives (\w+)\s*$", re.MULTILINE)
_SECTION = re.compile(r"^-- @section (\w+)\s*$", re.MULTILINE)


def _lua_folder() -> Any:
    return resources.files(LUA_PACKAGE).joinpath(LUA_FOLDER)


def primitive_sections() -> dict[str, dict[str, str]]:
    """``{primitive: {section: text}}`` of every ``lua/primitives/<primitive>.lua``.

    A primitive's Lua is one file of sections (``admit``, ``release``, ``extend``), each spliced
    into the general script that says ``-- @primitives <section>``; what precedes the first
    section is the file's header comment, spliced nowhere.
    """
    folder = _lua_folder().joinpath(PRIMITIVES_FOLDER)
    found: dict[str, dict[str, str]] = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".lua"):
            continue
        # [header, name, text, name, text, ...]
        _, *parts = _SECTION.split(entry.read_text(encoding="utf-8"))
        names, texts = parts[0::2], parts[1::2]
        found[entry.name[: -len(".lua")]] = {
            name: text.strip("\n") + "\n" for name, text in zip(names, texts, strict=True)
        }
    return found


@dataclass(frozen=True)
class LuaParts:
    """The package's Lua, cut where the two ways of loading it differ.

    ``operations`` have their primitive sections spliced in but keep their ``-- @include``
    lines: an ``EVALSHA`` script gets the fragments spliced in its own text
    (``script_sources``), the Functions library defines them once for every operation
    (``coordination.function_library``).
    """

    #: ``{"_name.lua": text}`` of every shared fragment
    fragments: dict[str, str]
    #: ``{operation: text}``, primitive sections spliced, include lines left in
    operations: dict[str, str]


@cache
def lua_parts() -> LuaParts:
    """Every ``lua/*.lua`` of the installed package: fragments, and operations with their
    ``-- @primitives <section>`` lines replaced by that section of every primitive's file
    (``primitive_sections``), in name order: each registers itself in the script's dispatch
    tables, so no script lists the primitives."""
    folder = _lua_folder()
    fragments: dict[str, str] = {}
    operations: dict[str, str] = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".lua"):
            continue
        text = entry.read_text(encoding="utf-8")
        if entry.name.startswith("_"):
            fragments[entry.name] = text
        else:
            operations[entry.name[: -len(".lua")]] = text
    sections = primitive_sections()

    def splice_primitives(match: re.Match[str]) -> str:
        section = match.group(1)
        return "\n".join(
            parts[section] for _, parts in sorted(sections.items()) if section in parts
        )

    return LuaParts(
        fragments=fragments,
        operations={
            name: _PRIMITIVES.sub(splice_primitives, text)
            for name, text in sorted(operations.items())
        },
    )


def includes(text: str) -> list[str]:
    """The fragments ``text`` includes, in its order."""
    return _INCLUDE.findall(text)


def without_includes(text: str) -> str:
    """``text`` with its ``-- @include`` lines dropped."""
    return _INCLUDE.sub("", text)


@cache
def script_sources() -> dict[str, str]:
    """``{operation: source}`` for every ``lua/<operation>.lua`` of the installed package, as
    an ``EVALSHA`` script: each ``-- @include _name.lua`` line replaced by that fragment's text
    (files starting with ``_`` are those shared fragments, not operations), and a retry-safe
    operation wrapped in the stored-reply fragment (``coordination.stored_replies``)."""
    parts = lua_parts()
    fragments = parts.fragments

    def splice(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in fragments:
            raise RuntimeError(f"lua include {name!r} not found in {LUA_PACKAGE}/{LUA_FOLDER}")
        return fragments[name]

    spliced = {name: _INCLUDE.sub(splice, text) for name, text in parts.operations.items()}
    # a retry-safe operation runs inside the stored-reply wrapper (coordination.stored_replies)
    return {
        name: wrap_source(fragments[STORED_REPLY_WRAPPER], text)
        if name in STORES_ITS_REPLY
        else text
        for name, text in spliced.items()
    }
