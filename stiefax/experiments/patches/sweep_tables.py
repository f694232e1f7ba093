"""The tables of the ``sweep-n``, ``sweep-eps`` and ``select-lr`` protocols of
``stiefax patches`` runs (part of :func:`stiefax.experiments.patches.tables.report`).

``sweep-n``: a row per n (ddof=0, as the paper's Table 3). ``sweep-eps``: a row per
eps, paired against the smallest eps. ``select-lr``: validation accuracy per rate.
"""

from __future__ import annotations

import math
import pathlib
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import report as report_lib
from stiefax.experiments import stats
from stiefax.experiments.patches.config import Setting
from stiefax.experiments.patches.groups import arm_order as _arm_order
from stiefax.experiments.patches.groups import by_seed as _by_seed
from stiefax.experiments.patches.groups import group_key as _group_key
from stiefax.experiments.patches.groups import paired_row as _paired_row
from stiefax.experiments.patches.groups import title as _title
from stiefax.experiments.patches.runs import knob_of
from stiefax.experiments.report import PAIRED_HEADER
from stiefax.experiments.report import paired_cells as _paired_cells
from stiefax.experiments.report import table as _table

__all__ = ["eps_references", "report_sweep_n", "report_sweep_eps", "report_select"]


def eps_references(sweep: Sequence[dict], runs: Sequence[dict]) -> list[dict]:
  """``run``-protocol runs of the swept arms in the sweep's setting, as extra eps points.

  The eps probe varies only eps, so the main study's B2 (eps = 1e-8) is its reference
  point and need not be trained twice.
  """
  keys = {(r["arm"], _group_key(r["config"])) for r in sweep}
  have = {(r["arm"], r["seed"], r["config"]["eps"]) for r in sweep}
  return [
    r
    for r in runs
    if (r["arm"], _group_key(r["config"])) in keys
    and r["config"].get("eps") is not None
    and (r["arm"], r["seed"], r["config"]["eps"]) not in have
  ]


def report_sweep_n(runs: Sequence[dict], out_dir: pathlib.Path) -> list[str]:
  by_n: dict = {}
  for r in runs:
    by_n.setdefault(r["config"]["n_train"], {}).setdefault(r["arm"], []).append(r)
  arms = _arm_order({r["arm"] for r in runs})
  rows: list[list[str]] = []
  curves: dict[str, list] = {a: [] for a in arms}
  for n in sorted(by_n):
    cfg = next(iter(by_n[n].values()))[0]["config"]
    base = _by_seed(by_n[n].get("A2", []), "test_acc")
    cells = [str(n), str(cfg["total_steps"]), str(cfg["epochs"])]
    for a in arms:
      acc = _by_seed(by_n[n].get(a, []), "test_acc")
      mean, std = stats.summarize([100 * v for v in acc.values()], ddof=0)
      cells.append(f"{mean:.2f} ± {std:.2f}" if acc else "-")
      curves[a].append((n, mean, std))
    for a in arms:
      if a == "A2":
        continue
      p = _paired_row(base, _by_seed(by_n[n].get(a, []), "test_acc")) if base else None
      cells += _paired_cells(p)
    rows.append(cells)
  header = ["n", "steps", "epochs"] + [f"{a} %" for a in arms]
  for a in arms:
    if a != "A2":
      header += [f"{a}-A2 pp", *PAIRED_HEADER]
  lines = [
    "patches (sweep-n): data-size sweep at a fixed step budget",
    _table(header, rows),
    "  mean ± population std (ddof=0) over seeds, as the paper's Table 3; Δ paired within"
    " seed; bootstrap CI exact (every resample of the seeds).",
  ]
  png = _plot_xy(curves, out_dir, "patches_sweep_n.png", "n_train", "test accuracy (%)")
  if png:
    lines.append(f"  plot: {png}")
  return lines + [""]


def report_sweep_eps(runs: Sequence[dict], out_dir: pathlib.Path) -> list[str]:
  lines = ["patches (sweep-eps): Riemannian Adam eps probe (paper 4.7)"]
  for arm in _arm_order({r["arm"] for r in runs}):
    by_eps: dict = {}
    for r in runs:
      if r["arm"] == arm:
        by_eps.setdefault(r["config"]["eps"], []).append(r)
    ref_eps = min(by_eps)
    ref = _by_seed(by_eps[ref_eps], "test_acc")
    rows, curve = [], []
    for eps in sorted(by_eps):
      acc = _by_seed(by_eps[eps], "test_acc")
      mean, std = stats.summarize([100 * v for v in acc.values()])
      p = _paired_row(ref, acc) if eps != ref_eps else None
      rows.append([f"{eps:.0e}", str(len(acc)), f"{mean:.2f} ± {std:.2f}", *_paired_cells(p)])
      curve.append((eps, mean, std))
    lines.append(f"{arm}: {_title(by_eps[ref_eps][0]['config'])}")
    lines.append(
      _table(
        ["eps", "seeds", "test acc %", f"Δ vs {ref_eps:.0e} pp", *PAIRED_HEADER],
        rows,
      )
    )
    png = _plot_xy(
      {arm: curve}, out_dir, f"patches_sweep_eps_{arm}.png", "eps", "test accuracy (%)"
    )
    if png:
      lines.append(f"  plot: {png}")
    default = Setting.eps
    if ref_eps > default:
      lines.append(
        f"  paired against eps={ref_eps:.0e}, the smallest here: no {arm} run at the default"
        f" eps={default:.0e} in this setting; report these runs with a folder that has them"
        " (such as the main study's) to pair against the default"
      )
    lines.append("")
  return lines


def report_select(runs: Sequence[dict]) -> list[str]:
  by_arm: dict = {}
  for r in runs:
    knob = knob_of(r["config"])
    by_arm.setdefault(r["arm"], {}).setdefault(knob, []).append(r["metrics"]["val_acc"])
  rows = []
  for arm in _arm_order(by_arm):
    scores = {k: float(np.mean(v)) for k, v in by_arm[arm].items()}
    best = max(scores, key=scores.__getitem__)
    rows.append(
      [
        arm,
        "  ".join(
          f"{k:g}:{100 * v:.2f}" + ("*" if k == best else "") for k, v in sorted(scores.items())
        ),
      ]
    )
  return [
    "patches (select-lr): validation accuracy % per rate (* = selected)",
    _table(["arm", "rate: val acc"], rows),
    "",
  ]


def _plot_xy(
  curves: dict, out_dir: pathlib.Path, name: str, xlabel: str, ylabel: str
) -> Optional[str]:
  plt = report_lib.pyplot()
  if plt is None:
    return None
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, (a, pts) in enumerate(curves.items()):
    pts = [p for p in pts if math.isfinite(p[1])]
    if not pts:
      continue
    x, m, s = map(np.asarray, zip(*pts))
    ax.errorbar(np.maximum(x, 1e-12), m, yerr=s, marker="o", capsize=3, label=a, color=f"C{i}")
  ax.set_xscale("log")
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.legend()
  fig.tight_layout()
  return report_lib.save_figure(fig, plt, out_dir, name)
