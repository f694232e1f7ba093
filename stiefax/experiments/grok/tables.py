"""The report of grokking runs (printed by ``stiefax report``): tables and plots.

Per setting: per arm, how many runs memorized, grokked and sustained it (k/n), the
median epochs, the end and tail held-out accuracy (mean ± sample std), the training
collapses (:mod:`stiefax.experiments.grok.collapses`) and the final isometry error; the
paired difference of the tail mean against A2 with its t and bootstrap intervals and
the statistical standard's verdict; PNG plots of the accuracy, isometry and
effective-learning-rate histories.
"""

from __future__ import annotations

import math
import pathlib
from typing import Iterable
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import report as report_lib
from stiefax.experiments import stats
from stiefax.experiments.grok.collapses import find_collapses
from stiefax.experiments.grok.config import ARMS

__all__ = ["report"]


def _median(xs: Iterable[Optional[int]]) -> str:
  found = [float(x) for x in xs if x is not None]
  return "-" if not found else f"{float(np.median(found)):.0f}"


def _settings(runs: Sequence[dict]) -> dict:
  groups: dict = {}
  for r in runs:
    c = r.get("config", {})
    key = c.get("setting") or (
      f"epochs={c.get('epochs')} eval_every={c.get('eval_every')}"
      f"{' stabilize' if c.get('stabilize') else ''}"
    )
    groups.setdefault(key, []).append(r)
  return groups


def _arm_order(names: Iterable[str]) -> list[str]:
  return report_lib.arm_order(names, ARMS)


def _table(runs: Sequence[dict]) -> str:
  by_arm: dict = {}
  for r in runs:
    by_arm.setdefault(r["arm"], []).append(r)
  rows = []
  for arm in _arm_order(by_arm):
    rs = sorted(by_arm[arm], key=lambda r: r["seed"])
    ms = [r["metrics"] for r in rs]
    n = len(rs)
    count = lambda key, ms=ms, n=n: f"{sum(m[key] is not None for m in ms)}/{n}"
    end_m, end_s = stats.summarize([m["end_test_acc"] for m in ms])
    tail_m, tail_s = stats.summarize([m["tail_test_acc"] for m in ms])
    iso = max(m["final_isometry"] for m in ms)
    found = [find_collapses(r["history"]) for r in rs]
    inside = sum(bool(f) and f[-1]["end"] is None for f in found)
    rows.append(
      [
        arm,
        str(n),
        count("memorized_epoch"),
        count("grokked_epoch"),
        count("sustained_epoch"),
        _median(m["grokked_epoch"] for m in ms),
        _median(m["sustained_epoch"] for m in ms),
        f"{end_m:.3f}±{end_s:.3f}",
        f"{tail_m:.3f}±{tail_s:.3f}",
        f"{sum(map(len, found))} ({inside}/{n} end in one)",
        f"{iso:.2e}",
      ]
    )
  header = [
    "arm",
    "n",
    "mem k/n",
    "grok k/n",
    "sust k/n",
    "med grok epoch",
    "med sust epoch",
    "end held-out",
    "tail held-out",
    "collapses",
    "final iso",
  ]
  lines = [
    report_lib.table(header, rows),
    "(k/n: runs that reached the threshold; ± is the sample std across seeds (0 for one);"
    " collapses: stretches of evaluations with train accuracy < 0.99 after memorizing,"
    " summed over runs, and the runs that end inside one; final iso: max over runs of"
    " max|W_Q^T W_Q - I| at the last evaluation)",
  ]

  if "A2" in by_arm:
    base = report_lib.by_seed(by_arm["A2"], "tail_test_acc")
    paired = []
    for arm in _arm_order(by_arm):
      if arm == "A2":
        continue
      other = report_lib.by_seed(by_arm[arm], "tail_test_acc")
      pr = report_lib.paired_by_seed(base, other, scale=100.0, min_seeds=2)
      if pr is None:
        shared = len(set(base) & set(other))
        paired.append([arm, str(shared), "(needs >= 2 seeds shared with A2)"])
        continue
      paired.append([arm, str(pr.n), *report_lib.paired_cells(pr)])
    if paired:
      width = 2 + 1 + len(report_lib.PAIRED_HEADER)
      lines += [
        "",
        "Paired difference of the tail held-out mean vs A2 (arm - A2, per seed, pp):",
        report_lib.table(
          ["arm", "n", "Δ pp", *report_lib.PAIRED_HEADER],
          [row + [""] * (width - len(row)) for row in paired],
        ),
        "  paired-t and bootstrap 95% CIs (exact up to 12 seeds); verdict: both CIs agree on"
        " >= 6 seeds, else not settled.",
      ]
  return "\n".join(lines)


