"""Tables and plots from a results directory: ``stiefax report DIR``.

Reads every ``*.json`` run under DIR (recursively), groups the runs by their
``"experiment"`` field and hands each group to
``stiefax.experiments.<experiment>.report(runs, out_dir) -> str``, which returns the
table text (printed here) and writes PNG plots into ``--plots`` (default: DIR).
JSON files without an ``"experiment"`` field are not runs and are skipped (one whose
``"experiment"`` is not a string, with a warning). A run file
that cannot be read, or lacks a field its report needs, is skipped with a one-line
warning that names it; two files holding the same run (same configuration and seed)
count once, with a warning. An experiment module may define ``check_run(run) -> str |
None`` (what is missing) and ``run_key(run)`` (what makes two files the same run).

Examples:
  stiefax report runs/grok
  stiefax report runs --plots figures
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
from typing import Optional

from stiefax.experiments.cli import CommandError
from stiefax.experiments.cli import writable_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.description = __doc__
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  parser.add_argument("dir", help="directory of JSON runs (searched recursively)")
  parser.add_argument("--plots", default=None, help="directory for the PNG plots (default: DIR)")


_RUN_FIELDS = {"arm": str, "seed": int, "config": dict, "metrics": dict}


def check_run(run: dict, module=None) -> str | None:
  """What keeps ``run`` from being reported (``None`` if nothing, or no report for it)."""
  if module is None:
    return None
  for key, kind in _RUN_FIELDS.items():
    if key not in run:
      return f"lacks the field {key!r}"
    if not isinstance(run[key], kind) or isinstance(run[key], bool):
      return f"its field {key!r} is not a {kind.__name__}"
  fn = getattr(module, "check_run", None)
  return fn(run) if callable(fn) else None


def run_key(run: dict, module=None):
  """What makes two files the same run: the module's ``run_key``, else arm, config, seed."""
  from stiefax.experiments import store  # pylint: disable=g-import-not-at-top

  if module is None:
    return store.digest(run)  # no report for it: only identical files are one run
  fn = getattr(module, "run_key", None)
  if callable(fn):
    return fn(run)
  return (run["arm"], store.digest(run["config"]), run["seed"])


def load_runs(directory: pathlib.Path, reruns: Optional[list] = None) -> tuple[dict, list[str]]:
  """``({experiment: [run, ...]}, [warning, ...])`` for the JSON runs under ``directory``.

  Runs that cannot be reported are left out with a warning. A second copy of a run (the
  same configuration and seed, e.g. trained again on a later commit) is left out too:
  with a warning, or, when ``reruns`` is a list, appended to it as
  ``(first run, second copy, path of the copy)``.
  """
  from stiefax.experiments import store  # pylint: disable=g-import-not-at-top

  groups: dict = {}
  seen: dict = {}
  warnings = []
  for path in sorted(directory.rglob("*.json")):
    run, problem = store.read_json(path)
    if problem is not None:
      warnings.append(f"skipped {path}: not readable JSON ({problem})")
      continue
    if not isinstance(run, dict) or "experiment" not in run:
      continue
    if not isinstance(run["experiment"], str):
      warnings.append(
        f"skipped {path}: its field 'experiment' is {run['experiment']!r}, not a string"
      )
      continue
    experiment = run["experiment"]
    module = _module(experiment)
    try:
      problem = check_run(run, module)
      key = None if problem else (experiment, run_key(run, module))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
      problem, key = f"unusable run ({type(e).__name__}: {e})", None
    if problem:
      warnings.append(f"skipped {path}: {problem}")
      continue
    if key in seen:
      if reruns is not None:
        reruns.append((seen[key][1], run, path))
      else:
        warnings.append(f"skipped {path}: the same run (configuration and seed) as {seen[key][0]}")
      continue
    seen[key] = (path, run)
    groups.setdefault(experiment, []).append(run)
  return groups, warnings


