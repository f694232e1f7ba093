"""Study 2 of docs/lm.md (``results/lm-fair``): its grid and how it picks each arm's best.

Study 1 tuned every arm's AdamW rate but kept the frames' Riemannian rate at 1.0.
Study 2 gives the frames a tuned step, a per-head temperature, a gain-free q/k input
and a per-head gain, on the same model, text, steps and schedule. Its cells are
``(AdamW peak rate, frame peak rate)`` pairs, fixed here before any of its runs:

  E1  B2 at frame rates {0.1, 0.3, 1.0} x AdamW {3e-3, 1e-2}; A2 at study 1's seven
      rates and two more between its best and its neighbours, {2e-3, 5.5e-3}.
  E2  B2-temp, B2-fold, B2-qknorm (and E3's B2-diag) at AdamW {3e-3, 1e-2, 3e-2}, at
      E1's best frame rate; A2-temp at the same AdamW rates.

Every cell runs seeds 0 and 1 (:data:`SELECTION_SEEDS`). An arm's best cell is the one
with the lowest mean final validation loss over those two seeds (ties: the smaller
AdamW rate, then the smaller frame rate); E1's best frame rate is that of B2's best
cell. Each arm's best cell then runs seeds 2-5, and every verdict pairs the six seeds.
A cell counts only once both selection seeds are finished, so two processes sharing a
results folder cannot pick a best from half a cell. On the larger model (:func:`around`)
the best of an arm's three cells is chosen by seed 0 alone
(:data:`LARGE_SELECTION_SEEDS`), and seeds 1-5 run there.
"""

from __future__ import annotations

from typing import Callable
from typing import Iterable
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import stats
from stiefax.experiments.lm.config import SWEEP_RATES
from stiefax.experiments.lm.runs import best_of
from stiefax.experiments.lm.runs import by_rate
from stiefax.experiments.lm.runs import loss_of
from stiefax.experiments.lm.runs import select_rate
from stiefax.experiments.lm.runs import sensitivity
from stiefax.experiments.report import num
from stiefax.experiments.report import table

__all__ = [
  "SELECTION_SEEDS",
  "LARGE_SELECTION_SEEDS",
  "E1_FRAME_RATES",
  "E1_ADAMW_RATES",
  "A2_RATES",
  "E2_ADAMW_RATES",
  "E2_ARMS",
  "Cell",
  "cells",
  "cell_of",
  "select_cell",
  "missing",
  "SMALL_PRESET",
  "LARGE_PRESET",
  "STIEFEL_ARMS",
  "best_stiefel_arm",
  "best_stiefel_sweep",
  "qknorm_partner",
  "around",
  "NEW_ARMS",
  "CONTRASTS",
  "is_study2",
  "is_large",
  "best_cells",
  "report",
]

Cell = tuple[float, float]  # (AdamW peak rate, frame peak rate)

#: The seeds every cell of the grid runs; the best cell is chosen on them.
SELECTION_SEEDS = (0, 1)

#: The seeds the larger model's best cell is chosen on. Its runs did not fit the
#: protocol's 12 core-hours, so by the protocol's rule the rates either side of an
#: arm's best small-model rate run at seed 0 only (docs/lm.md, "The larger model's
#: budget"): each arm's best of its three cells is the one with the lowest seed-0
#: validation loss, and seeds 1-5 run there.
LARGE_SELECTION_SEEDS = (0,)

#: E1: B2's frame rates (1.0 is study 1's) and AdamW rates.
E1_FRAME_RATES = (0.1, 0.3, 1.0)
E1_ADAMW_RATES = (3e-3, 1e-2)

#: E1: A2's rates, study 1's seven and two between its best (3e-3) and its neighbours.
A2_RATES = tuple(sorted(SWEEP_RATES + (2e-3, 5.5e-3)))

#: E2 and E3: the AdamW rates of the new arms (at E1's best frame rate).
E2_ADAMW_RATES = (3e-3, 1e-2, 3e-2)