def _slug(text: str) -> str:
  return "".join(ch if ch.isalnum() else "_" for ch in text).strip("_")


def _plots(runs: Sequence[dict], out_dir: pathlib.Path, suffix: str) -> list[str]:
  """Accuracy, isometry and ELR histories as PNGs in ``out_dir`` (none without matplotlib)."""
  plt = report_lib.pyplot()
  if plt is None:
    return []

  by_arm: dict = {}
  for r in runs:
    by_arm.setdefault(r["arm"], []).append(r)
  arms = _arm_order(by_arm)
  colors = {a: plt.get_cmap("tab10")(i % 10) for i, a in enumerate(arms)}
  written: list[Optional[str]] = []

  cols = min(3, len(arms))
  rows = math.ceil(len(arms) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharey=True)
  for ax in axes.ravel()[len(arms) :]:
    ax.set_visible(False)
  for ax, arm in zip(axes.ravel(), arms):
    for i, r in enumerate(sorted(by_arm[arm], key=lambda r: r["seed"])):
      h = r["history"]
      ax.plot(
        h["epoch"],
        h["train_acc"],
        color="tab:blue",
        alpha=0.8,
        lw=1,
        label="train" if i == 0 else None,
      )
      ax.plot(
        h["epoch"],
        h["test_acc"],
        color="tab:red",
        alpha=0.8,
        lw=1,
        label="held-out" if i == 0 else None,
      )
    ax.set_title(f"{arm} ({len(by_arm[arm])} run{'s' if len(by_arm[arm]) > 1 else ''})")
    ax.set_xlabel("epoch")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
  axes[0, 0].set_ylabel("accuracy")
  axes[0, 0].legend(loc="lower right")
  fig.tight_layout()
  written.append(report_lib.save_figure(fig, plt, out_dir, f"grok_accuracy{suffix}.png"))

  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  for arm in arms:
    for i, r in enumerate(by_arm[arm]):
      h = r["history"]
      iso = np.maximum(np.asarray(h["isometry"], np.float64), 1e-12)
      ax.semilogy(
        h["epoch"], iso, color=colors[arm], alpha=0.8, lw=1, label=arm if i == 0 else None
      )
  ax.set_xlabel("epoch")
  ax.set_ylabel(r"isometry error $\max|W_Q^\top W_Q - I|$")
  ax.grid(alpha=0.3, which="both")
  ax.legend()
  fig.tight_layout()
  written.append(report_lib.save_figure(fig, plt, out_dir, f"grok_isometry{suffix}.png"))

  # Effective learning rate (tangential part of the update, per group).
  if any("elr_frames" in r["history"] for rs in by_arm.values() for r in rs):
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for arm in arms:
      for i, r in enumerate(by_arm[arm]):
        h = r["history"]
        for key, style in (("elr_frames", "-"), ("elr_matrices", ":")):
          if key in h:
            epochs = h["epoch"][len(h["epoch"]) - len(h[key]) :]
            ax.semilogy(
              epochs,
              np.maximum(np.asarray(h[key], np.float64), 1e-12),
              style,
              color=colors[arm],
              alpha=0.8,
              lw=1,
              label=f"{arm} {key[4:]}" if i == 0 else None,
            )
    ax.set_xlabel("epoch")
    ax.set_ylabel(r"effective learning rate $\|\Delta_\perp\| / \|w\|$")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(report_lib.save_figure(fig, plt, out_dir, f"grok_elr{suffix}.png"))
  return [p for p in written if p is not None]


def report(runs: list, out_dir: Optional[pathlib.Path]) -> str:
  """Paper-style tables for grokking runs, and the accuracy, isometry and ELR PNGs in
  ``out_dir`` (none when it is None)."""
  groups = _settings(runs)
  parts = []
  for _i, (setting, rs) in enumerate(sorted(groups.items())):
    suffix = "" if len(groups) == 1 else f"_{_slug(setting)}"
    part = (
      f"Grokking, c = (a + b) mod {rs[0]['config'].get('modulus', 97)}"
      f" [{setting}]: {len(rs)} run(s)\n" + _table(rs)
    )
    if out_dir is not None:
      written = _plots(rs, pathlib.Path(out_dir), suffix)
      part += "\nplots: " + ", ".join(str(p) for p in written)
    parts.append(part)
  return "\n\n".join(parts)
