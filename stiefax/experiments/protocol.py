"""What an experiment command is: the same piece, in the same module, in every package.

``stiefax grok``, ``stiefax lm`` and ``stiefax patches`` are each a package
``stiefax.experiments.<name>`` whose modules hold the same pieces under the same
names, as every Optax optimizer is an ``init``/``update`` pair:

============== ============ ================== =============================================
piece          module       name               signature: what it is
============== ============ ================== =============================================
parser         ``command``  ``add_arguments``  ``(parser) -> None``: the command's flags; the
                                               module docstring is its ``--help`` text
run            ``command``  ``run``            ``(args) -> int``: builds the runs ``args``
                                               ask for as jobs, hands them to the run loop
                                               (:func:`stiefax.experiments.jobs.run_jobs`),
                                               prints their summary; exit status
report         ``tables``   ``report``         ``(runs, out_dir) -> str``: the tables of
                                               ``stiefax report``, and its plots in
                                               ``out_dir``
run key        ``runs``     ``run_key``        ``(run) -> tuple``: two files with one key
                                               hold the same run (configuration and seed)
run check      ``runs``     ``check_run``      ``(run) -> str | None``: what a run file
                                               lacks for the report
arm definition ``runs``     ``arm_definition`` ``(arm) -> dict``: how a run records its arm
                                               (part of its identity and file name)
programs       ``training`` ``programs``       ``(config, arm) -> programs``: the jitted
                                               programs of a model and arm, built once
                                               (the same object again) and shared by seeds
init           ``training`` ``init_params``    ``(config, arm, seed) -> variables``: an
                                               arm's starting point at a seed, the model's
                                               variables (``{"params": ...}``)
arms           ``config``   ``ARMS``           ``{name: Arm}``: the arms offered (a
                                               selection of
                                               :data:`stiefax.experiments.arms.ARMS`)
presets        ``config``   ``PRESETS``        ``{name: settings}``: the named settings
                                               a run starts from
============== ============ ================== =============================================

Each function's signature is written once, as a :class:`typing.Protocol` here
(:data:`PIECES`: :class:`Parser`, :class:`Run`, ...), and every package's function
takes the protocol's parameters first, by the same names (more only with defaults).
``config`` is the package's model configuration: ``GrokConfig``, ``LMConfig``, and
patches' ``ModelConfig`` (a ``Setting`` with the data's token count and classes).
Besides these a package holds ``data`` and ``model``, and may hold modules of its own
(``grok.collapses``, ``lm.fair``, ``patches.protocols``, ...). The package's
``__init__`` holds only its docstring: every name is defined and exported in one
module.

``stiefax report`` finds an experiment's report, run key and run check through this
table (:func:`piece`); ``stiefax <name>`` imports ``<name>.command`` only when it runs.

A run file is checked in one place, wherever it is read (a command's ``--out``,
``--reuse`` or ``--cells-from``, ``stiefax report``): :func:`record_problem` checks the
fields every run has by type (``"experiment"``, ``"arm"``, an integer ``"seed"`` in
``[0, 2^32)``, ``"config"`` and ``"metrics"`` objects), then the experiment's run check,
which checks by type every field its commands and report read (:func:`number_problem`,
:func:`list_problem`), then that its run key can be computed.
``tests/test_commands.py`` crosses every package with every piece, and calls each
piece of each package at a toy size.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
import pathlib
from typing import Any
from typing import Mapping
from typing import NamedTuple
from typing import Optional
from typing import Protocol

from stiefax.experiments.arms import Arm

__all__ = [
  "EXPERIMENTS",
  "Piece",
  "PIECES",
  "Parser",
  "Run",
  "Report",
  "RunKey",
  "RunCheck",
  "ArmDefinition",
  "Programs",
  "Init",
  "piece",
  "record_problem",
  "number_problem",
  "list_problem",
  "history_problem",
]

#: The experiment commands: ``stiefax <name>`` is the package ``stiefax.experiments.<name>``,
#: and its runs are the files whose ``"experiment"`` is ``<name>``.
EXPERIMENTS = ("grok", "patches", "lm")


class Parser(Protocol):
  """``add_arguments``: adds the command's flags to ``parser``."""

  def __call__(self, parser: argparse.ArgumentParser) -> None: ...


class Run(Protocol):
  """``run``: trains the runs ``args`` ask for (through the run loop); exit status."""

  def __call__(self, args: argparse.Namespace) -> int: ...


class Report(Protocol):
  """``report``: the tables of ``runs``, and the plots written in ``out_dir``."""

  def __call__(self, runs: list[dict], out_dir: Optional[pathlib.Path]) -> str: ...


class RunKey(Protocol):
  """``run_key``: equal for two files of one run (configuration and seed)."""

  def __call__(self, run: dict) -> tuple: ...


class RunCheck(Protocol):
  """``check_run``: what a run file lacks for the report (None: nothing)."""

  def __call__(self, run: dict) -> Optional[str]: ...


class ArmDefinition(Protocol):
  """``arm_definition``: how a run records its arm."""

  def __call__(self, arm: Arm) -> dict: ...


class Programs(Protocol):
  """``programs``: the jitted programs of a model configuration and arm, built once."""

  def __call__(self, config: Any, arm: Arm) -> Any: ...


class Init(Protocol):
  """``init_params``: the model's variables (``{"params": ...}``) of ``arm`` at ``seed``."""

  def __call__(self, config: Any, arm: Arm, seed: int) -> Any: ...


class Piece(NamedTuple):
  """Where a piece of a command lives: ``stiefax.experiments.<experiment>.<module>.<name>``,
  and what it is: a :class:`typing.Protocol` of its signature, or a table's type."""

  module: str
  name: str
  kind: Any

  @property
  def parameters(self) -> Optional[tuple[str, ...]]:
    """The parameters every package's function takes first; None for a table."""
    if self.kind is Mapping:
      return None
    return tuple(inspect.signature(self.kind.__call__).parameters)[1:]  # less ``self``


