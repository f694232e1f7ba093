"""The report of study 2 of docs/lm.md (``stiefax report results/lm-fair``).

Its grid and selection rules are :mod:`stiefax.experiments.lm.fair`'s. On the small
model: E1's frame-step table, E2's and E3's AdamW grids, the tuning budget, the best
Stiefel arm over study 1's sweep beside A2 and A2-qknorm, each arm at its best cell
(test loss, paired differences to A2 and to A2-qknorm with both intervals and the
verdict, attention and the certified logit bound) and the protocol's contrasts
(:data:`CONTRASTS`). On the larger model: each arm's three cells and the same
best-cell tables.
"""

from __future__ import annotations

from typing import Callable
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import stats
from stiefax.experiments.lm.config import SWEEP_RATES
from stiefax.experiments.lm.fair import E1_ADAMW_RATES
from stiefax.experiments.lm.fair import E1_FRAME_RATES
from stiefax.experiments.lm.fair import E2_ADAMW_RATES
from stiefax.experiments.lm.fair import E2_ARMS
from stiefax.experiments.lm.fair import SELECTION_SEEDS
from stiefax.experiments.lm.fair import STUDY1_FRAME_LR
from stiefax.experiments.lm.fair import UNUSED_FRAME_RATE
from stiefax.experiments.lm.fair import Cell
from stiefax.experiments.lm.fair import best_cells
from stiefax.experiments.lm.fair import best_stiefel_sweep
from stiefax.experiments.lm.fair import by_arm
from stiefax.experiments.lm.fair import cells
from stiefax.experiments.lm.fair import is_large
from stiefax.experiments.lm.fair import tried_cells
from stiefax.experiments.lm.fair import val_loss
from stiefax.experiments.lm.runs import by_rate
from stiefax.experiments.lm.runs import loss_of
from stiefax.experiments.lm.runs import paired_loss_cells
from stiefax.experiments.lm.runs import select_rate
from stiefax.experiments.lm.runs import sensitivity
from stiefax.experiments.report import num
from stiefax.experiments.report import table

__all__ = ["CONTRASTS", "report"]

#: The paired contrasts (b, a) of the protocol beside each arm against A2 and
#: A2-qknorm; ``"B2@study1"`` is study 1's B2 cell (AdamW 1e-2, frame 1.0).
CONTRASTS = (
  ("B2", "B2@study1"),
  ("B2-temp", "B2"),
  ("B2-fold", "B2-temp"),
  ("A2-temp", "A2"),
  ("B2-diag", "B2"),
  ("B2-qknorm", "B2"),
)

_STUDY1_B2 = (1e-2, STUDY1_FRAME_LR)


def _test(run: dict) -> float:
  return loss_of(run, "test_bpb")


def _cell_mean(arm_runs: dict, cell: Cell) -> Optional[float]:
  vals = [val_loss(arm_runs[(cell, s)]) for s in SELECTION_SEEDS if (cell, s) in arm_runs]
  return float(np.mean(vals)) if len(vals) == len(SELECTION_SEEDS) else None


def _mean_cap(arm_runs: dict, cell: Cell) -> Optional[float]:
  fr = []
  for s in SELECTION_SEEDS:
    r = arm_runs.get((cell, s))
    vals = [] if r is None else [v for v in r["history"].get("cap_fraction", []) if v is not None]
    if vals:
      fr.append(float(np.mean(vals)))
  return float(np.mean(fr)) if fr else None


def _seeds_at(arm_runs: dict, cell: Cell) -> dict:
  return {s: r for (c, s), r in arm_runs.items() if c == cell}


