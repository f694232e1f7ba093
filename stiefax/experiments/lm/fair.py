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

from typing import Iterable
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments.lm.config import SWEEP_RATES
from stiefax.experiments.lm.runs import best_of
from stiefax.experiments.lm.runs import loss_of
from stiefax.experiments.lm.runs import round_rate

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
  "is_study2",
  "is_large",
  "best_cells",
  "by_arm",
  "tried_cells",
  "val_loss",
  "UNUSED_FRAME_RATE",
  "STUDY1_FRAME_LR",
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
UNUSED_FRAME_RATE = 1.0

#: Study 1's frame rate (its Riemannian rate, 1.0, the paper's).
STUDY1_FRAME_LR = 1.0

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
    return [(a, UNUSED_FRAME_RATE) for a in A2_RATES]
  if arm == "A2-temp":
    return [(a, UNUSED_FRAME_RATE) for a in E2_ADAMW_RATES]
  if arm == "A2-qknorm":  # study 1's sweep, reused
    return [(a, UNUSED_FRAME_RATE) for a in SWEEP_RATES]
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


def val_loss(run: dict) -> float:
  """A run's final validation loss, ``min(loss, loss at init)`` (:func:`loss_of`)."""
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
  means = {c: float(np.mean([val_loss(by[(c, s)]) for s in seeds])) for c in wanted}
  return best_of(means)


def _arm_mean(runs: Sequence[dict], arm: str, frame_best: float) -> Optional[tuple[float, Cell]]:
  mine = [r for r in runs if r["arm"] == arm]
  cell = select_cell(mine, cells(arm, frame_best))
  if cell is None:
    return None
  by = {(cell_of(r), r["seed"]): r for r in mine}
  return float(np.mean([val_loss(by[(cell, s)]) for s in SELECTION_SEEDS])), cell


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


#: How many cells :func:`around` gives an arm on the larger model.
_AROUND_CELLS = 3


def around(cell: Cell) -> list[Cell]:
  """The larger model's cells of an arm whose small-model best cell is ``cell``: its
  AdamW rate and the rates x3 either side, the frame rate kept."""
  a, f = cell
  return [(round_rate(a / 3), f), (a, f), (round_rate(a * 3), f)]


#: Arms that exist only in study 2; a setting with one of them, or with a frame rate
#: other than 1.0, is study 2's (:func:`is_study2`; its report:
#: :mod:`stiefax.experiments.lm.fair_tables`).
NEW_ARMS = ("B2-temp", "B2-fold", "A2-temp", "B2-diag")


def _own(run: dict) -> bool:
  return run["config"]["arm"]["rule"] != "adamw" and not run["config"]["arm"]["frozen"]


def is_study2(runs: Sequence[dict]) -> bool:
  """Whether a setting's runs hold study 2's arms or frame rates, or its larger model."""
  return any(
    r["arm"] in NEW_ARMS
    or (_own(r) and float(r["config"]["frame_lr"]) != STUDY1_FRAME_LR)
    or r["config"]["preset"] == LARGE_PRESET
    for r in runs
  )


def is_large(runs: Sequence[dict]) -> bool:
  """Whether a setting's runs are of study 2's larger model."""
  return bool(runs) and runs[0]["config"]["preset"] == LARGE_PRESET


def by_arm(runs: Sequence[dict]) -> dict:
  """``{arm: {(cell, seed): run}}`` of ``runs``."""
  out: dict = {}
  for r in runs:
    out.setdefault(r["arm"], {})[(cell_of(r), r["seed"])] = r
  return out


def tried_cells(arm_runs: dict) -> list[Cell]:
  """The cells of one arm's ``{(cell, seed): run}`` that ran a selection seed."""
  return sorted({c for c, s in arm_runs if s in SELECTION_SEEDS})


def best_cells(runs: Sequence[dict]) -> dict:
  """``{arm: cell}``: each arm's best cell under the protocol, where it can be chosen.

  On the larger model an arm's cells are the three it was given (:func:`around` its
  small-model best), so the best is chosen among the cells it ran, once it has run
  all three, on :data:`LARGE_SELECTION_SEEDS`.
  """
  by = by_arm(runs)
  out: dict = {}
  if is_large(runs):
    for arm, arm_runs in by.items():
      tried = tried_cells(arm_runs)
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
