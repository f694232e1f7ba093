"""Tables and plots from results directories: ``stiefax report DIR [DIR ...]``.

Reads every ``*.json`` run under each DIR (recursively, in the order given), groups the
runs by their ``"experiment"`` field and hands each group to the experiment's report,
``stiefax.experiments.<experiment>.tables.report(runs, out_dir) -> str``
(:mod:`stiefax.experiments.protocol`), which returns the table text (printed here) and
writes PNG plots into ``--plots`` (default: the first DIR).
JSON files without an ``"experiment"`` field are not runs and are skipped (one whose
``"experiment"`` is not a string, with a warning). A run file
that cannot be read, or lacks a field its report needs, is skipped with a one-line
warning that names it; two files holding the same run (same configuration and seed)
count once: the first one found is reported, and the reruns table at the end says how
far apart the copies ended (a report that takes ``again=`` also receives the second
copies, e.g. for what only the later copy recorded). Each experiment's ``runs`` module
says what a run lacks (``check_run(run) -> str | None``) and what makes two files the
same run (``run_key(run)``).

Examples:
  stiefax report runs/grok
  stiefax report runs --plots figures
  stiefax report results/patches results/checks/patches-rerun
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import math
import pathlib
import sys
from typing import Any
from typing import Iterable
from typing import Mapping
from typing import Optional
from typing import Sequence

from stiefax.experiments import protocol
from stiefax.experiments import stats
from stiefax.experiments import store
from stiefax.experiments.flags import CommandError
from stiefax.experiments.flags import writable_dir

# Optional: without matplotlib the reports print their tables and write no plots. It is
# imported by pyplot(), when a plot is drawn, so that --help does not load it.
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

__all__ = [
  # the command
  "add_arguments",
  "run",
  "load_runs",
  "rerun_table",
  # the pieces the experiments' reports share
  "num",
  "table",
  "arm_order",
  "by_seed",
  "paired_by_seed",
  "paired_cells",
  "PAIRED_HEADER",
  "pyplot",
  "file_name",
  "save_figure",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.description = __doc__
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  parser.add_argument(
    "dir",
    nargs="+",
    metavar="DIR",
    help="directories of JSON runs (searched recursively; where a run is found twice,"
    " the copy in the earlier DIR is the one reported)",
  )
  parser.add_argument(
    "--plots", default=None, help="directory for the PNG plots (default: the first DIR)"
  )


def _problem(run: dict, experiment: str) -> Optional[str]:
  """What keeps ``run`` from being reported (``None`` if nothing, or no report for it):
  :func:`stiefax.experiments.protocol.record_problem`, the one check of a run file."""
  if experiment not in protocol.EXPERIMENTS:
    return None
  return protocol.record_problem(run, experiment)


def _key(run: dict, experiment: str) -> Any:
  """What makes two files the same run: the experiment's ``run_key``."""
  if experiment not in protocol.EXPERIMENTS:
    return store.digest(run)  # no report for it: only identical files are one run
  return protocol.piece(experiment, "run key")(run)


def load_runs(
  directory: pathlib.Path | Sequence[pathlib.Path], reruns: Optional[list] = None
) -> tuple[dict, list[str]]:
  """``({experiment: [run, ...]}, [warning, ...])`` for the JSON runs under ``directory``
  (one directory, or several searched in order).

  Runs that cannot be reported are left out with a warning. A second copy of a run (the
  same configuration and seed, e.g. trained again on a later commit) is left out too:
  with a warning, or, when ``reruns`` is a list, appended to it as
  ``(first run, second copy, path of the copy)``.
  """
  groups: dict = {}
  seen: dict = {}
  warnings = []
  dirs = [directory] if isinstance(directory, (str, pathlib.Path)) else list(directory)
  paths = [path for d in dirs for path in sorted(pathlib.Path(d).rglob("*.json"))]
  for path in paths:
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
    try:
      problem = _problem(run, experiment)
      key = None if problem else (experiment, _key(run, experiment))
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


def _reporter(experiment: str) -> Any:
  """The ``report`` of ``experiment`` (:mod:`stiefax.experiments.protocol`), or None."""
  return protocol.piece(experiment, "report") if experiment in protocol.EXPERIMENTS else None


def _directories(given: Sequence[str]) -> list[pathlib.Path]:
  dirs = []
  for d in given:
    if not str(d).strip():
      raise CommandError("DIR is empty; give a directory of JSON runs.")
    directory = pathlib.Path(d)
    if directory.exists() and not directory.is_dir():
      raise CommandError(f"{d}: is a file, not a directory; give the directory of JSON runs.")
    if not directory.is_dir():
      raise CommandError(f"{d}: no such directory; give a directory of JSON runs.")
    dirs.append(directory)
  return dirs


def _takes_again(fn: Any) -> bool:
  try:
    return "again" in inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return False