#: The arms of E2 and E3 with a frame rule (they run at E1's best frame rate).
E2_ARMS = ("B2-temp", "B2-fold", "B2-qknorm", "B2-diag")

#: The frame rate recorded by the runs of arms without one (the preset's, unused).
_UNUSED_FRAME_RATE = 1.0

#: The presets of the small model (E1-E3) and of the larger model.
SMALL_PRESET = "sweep"
LARGE_PRESET = "large"

#: The candidates for "the best Stiefel arm of study 2": B2 and the arms of E2 and E3.
STIEFEL_ARMS = ("B2", *E2_ARMS)


def cells(arm: str, frame_best: Optional[float] = None) -> list[Cell]:
  """The cells of ``arm`` in study 2's grid.

  ``frame_best`` is E1's best frame rate, which the arms of :data:`E2_ARMS` need.
  Raises ValueError for an arm outside the study or a missing ``frame_best``.
  """
  if arm == "B2":
    return [(a, f) for f in E1_FRAME_RATES for a in E1_ADAMW_RATES]
  if arm == "A2":
    return [(a, _UNUSED_FRAME_RATE) for a in A2_RATES]
  if arm == "A2-temp":
    return [(a, _UNUSED_FRAME_RATE) for a in E2_ADAMW_RATES]
  if arm == "A2-qknorm":  # study 1's sweep, reused
    return [(a, _UNUSED_FRAME_RATE) for a in SWEEP_RATES]
  if arm in E2_ARMS:
    if frame_best is None:
      raise ValueError(f"{arm}: its cells are at E1's best frame rate; give frame_best")
    return [(a, frame_best) for a in E2_ADAMW_RATES]
  raise ValueError(
    f"arm {arm!r} is not in study 2; its arms are B2, A2, A2-qknorm, A2-temp, {', '.join(E2_ARMS)}"
  )


def cell_of(run: dict) -> Cell:
  """A run's ``(AdamW rate, frame rate)``."""
  cfg = run["config"]
  return (float(cfg["adamw_lr"]), float(cfg["frame_lr"]))


def _val(run: dict) -> float:
  return loss_of(run, "val_bpb")


def missing(
  runs: Iterable[dict], wanted: Sequence[Cell], seeds: Sequence[int] = SELECTION_SEEDS
) -> list[tuple[Cell, int]]:
  """The ``(cell, seed)`` of ``seeds`` in ``wanted`` that ``runs`` lack."""
  have = {(cell_of(r), r["seed"]) for r in runs}
  return [(c, s) for c in wanted for s in seeds if (c, s) not in have]


def select_cell(
  runs: Iterable[dict], wanted: Sequence[Cell], seeds: Sequence[int] = SELECTION_SEEDS
) -> Optional[Cell]:
  """The cell of ``wanted`` with the lowest mean validation loss over ``seeds`` (the
  selection seeds; ties: smaller AdamW rate, then smaller frame rate; a mean that is
  not finite is never chosen); None while a cell lacks one of them. ``runs`` are one arm's runs of one setting."""
  runs = list(runs)
  if missing(runs, wanted, seeds):
    return None
  by = {(cell_of(r), r["seed"]): r for r in runs}
  means = {c: float(np.mean([_val(by[(c, s)]) for s in seeds])) for c in wanted}
  return best_of(means)


def _arm_mean(runs: Sequence[dict], arm: str, frame_best: float) -> Optional[tuple[float, Cell]]:
  mine = [r for r in runs if r["arm"] == arm]
  cell = select_cell(mine, cells(arm, frame_best))
  if cell is None:
    return None
  by = {(cell_of(r), r["seed"]): r for r in mine}
  return float(np.mean([_val(by[(cell, s)]) for s in SELECTION_SEEDS])), cell


