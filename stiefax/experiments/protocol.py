"""What an experiment command is: the same piece, in the same module, in every package.

``stiefax grok``, ``stiefax lm`` and ``stiefax patches`` are each a package
``stiefax.experiments.<name>`` whose modules hold the same pieces under the same
names, as every Optax optimizer is an ``init``/``update`` pair:

============== ============ ================== =============================================
piece          module       name               what it is
============== ============ ================== =============================================
parser         ``command``  ``add_arguments``  ``(parser) -> None``: the command's flags; the
                                               module docstring is its ``--help`` text
run            ``command``  ``run``            ``(args) -> int``: trains the runs ``args``
                                               ask for, prints their summary; exit status
report         ``tables``   ``report``         ``(runs, out_dir) -> str``: the tables of
                                               ``stiefax report``, and its plots in
                                               ``out_dir``
run key        ``runs``     ``run_key``        ``(run) -> tuple``: two files with one key
                                               hold the same run (configuration and seed)
run check      ``runs``     ``check_run``      ``(run) -> str | None``: what a run file
                                               lacks for the report
arm definition ``runs``     ``arm_definition`` ``(arm) -> dict``: how a run records its arm
                                               (part of its identity and file name)
programs       ``training`` ``programs``       the jitted programs of a model and arm,
                                               built once and shared by the seeds
init           ``training`` ``init_params``    an arm's starting point at a seed
arms           ``config``   ``ARMS``           the arms offered (a selection of
                                               :data:`stiefax.experiments.arms.ARMS`)
presets        ``config``   ``PRESETS``        ``{name: settings}``: the named settings
                                               a run starts from
============== ============ ================== =============================================

The parameters the first column's signatures name are the same in every package
(:data:`PIECES`); ``programs`` and ``init_params`` take what their model needs (a
configuration, an arm or its attention variant, a seed) and differ between packages.
Besides these a package holds ``data`` and ``model``, and may hold modules of its own
(``grok.collapses``, ``lm.fair``, ``patches.protocols``, ...). The package's
``__init__`` holds only its docstring: every name is defined and exported in one
module.

``stiefax report`` finds an experiment's report, run key and run check through this
table (:func:`piece`); ``stiefax <name>`` imports ``<name>.command`` only when it runs.
``tests/test_commands.py`` crosses every package with every piece.
"""

from __future__ import annotations

import importlib
from typing import Any
from typing import NamedTuple
from typing import Optional

__all__ = ["EXPERIMENTS", "Piece", "PIECES", "piece"]

#: The experiment commands: ``stiefax <name>`` is the package ``stiefax.experiments.<name>``,
#: and its runs are the files whose ``"experiment"`` is ``<name>``.
EXPERIMENTS = ("grok", "patches", "lm")


class Piece(NamedTuple):
  """Where a piece of a command lives: ``stiefax.experiments.<experiment>.<module>.<name>``."""

  module: str
  name: str
  #: The leading parameters every package's function takes; None for a value (a table).
  parameters: Optional[tuple[str, ...]]


#: The pieces of a command, by the names of the module docstring's table.
PIECES: dict[str, Piece] = {
  "parser": Piece("command", "add_arguments", ("parser",)),
  "run": Piece("command", "run", ("args",)),
  "report": Piece("tables", "report", ("runs", "out_dir")),
  "run key": Piece("runs", "run_key", ("run",)),
  "run check": Piece("runs", "check_run", ("run",)),
  "arm definition": Piece("runs", "arm_definition", ("arm",)),
  "programs": Piece("training", "programs", ()),
  "init": Piece("training", "init_params", ()),
  "arms": Piece("config", "ARMS", None),
  "presets": Piece("config", "PRESETS", None),
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