def run(args: argparse.Namespace) -> int:
  given = [args.dir] if isinstance(args.dir, str) else list(args.dir)
  dirs = _directories(given)
  out_dir = pathlib.Path(args.plots) if args.plots is not None else dirs[0]
  reruns: list = []
  groups, warnings = load_runs(dirs, reruns)
  for w in warnings:
    print(f"stiefax report: warning: {w}", file=sys.stderr)
  if not groups:
    raise CommandError(
      f"{', '.join(given)}: no runs found (no *.json file with a string \"experiment\" field)."
    )
  writable_dir(out_dir, "plots:")
  sections = []
  for experiment in sorted(groups):
    runs = groups[experiment]
    fn = _reporter(experiment)
    if fn is None:
      sections.append(f"{experiment}: {len(runs)} run(s); no report for this experiment.")
      continue
    if _takes_again(fn):
      again = [copy for _, copy, _ in reruns if copy.get("experiment") == experiment]
      sections.append(fn(runs, out_dir, again=again))
    else:
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


# ----------------------------------------------------------------------------
# Pieces shared by the experiments' reports: plain text tables (:func:`table`), the
# order arms are listed in (:func:`arm_order`), paired differences between two arms on
# the seeds they share (:func:`paired_by_seed`, :func:`paired_cells`), and matplotlib
# on the ``Agg`` back end (:func:`pyplot`, :func:`save_figure`).
# ----------------------------------------------------------------------------


def num(x: Optional[float], fmt: str) -> str:
  """``x`` formatted with ``fmt``; ``"-"`` for None, nan or inf."""
  return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  """Left-aligned columns two spaces apart, a rule of dashes under the header."""
  widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

  def fmt(row: Sequence[str]) -> str:
    return "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()

  return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def arm_order(names: Iterable[str], offered: Iterable[str]) -> list[str]:
  """``names`` in the order of ``offered``, then unknown names alphabetically.

  A label ``"<arm> <knob>"`` (e.g. ``"B2 lr=0.3"``) sorts with its arm.
  """
  known = list(offered)

  def key(name: str) -> tuple:
    base = name.split(" ")[0]
    return (known.index(base) if base in known else len(known), name)

  return sorted(names, key=key)


def by_seed(runs: Sequence[dict], metric: str) -> dict:
  """``{seed: metrics[metric]}`` over ``runs``, leaving out runs without the metric."""
  return {r["seed"]: r["metrics"].get(metric) for r in runs if r["metrics"].get(metric) is not None}


def paired_by_seed(
  base: Mapping[Any, float], other: Mapping[Any, float], scale: float = 1.0, min_seeds: int = 1
) -> Optional[stats.Paired]:
  """:func:`stiefax.experiments.stats.paired` of ``other - base`` on their shared seeds.

  ``None`` when they share fewer than ``min_seeds`` seeds. Values are multiplied by
  ``scale`` first (100: fractions to percentage points).
  """
  common = sorted(set(base) & set(other))
  if len(common) < max(1, min_seeds):
    return None
  return stats.paired([scale * base[s] for s in common], [scale * other[s] for s in common])


#: The columns of :func:`paired_cells`, after the difference's own header.
PAIRED_HEADER = ("t", "p", "wins", "t 95% CI", "boot 95% CI", "verdict")


def paired_cells(p: Optional[stats.Paired]) -> list[str]:
  """``[mean, t, p, wins/n, t CI, bootstrap CI, verdict]`` of a paired difference.

  The verdict is the statistical standard's (:func:`stiefax.experiments.stats.verdict`):
  ``higher``/``lower`` (b than a), ``no difference`` or ``not settled``. Seven dashes
  for None.
  """
  if p is None:
    return ["-"] * 7
  return [
    f"{p.mean:+.2f}",
    num(p.t, ".2f"),
    num(p.p, ".2g"),
    f"{p.wins}/{p.n}",
    "-" if not math.isfinite(p.t_low) else f"[{p.t_low:+.2f}, {p.t_high:+.2f}]",
    f"[{p.ci_low:+.2f}, {p.ci_high:+.2f}]",
    {"b > a": "higher", "b < a": "lower"}.get(p.verdict, p.verdict),
  ]


def pyplot() -> Any:
  """``matplotlib.pyplot`` on the ``Agg`` back end, or None without matplotlib."""
  if not HAVE_MATPLOTLIB:
    return None
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot

  return matplotlib.pyplot


def file_name(name: str) -> str:
  """``name`` as one file name inside a folder: every character but letters, digits,
  ``.``, ``_``, ``-`` and ``=`` becomes ``_`` (a separator among them), and a leading
  ``.`` too, so a name built from a run file's fields (``../../x``) never leaves its
  folder nor hides in it."""
  safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-=") else "_" for c in name)
  return "_" + safe[1:] if safe.startswith(".") or not safe else safe


def save_figure(fig: Any, plt: Any, out_dir: pathlib.Path, name: str) -> Optional[str]:
  """Writes ``fig`` to ``out_dir / file_name(name)`` (110 dpi) and closes it; None if
  it cannot.

  The name is made one file name inside ``out_dir`` (:func:`file_name`), whatever a run
  file says. The PNG is written atomically
  (:func:`stiefax.experiments.store.atomic_write`): a symbolic link at that path is
  replaced, its target never written.
  """
  try:
    path = pathlib.Path(out_dir) / file_name(name)
    store.atomic_write(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    return str(path)
  except OSError:
    return None
  finally:
    plt.close(fig)