def best_stiefel_arm(runs: Sequence[dict]) -> Optional[str]:
  """The best Stiefel arm of study 2: of :data:`STIEFEL_ARMS`, the one with the lowest
  mean validation loss over the selection seeds at its best cell (ties: the order of
  :data:`STIEFEL_ARMS`). ``runs`` are the small model's runs of study 2; None while a
  candidate's cells lack a selection seed."""
  b2 = _arm_mean(runs, "B2", 1.0)  # B2's grid does not depend on frame_best
  if b2 is None:
    return None
  means = {"B2": b2[0]}
  for arm in E2_ARMS:
    m = _arm_mean(runs, arm, b2[1][1])
    if m is None:
      return None
    means[arm] = m[0]
  return min(STIEFEL_ARMS, key=lambda a: (means[a], STIEFEL_ARMS.index(a)))


def best_stiefel_sweep(runs: Sequence[dict]) -> Optional[tuple[str, list[dict]]]:
  """The best Stiefel arm's runs over study 1's sweep, for its LR-sensitivity row.

  ``(label, runs)``: the runs of :func:`best_stiefel_arm` at E1's best frame rate and
  the selection seeds, at every AdamW rate it ran (E2's three and the sweep's other
  four once they exist), labelled ``"<arm>, frame <rate>"``; None until the best arm
  is known and it ran a rate outside E2's.
  """
  arm = best_stiefel_arm(runs)
  if arm is None:
    return None
  frame = best_cells(runs)["B2"][1]
  mine = [
    r
    for r in runs
    if r["arm"] == arm and r["config"]["frame_lr"] == frame and r["seed"] in SELECTION_SEEDS
  ]
  if not {r["config"]["adamw_lr"] for r in mine} - set(E2_ADAMW_RATES):
    return None
  return f"{arm}, frame {frame:g}", mine


def qknorm_partner(arm: str) -> str:
  """The larger model's fourth arm: ``arm`` with QK-norm, or without it if it has it.

  ``B2`` -> ``B2-qknorm`` and ``B2-qknorm`` -> ``B2``. The registry has no QK-norm
  variant of ``B2-temp``, ``B2-fold`` or ``B2-diag``; for those the partner is
  ``B2-qknorm`` (docs/lm.md, "Study 2", fixed before E2's results were in).
  """
  if arm not in STIEFEL_ARMS:
    raise ValueError(f"{arm!r} is not one of study 2's Stiefel arms {STIEFEL_ARMS}")
  return "B2" if arm == "B2-qknorm" else "B2-qknorm"


def _three(x: float) -> float:
  return float(f"{x:.6g}")  # 3 x 1e-2 is 0.03, not 0.030000000000000002


#: How many cells :func:`around` gives an arm on the larger model.
_AROUND_CELLS = 3


def around(cell: Cell) -> list[Cell]:
  """The larger model's cells of an arm whose small-model best cell is ``cell``: its
  AdamW rate and the rates x3 either side, the frame rate kept."""
  a, f = cell
  return [(_three(a / 3), f), (a, f), (_three(a * 3), f)]


# ----------------------------------------------------------------------------------
# The report of study 2 (``stiefax report results/lm-fair``).
# ----------------------------------------------------------------------------------

#: Arms that exist only in study 2; a setting with one of them, or with a frame rate
#: other than 1.0, is reported by :func:`report`.
NEW_ARMS = ("B2-temp", "B2-fold", "A2-temp", "B2-diag")

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

_STUDY1_B2 = (1e-2, 1.0)


def _own(run: dict) -> bool:
  return run["config"]["arm"]["rule"] != "adamw" and not run["config"]["arm"]["frozen"]


def is_study2(runs: Sequence[dict]) -> bool:
  """Whether a setting's runs hold study 2's arms or frame rates, or its larger model."""
  return any(
    r["arm"] in NEW_ARMS
    or (_own(r) and float(r["config"]["frame_lr"]) != 1.0)
    or r["config"]["preset"] == LARGE_PRESET
    for r in runs
  )


def is_large(runs: Sequence[dict]) -> bool:
  """Whether a setting's runs are of study 2's larger model."""
  return bool(runs) and runs[0]["config"]["preset"] == LARGE_PRESET


def _test(run: dict) -> float:
  return loss_of(run, "test_bpb")


