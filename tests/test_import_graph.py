"""The import graph of the whole ``stiefax`` package, and the rules it must keep.

Nodes are the modules of ``stiefax`` (a package is its ``__init__``); an edge is an
import written anywhere in a module, inside functions too: ``import a.b``, ``from a
import b`` (to the module ``a.b`` if there is one, else to the package ``a``),
relative forms resolved. Importing a package's name (``import stiefax``, ``from
stiefax.experiments import grok``) is an edge into that package's ``__init__``, so a
module that reaches its own package for a docstring and a package that imports the
module form a loop.

The rules are about kinds of modules, not their names: no cycles; the experiment
harness uses the library only through its face (the top level and the documented
submodules), never a private module (``stiefax._x``) nor an undocumented one; and the
entry point, ``stiefax.experiments.cli``, is imported by nothing.
"""

import ast
import pathlib
from typing import Optional

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "stiefax"

#: The library's face as the API reference documents it: ``stiefax`` and these.
DOCUMENTED = {
  "geometry",
  "layouts",
  "labels",
  "flax",
  "diagnostics",
  "covariance",
  "elr",
  "sphere",
  "muon",
  "certificates",
}


def _name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
  return MODULES[name].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
  """The absolute module a ``from ... import`` reads from."""
  if not node.level:
    return node.module or ""
  base = module.split(".")
  if not _is_package(module):
    base.pop()
  base = base[: len(base) - (node.level - 1)]
  return ".".join(base + ([node.module] if node.module else []))


def _target(name: str) -> Optional[str]:
  """The module of ``stiefax`` that importing ``name`` runs last: ``name`` itself, or
  for an attribute path the longest prefix that is a module."""
  while name and name not in MODULES:
    name = name.rpartition(".")[0]
  return name or None


def imports(module: str) -> set[str]:
  """The modules of ``stiefax`` that ``module`` imports, anywhere in its source."""
  tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
  out: set[str] = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      source = _resolve(module, node)
      # ``from pkg import mod`` imports the module; ``from pkg import name`` the package.
      targets = [
        f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names
      ]
    else:
      continue
    out.update(t for t in map(_target, targets) if t is not None and t != module)
  return out


GRAPH = {m: imports(m) for m in MODULES}


def _cycle(graph: dict[str, set[str]]) -> Optional[list[str]]:
  done: set[str] = set()
  stack: list[str] = []

  def visit(m: str) -> Optional[list[str]]:
    if m in stack:
      return stack[stack.index(m) :] + [m]
    if m in done:
      return None
    stack.append(m)
    for n in sorted(graph[m]):
      found = visit(n)
      if found:
        return found
    stack.pop()
    done.add(m)
    return None

  for m in sorted(graph):
    found = visit(m)
    if found:
      return found
  return None


def test_the_graph_is_read():
  """The parser sees the forms it must: a relative-free absolute import, a module by
  ``from pkg import mod``, a package by name, and imports inside functions."""
  assert "stiefax.experiments.flags" in GRAPH["stiefax.experiments.cli"]
  assert "stiefax.experiments.grok.config" in GRAPH["stiefax.experiments.grok.command"]
  assert "stiefax" in GRAPH["stiefax.experiments.grok.training"]  # import stiefax
  assert _resolve("stiefax.experiments.grok.runs", ast.ImportFrom("config", [], 1)) == (
    "stiefax.experiments.grok.config"
  )
  assert _resolve("stiefax.experiments.grok", ast.ImportFrom(None, [], 2)) == "stiefax.experiments"


def test_no_import_cycle():
  cycle = _cycle(GRAPH)
  assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_is_found():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


def _public(target: str) -> bool:
  """Whether ``target`` is the library's face: ``stiefax`` or a documented submodule."""
  parts = target.split(".")
  return parts == ["stiefax"] or (
    parts[1] in DOCUMENTED and not any(p.startswith("_") for p in parts)
  )


EXPERIMENTS = sorted(m for m in MODULES if m.startswith("stiefax.experiments"))


@pytest.mark.parametrize("module", EXPERIMENTS)
def test_the_experiments_use_only_the_public_library(module):
  library = {t for t in GRAPH[module] if not t.startswith("stiefax.experiments")}
  private = sorted(t for t in library if not _public(t))
  assert not private, (
    f"{module} imports {private}; the experiments use stiefax through `import stiefax` and"
    f" its documented submodules ({', '.join(sorted(DOCUMENTED))}) only"
  )


def test_the_public_test_knows_the_private():
  assert not _public("stiefax._routing") and not _public("stiefax.alias")
  assert not _public("stiefax.certificates._bounds")
  assert _public("stiefax") and _public("stiefax.geometry") and _public("stiefax.certificates")


def test_nothing_imports_the_entry_point():
  """``stiefax.experiments.cli`` is on top: it imports the commands' errors and the
  commands (lazily, by name); no module imports it."""
  users = sorted(m for m, targets in GRAPH.items() if "stiefax.experiments.cli" in targets)
  assert not users, f"{users} import stiefax.experiments.cli; import stiefax.experiments.flags"