# Modules of the package that are not experiments (they have no runs to report).
_NOT_EXPERIMENTS = (
  "arms",
  "cli",
  "optim",
  "patch_data",
  "patch_images",
  "report",
  "reporting",
  "stats",
  "store",
)


def _module(experiment: str):
  """The module ``stiefax.experiments.<experiment>``, or None."""
  if not experiment.isidentifier() or experiment in _NOT_EXPERIMENTS:
    return None
  try:
    return importlib.import_module(f"stiefax.experiments.{experiment}")
  except ModuleNotFoundError as e:
    if e.name == f"stiefax.experiments.{experiment}":
      return None
    raise


def _reporter(experiment: str):
  """The ``report`` function of ``stiefax.experiments.<experiment>``, or None."""
  fn = getattr(_module(experiment), "report", None)
  return fn if callable(fn) else None


def run(args: argparse.Namespace) -> int:
  if not str(args.dir).strip():
    raise CommandError("DIR is empty; give a directory of JSON runs.")
  directory = pathlib.Path(args.dir)
  if directory.exists() and not directory.is_dir():
    raise CommandError(f"{args.dir}: is a file, not a directory; give the directory of JSON runs.")
  if not directory.is_dir():
    raise CommandError(f"{args.dir}: no such directory; give a directory of JSON runs.")
  out_dir = pathlib.Path(args.plots) if args.plots is not None else directory
  reruns: list = []
  groups, warnings = load_runs(directory, reruns)
  for w in warnings:
    print(f"stiefax report: warning: {w}", file=sys.stderr)
  if not groups:
    raise CommandError(
      f"{args.dir}: no runs found (no *.json file with a string \"experiment\" field)."
    )
  writable_dir(out_dir, "plots:")
  sections = []
  for experiment in sorted(groups):
    runs = groups[experiment]
    fn = _reporter(experiment)
    if fn is None:
      sections.append(f"{experiment}: {len(runs)} run(s); no report for this experiment.")
      continue
    sections.append(fn(runs, out_dir))
  if reruns:
    sections.append(rerun_table(reruns))
  print("\n\n".join(sections))
  return 0


#: The headline metric of a run, for :func:`rerun_table`: (metric, scale, unit).
_HEADLINES = (
  ("test_acc", 100.0, "pp"),
  ("tail_test_acc", 100.0, "pp"),
  ("test_bpb", 1.0, "bits/byte"),
)


def rerun_table(reruns: list) -> str:
  """The runs found twice (same configuration and seed) and how far apart they ended.

  Two trainings of one configuration differ only by floating-point rounding (another
  commit's compiled program, another XLA thread count or machine): this is the noise a
  run trained on a later commit adds when it is paired with an earlier one.
  """
  from stiefax.experiments.reporting import table  # pylint: disable=g-import-not-at-top

  rows, diffs = [], []
  for first, again, path in reruns:
    for metric, scale, unit in _HEADLINES:
      a, b = first["metrics"].get(metric), again["metrics"].get(metric)
      if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        d = scale * (b - a)
        diffs.append(abs(d))
        commits = [str((r.get("code") or {}).get("commit") or "?")[:7] for r in (first, again)]
        rows.append(
          [
            str(first.get("experiment")),
            str(first["arm"]),
            str(first["seed"]),
            f"{metric} ({unit})",
            f"{scale * a:.4g}",
            f"{scale * b:.4g}",
            f"{d:+.3g}",
            " -> ".join(commits),
            path.name,
          ]
        )
        break
  if not rows:
    return f"reruns: {len(reruns)} second copies, no common headline metric"
  return "\n".join(
    [
      "reruns: runs found twice (same configuration and seed); the difference is rounding",
      table(
        ["experiment", "arm", "seed", "metric", "first", "again", "Δ", "commits", "file"],
        rows,
      ),
      f"  largest |Δ| {max(diffs):.3g}, mean |Δ| {sum(diffs) / len(diffs):.3g} over"
      f" {len(diffs)} rerun(s)",
    ]
  )