def _by_arm(runs: Sequence[dict]) -> dict:
  out: dict = {}
  for r in runs:
    out.setdefault(r["arm"], {})[(cell_of(r), r["seed"])] = r
  return out


def _cell_mean(arm_runs: dict, cell: Cell) -> Optional[float]:
  vals = [_val(arm_runs[(cell, s)]) for s in SELECTION_SEEDS if (cell, s) in arm_runs]
  return float(np.mean(vals)) if len(vals) == len(SELECTION_SEEDS) else None


def _mean_cap(arm_runs: dict, cell: Cell) -> Optional[float]:
  fr = []
  for s in SELECTION_SEEDS:
    r = arm_runs.get((cell, s))
    vals = [] if r is None else [v for v in r["history"].get("cap_fraction", []) if v is not None]
    if vals:
      fr.append(float(np.mean(vals)))
  return float(np.mean(fr)) if fr else None


def _tried(arm_runs: dict) -> list[Cell]:
  return sorted({c for c, s in arm_runs if s in SELECTION_SEEDS})


def best_cells(runs: Sequence[dict]) -> dict:
  """``{arm: cell}``: each arm's best cell under the protocol, where it can be chosen.

  On the larger model an arm's cells are the three it was given (:func:`around` its
  small-model best), so the best is chosen among the cells it ran, once it has run
  all three, on :data:`LARGE_SELECTION_SEEDS`.
  """
  by = _by_arm(runs)
  out: dict = {}
  if is_large(runs):
    for arm, arm_runs in by.items():
      tried = _tried(arm_runs)
      if len(tried) < _AROUND_CELLS:  # a cell not begun yet could still be the best
        continue
      c = select_cell(arm_runs.values(), tried, LARGE_SELECTION_SEEDS)
      if c is not None:
        out[arm] = c
    return out
  if "B2" in by:
    c = select_cell(by["B2"].values(), cells("B2"))
    if c is not None:
      out["B2"] = c
  for arm in by:
    if arm == "B2":
      continue
    try:
      wanted = cells(arm, out["B2"][1] if "B2" in out else None)
    except ValueError:  # an arm outside study 2, or an E2 arm before E1 is done
      continue
    c = select_cell(by[arm].values(), wanted)
    if c is not None:
      out[arm] = c
  return out


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


def _verdict_words(p: stats.Paired) -> str:
  return {"b > a": "worse", "b < a": "better"}.get(p.verdict, p.verdict)


def _pair_cells(a: dict, b: dict) -> list[str]:
  common = sorted(set(a) & set(b))
  if len(common) < 2:
    return ["-", "-", "-", "-"]
  p = stats.paired([_test(a[s]) for s in common], [_test(b[s]) for s in common])
  return [
    f"{p.mean:+.4f} ({len(common)})",
    f"[{p.t_low:+.4f}, {p.t_high:+.4f}]",
    f"[{p.ci_low:+.4f}, {p.ci_high:+.4f}]",
    _verdict_words(p),
  ]


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
    vs_a = _pair_cells(chosen.get("A2", {}), seeds) if arm != "A2" else ["-"] * 4
    vs_q = _pair_cells(chosen.get("A2-qknorm", {}), seeds) if arm != "A2-qknorm" else ["-"] * 4
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
      crow.append([f"{arm_b} - {arm_a}", *_pair_cells(chosen[arm_a], chosen[arm_b])])
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
  text = "-" if s0 is None else f"{_val(s0):.3f}"
  mean = _cell_mean(arm_runs, cell)
  return text if mean is None else f"{text} / {mean:.3f}"


def _large_tables(by: dict, best: dict) -> list[str]:
  rows = []
  for arm, arm_runs in by.items():
    tried = _tried(arm_runs)
    f = tried[0][1] if tried else _UNUSED_FRAME_RATE
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
  by = _by_arm(runs)
  best = best_cells(runs)
  if is_large(runs):
    return _large_tables(by, best) + _best_tables(by, best)
  return _grid_tables(by, best) + _sweep_table(runs) + _best_tables(by, best)