#: The pieces of a command, by the names of the module docstring's table.
PIECES: dict[str, Piece] = {
  "parser": Piece("command", "add_arguments", Parser),
  "run": Piece("command", "run", Run),
  "report": Piece("tables", "report", Report),
  "run key": Piece("runs", "run_key", RunKey),
  "run check": Piece("runs", "check_run", RunCheck),
  "arm definition": Piece("runs", "arm_definition", ArmDefinition),
  "programs": Piece("training", "programs", Programs),
  "init": Piece("training", "init_params", Init),
  "arms": Piece("config", "ARMS", Mapping),
  "presets": Piece("config", "PRESETS", Mapping),
}


def piece(experiment: str, name: str) -> Any:
  """The piece ``name`` (a key of :data:`PIECES`) of ``experiment``, imported.

  Raises:
    KeyError: for an experiment not in :data:`EXPERIMENTS` or a piece not in
      :data:`PIECES`.
  """
  if experiment not in EXPERIMENTS:
    raise KeyError(f"{experiment!r} is not an experiment; they are {', '.join(EXPERIMENTS)}.")
  where = PIECES[name]
  module = importlib.import_module(f"stiefax.experiments.{experiment}.{where.module}")
  return getattr(module, where.name)


#: Seeds are 32-bit unsigned integers (``jax.random.key`` and NumPy take them).
_SEED_END = 2**32

_COMMON = {"arm": str, "config": dict, "metrics": dict}


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def number_problem(
  mapping: dict,
  key: str,
  where: str,
  *,
  finite: bool = False,
  positive: bool = False,
  integer: bool = False,
  none: bool = False,
  optional: bool = False,
) -> Optional[str]:
  """Why ``mapping[key]`` is not the number a reader needs (``None`` if it is).

  A number is an ``int`` or ``float``, never a ``bool``; ``integer`` asks for an
  ``int``, ``finite`` for neither NaN nor infinity, ``positive`` for ``> 0``; ``none``
  lets the value be ``None`` and ``optional`` lets the key be absent. ``where`` names the
  object in the reason (``"its metrics"``).
  """
  if key not in mapping:
    return None if optional else f"{where} lack {key!r}"
  value = mapping[key]
  if value is None and none:
    return None
  if not _is_number(value) or (integer and not isinstance(value, int)):
    kind = "an integer" if integer else "a number"
    return f"{where} hold {key!r} = {_short(value)}, not {kind}"
  if (finite or positive) and not math.isfinite(value):
    return f"{where} hold {key!r} = {value}, not finite"
  if positive and not value > 0:
    return f"{where} hold {key!r} = {value}, not > 0"
  return None


def list_problem(
  mapping: dict, keys: Any, where: str, *, numbers: Any = (), length: Optional[int] = None
) -> Optional[str]:
  """Why the lists ``mapping[k]`` for ``k`` in ``keys`` are not what a reader needs.

  Each must be a non-empty list, all of one length (``length`` if given); those named
  in ``numbers`` must hold numbers or ``None`` only.
  """
  for key in keys:
    value = mapping.get(key)
    if not isinstance(value, list) or not value:
      return f"{where} lack the non-empty list {key!r}"
    if length is None:
      length = len(value)
    elif len(value) != length:
      return f"{where} differ in length ({key!r} has {len(value)}, not {length})"
    if key in numbers and not all(v is None or _is_number(v) for v in value):
      return f"{where} hold {key!r} with a value that is not a number"
  return None


def history_problem(run: dict, numbers: Any) -> Optional[str]:
  """Why ``run["history"]`` is not what a reader needs: an object whose lists
  ``numbers`` hold numbers (:func:`list_problem`); None if it is."""
  history = run.get("history")
  if not isinstance(history, dict):
    return "lacks the field 'history'"
  return list_problem(history, numbers, "its histories", numbers=numbers)


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 40 else text[:37] + "..."


def record_problem(run: Any, experiment: Optional[str] = None) -> Optional[str]:
  """Why ``run`` is not a usable run file (``None`` if it is): the one check of a record.

  ``run`` must be an object whose ``"experiment"`` is ``experiment`` (any of
  :data:`EXPERIMENTS` when None), with a string ``"arm"``, an integer ``"seed"`` in
  ``[0, 2^32)`` (``0.0`` is not one), ``"config"`` and ``"metrics"`` objects, pass its
  experiment's run check (every field its commands and report read, by type) and have
  a run key. The reason is one line, for ``skipped <file>: <reason>``.
  """
  if not isinstance(run, dict):
    return f"it holds a JSON {type(run).__name__}, not a run object"
  name = run.get("experiment")
  if not isinstance(name, str) or name not in EXPERIMENTS:
    return f"its field 'experiment' is {_short(name)}, not one of {', '.join(EXPERIMENTS)}"
  if experiment is not None and name != experiment:
    return f"it is a run of {name}, not of {experiment}"
  for key, kind in _COMMON.items():
    if key not in run:
      return f"lacks the field {key!r}"
    if not isinstance(run[key], kind):
      return f"its field {key!r} is {_short(run[key])}, not a {kind.__name__}"
  seed = run.get("seed")
  if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < _SEED_END:
    return f"its field 'seed' is {_short(seed)}, not an integer in [0, 2^32)"
  try:
    problem = piece(name, "run check")(run)
    if problem is None:
      piece(name, "run key")(run)
  except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
    return f"unusable run ({type(e).__name__}: {_short(str(e))})"
  return problem
