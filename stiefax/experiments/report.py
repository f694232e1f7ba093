"""Tables and plots from a results directory: ``stiefax report DIR``.

Reads every ``*.json`` run under DIR (recursively), groups the runs by their
``"experiment"`` field and hands each group to
``stiefax.experiments.<experiment>.report(runs, out_dir) -> str``, which returns the
table text (printed here) and writes PNG plots into ``--plots`` (default: DIR).
JSON files without an ``"experiment"`` field are not runs and are skipped.

Examples:
  stiefax report runs/grok
  stiefax report runs --plots figures
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import sys

from stiefax.experiments.cli import CommandError, writable_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.description = __doc__
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  parser.add_argument("dir", help="directory of JSON runs (searched recursively)")
  parser.add_argument("--plots", default=None,
                      help="directory for the PNG plots (default: DIR)")


def load_runs(directory: pathlib.Path) -> tuple[dict, list[str]]:
  """``({experiment: [run, ...]}, [warning, ...])`` for the JSON runs under ``directory``."""
  groups: dict = {}
  warnings = []
  for path in sorted(directory.rglob("*.json")):
    try:
      run = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
      warnings.append(f"skipped {path}: not readable JSON ({e})")
      continue
    if not isinstance(run, dict) or "experiment" not in run:
      continue
    groups.setdefault(str(run["experiment"]), []).append(run)
  return groups, warnings


def _reporter(experiment: str):
  """The ``report`` function of ``stiefax.experiments.<experiment>``, or None."""
  if not experiment.isidentifier() or experiment in ("cli", "report", "stats"):
    return None
  try:
    module = importlib.import_module(f"stiefax.experiments.{experiment}")
  except ModuleNotFoundError as e:
    if e.name == f"stiefax.experiments.{experiment}":
      return None
    raise
  fn = getattr(module, "report", None)
  return fn if callable(fn) else None


def run(args: argparse.Namespace) -> int:
  directory = pathlib.Path(args.dir)
  if not directory.is_dir():
    raise CommandError(f"{args.dir}: no such directory; give a directory of JSON runs.")
  out_dir = pathlib.Path(args.plots) if args.plots is not None else directory
  groups, warnings = load_runs(directory)
  for w in warnings:
    print(f"stiefax report: warning: {w}", file=sys.stderr)
  if not groups:
    raise CommandError(
        f"{args.dir}: no runs found (no *.json file with an \"experiment\" field).")
  writable_dir(out_dir, "plots:")
  sections = []
  for experiment in sorted(groups):
    runs = groups[experiment]
    fn = _reporter(experiment)
    if fn is None:
      sections.append(f"{experiment}: {len(runs)} run(s); no report for this experiment.")
      continue
    sections.append(fn(runs, out_dir))
  print("\n\n".join(sections))
  return 0