def _grid_tables(by: dict, best: dict) -> list[str]:
  lines: list[str] = []
  if "B2" in by:
    rows: list[list[str]] = []
    for f in E1_FRAME_RATES:
      losses = [_cell_mean(by["B2"], (a, f)) for a in E1_ADAMW_RATES]
      caps = [_mean_cap(by["B2"], (a, f)) for a in E1_ADAMW_RATES]
      rows.append(
        [f"B2, frame rate {f:g}"] + [num(x, ".3f") for x in losses] + [num(x, ".2f") for x in caps]
      )
    head = [f"AdamW {a:g}" for a in E1_ADAMW_RATES]
    lines += [
      "study 2, E1 (the frame step): final validation loss, bits per byte (mean over",
      "  seeds 0-1), and the fraction of frame steps the cap shortened",
      table(["cell", *head, *(f"cap binds, {a:g}" for a in E1_ADAMW_RATES)], rows),
      "",
    ]
  rate_rows: list[list[str]] = []
  for arm in ("A2-temp", *E2_ARMS):
    if arm not in by:
      continue
    for f in sorted({c[1] for c, _ in by[arm]}):
      label = arm if arm.startswith("A2") else f"{arm}, frame {f:g}"
      rate_rows.append([label, *(num(_cell_mean(by[arm], (a, f)), ".3f") for a in E2_ADAMW_RATES)])
  if rate_rows:
    lines += [
      "study 2, E2 and E3: final validation loss, bits per byte",
      "  (mean over seeds 0-1; '-': a seed is missing)",
      table(["arm", *(f"AdamW {a:g}" for a in E2_ADAMW_RATES)], rate_rows),
      "",
    ]
  budget = []
  frame_best = best["B2"][1] if "B2" in best else None
  for arm, c in best.items():
    # The cells of its grid it ran (a later sweep's other rates chose nothing).
    grid = set(cells(arm, frame_best))
    tried = sorted({cell for cell, s in by[arm] if s in SELECTION_SEEDS and cell in grid})
    budget.append([arm, str(len(tried)), f"AdamW {c[0]:g}, frame {c[1]:g}"])
  if budget:
    lines += [
      "tuning budget: the cells each arm was given (seeds 0-1) and its best",
      table(["arm", "cells", "best cell"], budget),
      "",
    ]
  return lines


def _bound_ratio(rs: Sequence[dict]) -> Optional[float]:
  """The largest logit seen over its certified bound, over evaluations and heads."""
  worst = None
  for r in rs:
    h = r["history"]
    for seen, bound in zip(h.get("head_max_logit", []), h.get("logit_bound", [])):
      if seen is None or bound is None:
        continue
      ratio = float(np.max(np.asarray(seen) / np.asarray(bound)))
      worst = ratio if worst is None else max(worst, ratio)
  return worst


def _mean_std(mean: float, std: float, n: int) -> str:
  return f"{mean:.4f}" if n < 2 else f"{mean:.4f} ± {std:.4f}"  # one seed has no spread


def _best_tables(by: dict, best: dict) -> list[str]:
  chosen = {arm: _seeds_at(by[arm], c) for arm, c in best.items()}
  if "B2" in by and _seeds_at(by["B2"], _STUDY1_B2):
    chosen["B2@study1"] = _seeds_at(by["B2"], _STUDY1_B2)
  if not chosen:
    return []
  rows, attn_rows = [], []
  for arm, seeds in chosen.items():
    test = {s: _test(r) for s, r in seeds.items()}
    mean, std = stats.summarize(list(test.values()))
    rs = list(seeds.values())
    m = [r["metrics"] for r in rs]
    vs_a = paired_loss_cells(chosen.get("A2", {}), seeds) if arm != "A2" else ["-"] * 4
    vs_q = (
      paired_loss_cells(chosen.get("A2-qknorm", {}), seeds) if arm != "A2-qknorm" else ["-"] * 4
    )
    cell = best.get(arm, _STUDY1_B2)
    where = f"{cell[0]:g}" + ("" if not arm.startswith("B2") else f" / {cell[1]:g}")
    rows.append(
      [arm, where, str(len(rs)), _mean_std(mean, std, len(rs)), vs_a[0], vs_a[3], vs_q[0], vs_q[3]]
    )
    attn_rows.append(
      [
        arm,
        f"{np.nanmean([x['max_logit_max'] for x in m]):.1f}",
        num(_bound_ratio(rs), ".2f"),
        f"{np.nanmean([x['entropy'] for x in m]):.2f}",
        f"{np.nanmean([x['isometry'] for x in m]):.1e}",
      ]
    )
  head = ["arm", "lr / frame", "seeds", "test bpb", "Δ vs A2", "verdict"]
  lines = [
    "study 2, each arm at its best cell: test loss, bits per byte (paired by seed;",
    "  Δ = arm - A2 or arm - A2-qknorm, negative is better; (n) paired seeds)",
    table([*head, "Δ vs A2-qknorm", "verdict"], rows),
    f"  verdict: both 95% intervals agree, on >= {stats.MIN_SEEDS} paired seeds;"
    " otherwise not settled.",
    "",
    "study 2, the same runs' attention (means over seeds): largest logit during training,",
    "  largest logit over its head's certified bound (every evaluation and head; '-' where",
    "  no bound applies), entropy at the end, isometry error",
    table(["arm", "max logit", "logit / bound", "entropy", "isometry"], attn_rows),
    "",
  ]
  crow = []
  pairs = (*((arm, "A2") for arm in chosen if arm != "A2"), *CONTRASTS)
  for arm_b, arm_a in dict.fromkeys(pairs):
    if arm_a in chosen and arm_b in chosen:
      crow.append([f"{arm_b} - {arm_a}", *paired_loss_cells(chosen[arm_a], chosen[arm_b])])
  if crow:
    lines += [
      "study 2, contrasts: test loss Δ = b - a, bits per byte ((n) paired seeds)",
      table(["b - a", "Δ (n)", "t 95% CI", "bootstrap 95% CI", "verdict"], crow),
      "",
    ]
  return lines


