"""The report of grokking runs (printed by ``stiefax report``): tables and plots.

Per setting: per arm, how many runs memorized, grokked and sustained it (k/n), the
median epochs, the end and tail held-out accuracy (mean ± sample std) and the final
isometry error; the paired difference of the tail mean against A2; PNG plots of the
accuracy, isometry and effective-learning-rate histories.
"""

from __future__ import annotations

import math
import pathlib
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import report as report_lib
from stiefax.experiments import stats
from stiefax.experiments import store
from stiefax.experiments.grok.config import ARMS
from stiefax.experiments.grok.runs import record_identity

__all__ = ["check_run", "run_key", "report"]


_METRICS = (
  "memorized_epoch",
  "grokked_epoch",
  "sustained_epoch",
  "end_train_acc",
  "end_test_acc",
  "tail_test_acc",
  "final_isometry",
)
_HISTORY = ("epoch", "train_acc", "test_acc", "isometry")


def check_run(run: dict) -> Optional[str]:
  """What a grokking run lacks for the report (``None`` if nothing); see ``stiefax report``."""
  for key in _METRICS:
    if key not in run["metrics"]:
      return f"lacks the metric {key!r}"
  history = run.get("history")
  if not isinstance(history, dict):
    return "lacks the field 'history'"
  for key in _HISTORY:
    if not isinstance(history.get(key), list) or not history[key]:
      return f"lacks the history {key!r}"
  if len({len(history[k]) for k in _HISTORY}) != 1:
    return "its histories differ in length"
  try:
    record_identity(run)
  except KeyError as e:
    return f"lacks the config field {e}"
  return None


def run_key(run: dict) -> tuple:
  """Two files hold the same run when they share :func:`record_identity` and seed."""
  return (store.digest(record_identity(run)), run["seed"])


def _median(xs) -> str:
  xs = [x for x in xs if x is not None]
  return "-" if not xs else f"{float(np.median(xs)):.0f}"


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


def _arm_order(names) -> list[str]:
  return report_lib.arm_order(names, ARMS)


def _table(runs: Sequence[dict]) -> str:
  by_arm: dict = {}
  for r in runs:
    by_arm.setdefault(r["arm"], []).append(r)
  head = (
    f"{'arm':<8} {'n':>3} {'mem k/n':>7} {'grok k/n':>8} {'sust k/n':>8}"
    f" {'med grok epoch':>14} {'med sust epoch':>14} {'end held-out':>13}"
    f" {'tail held-out':>13} {'final iso':>9}"
  )
  lines = [head, "-" * len(head)]
  for arm in _arm_order(by_arm):
    rs = sorted(by_arm[arm], key=lambda r: r["seed"])
    ms = [r["metrics"] for r in rs]
    n = len(rs)
    count = lambda key, ms=ms, n=n: f"{sum(m[key] is not None for m in ms)}/{n}"
    end_m, end_s = stats.summarize([m["end_test_acc"] for m in ms])
    tail_m, tail_s = stats.summarize([m["tail_test_acc"] for m in ms])
    iso = max(m["final_isometry"] for m in ms)
    lines.append(
      f"{arm:<8} {n:>3} {count('memorized_epoch'):>7} {count('grokked_epoch'):>8}"
      f" {count('sustained_epoch'):>8} {_median(m['grokked_epoch'] for m in ms):>14}"
      f" {_median(m['sustained_epoch'] for m in ms):>14}"
      f" {end_m:>6.3f}±{end_s:<6.3f} {tail_m:>6.3f}±{tail_s:<6.3f} {iso:>9.2e}"
    )
  lines.append(
    "(k/n: runs that reached the threshold; ± is the sample std across seeds;"
    " final iso: max over runs of max|W_Q^T W_Q - I| at the last evaluation)"
  )

  if "A2" in by_arm:
    base = {r["seed"]: r["metrics"]["tail_test_acc"] for r in by_arm["A2"]}
    rows = []
    for arm in _arm_order(by_arm):
      if arm == "A2":
        continue
      other = {r["seed"]: r["metrics"]["tail_test_acc"] for r in by_arm[arm]}
      pr = report_lib.paired_by_seed(base, other, min_seeds=2)
      if pr is None:
        shared = len(set(base) & set(other))
        rows.append(f"{arm:<8} {shared:>3}  (needs >= 2 seeds shared with A2)")
        continue
      rows.append(
        f"{arm:<8} {pr.n:>3} {pr.mean:>+9.4f} {pr.t:>7.2f} {pr.p:>7.3f}"
        f" {pr.wins:>3}/{pr.n:<3} [{pr.ci_low:+.4f}, {pr.ci_high:+.4f}]"
      )
    if rows:
      head2 = f"{'arm':<8} {'n':>3} {'diff':>9} {'t':>7} {'p':>7} {'wins':>7}  95% bootstrap CI"
      lines += [
        "",
        "Paired difference of the tail mean vs A2 (arm - A2, per seed):",
        head2,
        "-" * len(head2),
      ] + rows
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


def report(runs: list, out_dir: pathlib.Path) -> str:
  """Paper-style tables for grokking runs; writes accuracy and isometry PNGs."""
  groups = _settings(runs)
  parts = []
  for _i, (setting, rs) in enumerate(sorted(groups.items())):
    suffix = "" if len(groups) == 1 else f"_{_slug(setting)}"
    written = _plots(rs, pathlib.Path(out_dir), suffix)
    parts.append(
      f"Grokking, c = (a + b) mod {rs[0]['config'].get('modulus', 97)}"
      f" [{setting}]: {len(rs)} run(s)\n"
      + _table(rs)
      + "\nplots: "
      + ", ".join(str(p) for p in written)
    )
  return "\n\n".join(parts)
