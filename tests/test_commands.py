"""Every experiment command against the protocol (:mod:`stiefax.experiments.protocol`).

As Optax's common test crosses every optimizer with one list of properties, this file
crosses every experiment package with every piece of a command: each package holds each
piece in the agreed module, under the agreed name, with the agreed leading parameters,
and exports it from there only; then every piece of every package is called at a toy
size and its result checked by type (the commands' runs, which train, are slow tests).
"""

import argparse
import ast
from collections.abc import Mapping
import dataclasses
import importlib
import inspect
import json
import pathlib

import jax
import pytest

from stiefax.experiments import arms as arms_lib
from stiefax.experiments import cli
from stiefax.experiments import protocol
from tests import harness

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
    p
    for p in inspect.signature(value).parameters.values()
    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
  ]
  names = [p.name for p in params]
  assert names[: len(where.parameters)] == list(where.parameters), (
    f"{module.__name__}.{where.name}{inspect.signature(value)}: the protocol's version"
    f" ({where.kind.__name__}) takes ({', '.join(where.parameters)}, ...) first"
  )
  required = [p.name for p in inspect.signature(value).parameters.values() if p.default is p.empty]
  assert required == list(where.parameters), (
    f"{module.__name__}.{where.name}{inspect.signature(value)}: parameters past the"
    f" protocol's ({', '.join(where.parameters)}) need defaults"
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


# ------------------------------------------------ every piece, called at a toy size


def _toy_config(experiment):
  """A model configuration of ``experiment`` that builds and initializes in a second."""
  if experiment == "grok":
    return harness.TINY_GROK
  if experiment == "lm":
    from stiefax.experiments.lm import config  # pylint: disable=g-import-not-at-top

    quick = config.PRESETS["quick"]
    return dataclasses.replace(quick, depth=1, d_model=32, mlp_dim=64, heads=2, kv_heads=1)
  from stiefax.experiments.patches import config  # pylint: disable=g-import-not-at-top
  from stiefax.experiments.patches import training  # pylint: disable=g-import-not-at-top

  setting = config.Setting(n_train=8, epochs=1, d=16, heads=4, head_dim=4, mlp_ratio=1)
  return training.ModelConfig(setting, 4, 10)


def _committed_run(experiment):
  """One committed run file of ``experiment`` (read, never written)."""
  folder = EXPERIMENTS.parents[1] / "results" / experiment
  path = next(
    p for p in sorted(folder.rglob("*.json")) if protocol.record_problem(_read(p)) is None
  )
  return _read(path)


def _read(path):
  return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))


@pytest.mark.parametrize("experiment", protocol.EXPERIMENTS)
def test_each_piece_called_returns_its_type(experiment, tmp_path):
  """Each piece of the protocol, called as :data:`protocol.PIECES` says, at a toy size."""
  piece = lambda name: protocol.piece(experiment, name)
  # arms, presets: tables by name; the arms are the registry's.
  arms = piece("arms")
  assert all(isinstance(a, arms_lib.Arm) and a is arms_lib.ARMS[n] for n, a in arms.items())
  assert piece("presets") and all(isinstance(n, str) for n in piece("presets"))
  # parser: the command's flags, with the run loop's in every command.
  parser = argparse.ArgumentParser()
  assert piece("parser")(parser) is None
  args = parser.parse_args([])
  assert (args.no_wait, args.no_progress, args.force) == (False, False, False)
  # arm definition: a JSON object, the same for the same arm.
  for arm in arms.values():
    definition = piece("arm definition")(arm)
    assert isinstance(definition, dict) and json.loads(json.dumps(definition)) == definition
  # programs: built once, the same object again; init: the model's variables, by seed.
  config, arm = _toy_config(experiment), arms["B2"]
  programs = piece("programs")(config, arm)
  assert programs is not None and piece("programs")(config, arm) is programs
  variables = piece("init")(config, arm, 0)
  assert isinstance(variables, dict) and "params" in variables
  leaves = jax.tree.leaves(variables)
  assert leaves and all(isinstance(x, jax.Array) for x in leaves)
  again, other = piece("init")(config, arm, 0), piece("init")(config, arm, 1)
  assert all((x == y).all() for x, y in zip(leaves, jax.tree.leaves(again)))
  assert any((x != y).any() for x, y in zip(leaves, jax.tree.leaves(other)))
  # run key, run check, report: on a committed run.
  run = _committed_run(experiment)
  assert piece("run check")(run) is None
  key = piece("run key")(run)
  assert isinstance(key, tuple) and hash(key) == hash(piece("run key")(json.loads(json.dumps(run))))
  text = piece("report")([run], tmp_path)
  assert isinstance(text, str) and text.strip()


def _toy_argv(experiment, out):
  if experiment == "grok":
    return ["--preset", "tiny", "--arms", "B2", "--seeds", "0", "--epochs", "20", "--out", out]
  if experiment == "lm":
    return ["--arms", "B2", "--steps", "2", "--eval-every", "1", "--batch", "2", "--out", out]
  return ["--arms", "B2", "--seeds", "0", "--epochs", "1", "--n-train", "64", "--no-cache"] + [
    *("--out", out)
  ]


@pytest.mark.slow
@pytest.mark.parametrize("experiment", protocol.EXPERIMENTS)
def test_each_run_piece_trains_through_the_run_loop(experiment, tmp_path, monkeypatch):
  """``run(args)``: an exit status; its run file passes the run check, and a second run
  reads it back (the run loop), with ``--force`` training it again beside the first."""
  from stiefax.experiments.grok import config as grok_config  # pylint: disable=g-import-not-at-top

  monkeypatch.setitem(
    grok_config.PRESETS, "tiny", dict(config=harness.TINY_GROK, arms=("B2",), seeds=(0,))
  )
  parser = argparse.ArgumentParser()
  protocol.piece(experiment, "parser")(parser)
  out = tmp_path / "runs"
  args = parser.parse_args([*_toy_argv(experiment, str(out)), "--no-progress"])
  assert protocol.piece(experiment, "run")(args) == 0
  (path,) = out.glob("*.json")
  assert protocol.record_problem(_read(path), experiment) is None
  before = path.stat().st_mtime_ns
  assert protocol.piece(experiment, "run")(args) == 0
  assert path.stat().st_mtime_ns == before  # read back, not trained again
  args.force = True
  assert protocol.piece(experiment, "run")(args) == 0
  assert len(list(out.glob(path.name + ".replaced-*"))) == 1
  assert not list(out.glob("*.lock")) and not list(out.glob("*.ckpt"))