def _cell_text(seeds: Optional[list[dict]], show: Callable[[list[dict]], str]) -> str:
  return "-" if seeds is None else show(seeds)


def _mean_loss(seeds: list[dict]) -> str:
  return num(float(np.mean([loss_of(r) for r in seeds])), ".3f")


def _attention(seeds: list[dict]) -> str:
  """The largest logit over the seeds / the mean entropy at the end."""
  logit = max(r["metrics"]["max_logit_max"] for r in seeds)
  entropy = float(np.mean([r["metrics"]["entropy"] for r in seeds]))
  return f"{num(logit, '.1f')} / {num(entropy, '.2f')}"


def _sweep_table(runs: Sequence[dict]) -> list[str]:
  """The best Stiefel arm over study 1's seven rates, beside A2 and A2-qknorm.

  Seeds 0-1 at each of :data:`SWEEP_RATES` (A2's two extra rates of E1 left out, so
  every row's sensitivity is over the same seven rates as study 1's table).
  """
  found = best_stiefel_sweep(runs)
  if found is None:
    return []
  label, best_runs = found
  rows_of = {
    arm: [r for r in runs if r["arm"] == arm and r["seed"] in SELECTION_SEEDS]
    for arm in ("A2", "A2-qknorm")
  }
  rows_of[label] = best_runs
  rows, logit_rows = [], []
  for name, rs in rows_of.items():
    rates = by_rate([r for r in rs if r["config"]["adamw_lr"] in SWEEP_RATES])
    cells = [
      list(rates[lr].values()) if set(rates.get(lr, {})) == set(SELECTION_SEEDS) else None
      for lr in SWEEP_RATES
    ]
    done = [seeds for seeds in cells if seeds is not None]
    if len(done) == len(SWEEP_RATES):
      swept = [r for seeds in done for r in seeds]
      tail = [num(sensitivity(swept), ".3f"), num(select_rate(swept), "g")]
    else:
      tail = [f"- ({len(done)}/{len(SWEEP_RATES)} rates)", "-"]
    rows.append([name, *(_cell_text(seeds, _mean_loss) for seeds in cells), *tail])
    logit_rows.append([name, *(_cell_text(seeds, _attention) for seeds in cells)])
  return [
    "study 2, the best Stiefel arm over study 1's sweep: final validation loss, bits per",
    "  byte (mean over seeds 0-1; min(loss, loss at init); '-': a seed is missing)",
    table(["arm", *(f"{lr:g}" for lr in SWEEP_RATES), "LR sensitivity", "best rate"], rows),
    "",
    "the same runs' attention: largest logit max |q·k|/sqrt(r) during training (max",
    "  over seeds 0-1) / entropy at the end of training, nats (mean over seeds 0-1)",
    table(["arm", *(f"{lr:g}" for lr in SWEEP_RATES)], logit_rows),
    "",
  ]


def _large_cell(arm_runs: dict, cell: Cell) -> str:
  s0 = arm_runs.get((cell, 0))
  text = "-" if s0 is None else f"{val_loss(s0):.3f}"
  mean = _cell_mean(arm_runs, cell)
  return text if mean is None else f"{text} / {mean:.3f}"


def _large_tables(by: dict, best: dict) -> list[str]:
  rows = []
  for arm, arm_runs in by.items():
    tried = tried_cells(arm_runs)
    f = tried[0][1] if tried else UNUSED_FRAME_RATE
    label = arm if not arm.startswith("B2") else f"{arm}, frame {f:g}"
    shown = [f"{a:g}: {_large_cell(arm_runs, (a, f))}" for a, f in tried]
    b = best.get(arm)
    rows.append([label, "; ".join(shown), "-" if b is None else f"{b[0]:g}"])
  lines = [
    "study 2, the larger model: final validation loss, bits per byte, at each arm's",
    "  best small-model AdamW rate and x3 either side: seed 0 / mean over seeds 0-1",
    "  where seed 1 ran; the best by seed 0 (docs/lm.md, the larger model's budget)",
    table(["arm", "AdamW rate: loss", "best"], rows),
    "",
  ]
  return lines


def report(runs: Sequence[dict]) -> list[str]:
  """The tables of study 2 for one setting's runs (docs/lm.md, "Study 2")."""
  by = by_arm(runs)
  best = best_cells(runs)
  if is_large(runs):
    return _large_tables(by, best) + _best_tables(by, best)
  return _grid_tables(by, best) + _sweep_table(runs) + _best_tables(by, best)
