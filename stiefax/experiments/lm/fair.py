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
results folder cannot pick a best from half a cell.
"""

from __future__ import annotations

import math
from typing import Iterable
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments.lm.config import SWEEP_RATES

__all__ = [
  "SELECTION_SEEDS",
  "E1_FRAME_RATES",
  "E1_ADAMW_RATES",
  "A2_RATES",
  "E2_ADAMW_RATES",
  "E2_ARMS",
  "Cell",
  "cells",
  "cell_of",
  "select_cell",
]

Cell = tuple[float, float]  # (AdamW peak rate, frame peak rate)

#: The seeds every cell of the grid runs; the best cell is chosen on them.
SELECTION_SEEDS = (0, 1)

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
  if arm in E2_ARMS:
    if frame_best is None:
      raise ValueError(f"{arm}: its cells are at E1's best frame rate; give frame_best")
    return [(a, frame_best) for a in E2_ADAMW_RATES]
  raise ValueError(
    f"arm {arm!r} is not in study 2; its arms are B2, A2, A2-temp, {', '.join(E2_ARMS)}"
  )


def cell_of(run: dict) -> Cell:
  """A run's ``(AdamW rate, frame rate)``."""
  cfg = run["config"]
  return (float(cfg["adamw_lr"]), float(cfg["frame_lr"]))


def _val(run: dict) -> float:
  """``min(val loss, loss at init)``; a diverged run's loss is its loss at init."""
  m = run["metrics"]
  init, v = m["init_val_bpb"], m.get("val_bpb")
  if m["diverged"] or v is None or not math.isfinite(v):
    return init
  return min(v, init)


def missing(runs: Iterable[dict], wanted: Sequence[Cell]) -> list[tuple[Cell, int]]:
  """The ``(cell, seed)`` of :data:`SELECTION_SEEDS` in ``wanted`` that ``runs`` lack."""
  have = {(cell_of(r), r["seed"]) for r in runs}
  return [(c, s) for c in wanted for s in SELECTION_SEEDS if (c, s) not in have]


def select_cell(runs: Iterable[dict], wanted: Sequence[Cell]) -> Optional[Cell]:
  """The cell of ``wanted`` with the lowest mean validation loss over the selection
  seeds (ties: smaller AdamW rate, then smaller frame rate); None while a cell lacks
  one of those seeds. ``runs`` are one arm's runs of one setting."""
  runs = list(runs)
  if missing(runs, wanted):
    return None
  by = {(cell_of(r), r["seed"]): r for r in runs}
  means = {c: float(np.mean([_val(by[(c, s)]) for s in SELECTION_SEEDS])) for c in wanted}
  return min(means, key=lambda c: (means[c], c))
