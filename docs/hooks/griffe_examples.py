"""Griffe extension of the stiefax docs: docstrings rendered as the Markdown they mean.

* ``Example:`` sections render as examples. The library's docstrings open their
  doctests with ``Example:`` (Google style); griffe names that section ``Examples:``
  and would otherwise render an ``Example:`` block as an admonition of Markdown, in
  which ``>>>`` lines become block quotes. The section title is rewritten before the
  docstring is parsed, so each doctest renders as a highlighted console session.
* Sphinx cross-reference roles (``:func:`name```, ``:class:``, ``:meth:``, ``:mod:``,
  ``:data:``, ``:attr:``, ``:exc:``, ``:obj:``) become mkdocstrings cross-references
  ``[`name`][identifier]`` when ``name`` resolves (in the docstring's class, then its
  module, then as a dotted path) to a symbol the API pages render, and inline code
  otherwise. A paragraph ending in a literal-block marker ``::`` ends in ``:`` (the
  indented block that follows is a Markdown code block already).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import pathlib
import re
from typing import Any
from typing import Optional

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):`~?([^`]+)`")
_LITERAL = re.compile(r"^(?P<body>(?!\s*>>>).*?)(?P<sep>\s?)::[ \t]*$", re.MULTILINE)
_HOOK = pathlib.Path(__file__).with_name("stiefax_docs.py")
_rendered: Optional[dict[int, str]] = None


def _hook():
  spec = importlib.util.spec_from_file_location("stiefax_docs_for_griffe", _HOOK)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def rendered_identifiers() -> dict[int, str]:
  """``id(object) -> identifier`` for every object the API pages render.

  Top-level re-exports are rendered as ``stiefax.<name>``; a symbol re-exported by
  several modules keeps the identifier of the module that defines it when that module
  is rendered.
  """
  global _rendered
  if _rendered is None:
    hook = _hook()
    table: dict[int, str] = {}
    for module_name, name, obj in hook.public_symbols():
      if not (inspect.ismodule(obj) or callable(obj)):
        continue  # constants render only with a docstring of their own: plain code
      ident = obj.__name__ if inspect.ismodule(obj) else f"{module_name}.{name}"
      home = getattr(obj, "__module__", None)
      if id(obj) not in table or (module_name == home) or module_name == "stiefax":
        table[id(obj)] = ident
    for module_name in hook.API_MODULES:
      table[id(importlib.import_module(module_name))] = module_name
    _rendered = table
  return _rendered


def _lookup(root: Any, dotted: str) -> Any:
  obj = root
  for part in dotted.split("."):
    obj = getattr(obj, part)
  return obj


def resolve(name: str, module: str, cls: Optional[str] = None) -> Optional[str]:
  """The rendered identifier ``name`` refers to from ``module`` (and class ``cls``)."""
  table = rendered_identifiers()
  mod = importlib.import_module(module)
  scopes = []
  if cls:
    with contextlib.suppress(AttributeError):
      scopes.append((_lookup(mod, cls), cls))
  scopes.append((mod, None))
  for scope, cls_name in scopes:
    try:
      obj = _lookup(scope, name)
    except AttributeError:
      continue
    if id(obj) in table:
      return table[id(obj)]
    head, _, last = name.rpartition(".")
    owner_obj = scope if not head else _lookup(scope, head)
    owner = table.get(id(owner_obj))
    if owner is not None and (head or cls_name is not None):  # a member of a rendered class
      return f"{owner}.{last}"
  parts = name.split(".")
  for i in range(len(parts), 0, -1):  # an absolute dotted path
    try:
      obj = (
        _lookup(importlib.import_module(".".join(parts[:i])), ".".join(parts[i:]))
        if i < len(parts)
        else importlib.import_module(name)
      )
    except (ImportError, AttributeError, ValueError):
      continue
    if id(obj) in table:
      return table[id(obj)]
    owner = table.get(id(_owner(parts, i)))
    if owner is not None and i < len(parts) - 1:
      return f"{owner}.{parts[-1]}"
    break
  return None


def _owner(parts: list[str], i: int) -> Any:
  try:
    return _lookup(importlib.import_module(".".join(parts[:i])), ".".join(parts[i:-1]))
  except (ImportError, AttributeError, ValueError):
    return None


def markdown_docstring(text: str, module: str, cls: Optional[str] = None) -> str:
  """``text`` with Sphinx roles and ``::`` markers rewritten as Markdown."""

  def role(match: re.Match) -> str:
    name = match.group(1).strip()
    shown = name.rsplit(".", 1)[-1] if match.group(0).count("`~") else name
    target = resolve(name, module, cls)
    return f"[`{shown}`][{target}]" if target else f"`{shown}`"

  text = _ROLE.sub(role, text)
  return _LITERAL.sub(lambda m: m.group("body") + (":" if m.group("body").strip() else ""), text)


class ExampleSections(griffe.Extension):
  """Renames ``Example:`` section titles and rewrites Sphinx markup as Markdown."""

  def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
    if obj.docstring is None:
      return
    text = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
    module = obj.module.path
    cls = None
    if obj.is_class:
      cls = obj.path[len(module) + 1 :]
    elif obj.parent is not None and obj.parent.is_class:
      cls = obj.parent.path[len(module) + 1 :]
    try:
      text = markdown_docstring(text, module, cls)
    except ImportError:
      text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    obj.docstring.value = text
