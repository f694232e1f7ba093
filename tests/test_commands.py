"""Every experiment command against the protocol (:mod:`stiefax.experiments.protocol`).

As Optax's common test crosses every optimizer with one list of properties, this file
crosses every experiment package with every piece of a command: each package holds each
piece in the agreed module, under the agreed name, with the agreed leading parameters,
and exports it from there only. Nothing is trained: the modules are imported and read.
"""

import ast
from collections.abc import Mapping
import importlib
import inspect
import pathlib

import pytest

from stiefax.experiments import cli
from stiefax.experiments import protocol

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "stiefax" / "experiments"
CROSS = [(e, p) for e in protocol.EXPERIMENTS for p in protocol.PIECES]


@pytest.mark.parametrize("experiment,name", CROSS, ids=[f"{e}-{p}" for e, p in CROSS])
def test_each_command_has_each_piece(experiment, name):
  where = protocol.PIECES[name]
  module = importlib.import_module(f"stiefax.experiments.{experiment}.{where.module}")
  value = getattr(module, where.name, None)
  assert value is not None, f"stiefax.experiments.{experiment}.{where.module} lacks {where.name}"
  assert protocol.piece(experiment, name) is value
  exported = getattr(module, "__all__", None)
  if exported is not None:
    assert where.name in exported, f"{module.__name__}.__all__ lacks {where.name}"
  if where.parameters is None:  # a table: non-empty, by name
    assert isinstance(value, Mapping) and value and all(isinstance(k, str) for k in value)
    return
  assert callable(value)
  assert value.__module__ == module.__name__, f"{where.name} is defined in {value.__module__}"
  params = [
    p.name
    for p in inspect.signature(value).parameters.values()
    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
  ]
  assert params[: len(where.parameters)] == list(where.parameters), (
    f"{module.__name__}.{where.name}{inspect.signature(value)}: the protocol's version"
    f" takes ({', '.join(where.parameters)}, ...) first"
  )


def test_the_protocol_table_is_its_docstring():
  """The docstring's table and :data:`PIECES` name the same pieces, modules and names."""
  doc = protocol.__doc__ or ""
  for name, where in protocol.PIECES.items():
    row = next((ln for ln in doc.splitlines() if ln.startswith(name + " ")), None)
    assert row is not None, f"the docstring's table lacks {name!r}"
    assert f"``{where.module}``" in row and f"``{where.name}``" in row, row


@pytest.mark.parametrize("experiment", protocol.EXPERIMENTS)
def test_the_command_runs_its_package_command_module(experiment):
  """``stiefax <experiment>`` imports the package's ``command`` module, whose docstring
  is the command's ``--help`` text; the package ``__init__`` holds only a docstring."""
  assert cli.COMMANDS[experiment][0] == f"stiefax.experiments.{experiment}.command"
  command = importlib.import_module(f"stiefax.experiments.{experiment}.command")
  assert command.__doc__ and f"stiefax {experiment}" in command.__doc__
  init = ast.parse((EXPERIMENTS / experiment / "__init__.py").read_text(encoding="utf-8"))
  assert len(init.body) == 1 and isinstance(init.body[0], ast.Expr), (
    f"stiefax/experiments/{experiment}/__init__.py holds more than its docstring"
  )


def test_the_experiments_are_the_packages():
  packages = sorted(p.parent.name for p in EXPERIMENTS.glob("*/__init__.py"))
  assert packages == sorted(protocol.EXPERIMENTS)


def _defined(tree):
  """Names a module's body binds by definition or assignment (not by import)."""
  out = set()
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      out.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      for t in targets:
        out.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
  return out


def _exported(tree):
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(
      isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    ):
      return ast.literal_eval(node.value)
  return []


@pytest.mark.parametrize(
  "path",
  sorted(EXPERIMENTS.rglob("*.py")),
  ids=lambda p: str(p.relative_to(EXPERIMENTS)),
)
def test_a_module_exports_only_what_it_defines(path):
  """No re-exports: a name is defined and exported in one place (two commands may each
  define the protocol's ``run``, each its own)."""
  tree = ast.parse(path.read_text(encoding="utf-8"))
  borrowed = sorted(set(_exported(tree)) - _defined(tree))
  assert not borrowed, f"{path.relative_to(EXPERIMENTS)} exports names it imports: {borrowed}"
