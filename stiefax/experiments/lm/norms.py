"""Study 3 of docs/lm.md: constant-norm matrices, each arm's grid and its best cell.

A cell is ``(AdamW rate, frame rate, matrix rate)``. Each arm sweeps one of the three,
its *swept rate* (:func:`swept`): A2 and A2-qknorm their AdamW rate (every parameter),
B2 its frame rate (at AdamW 1e-2, study 2's best), every arm with a matrix rule its
matrix rate (the rest at AdamW :data:`REST_LR`, B2-H's frames at :data:`B2H_FRAME_LR`).

The grid of an arm starts at :func:`start` and is *bracketed*: once every rate of it
has its selection seeds (:data:`SELECTION_SEEDS`) finished, a best (lowest mean
validation loss) at the lowest or the highest rate adds the rate x3 beyond it, until
the best is interior or :data:`MAX_EXTENSIONS` rates were added on that side (the
report then says the best sits at an edge). On the larger model each arm starts at
its small-model best swept rate and x3 either side, and is bracketed the same way.
"""

from __future__ import annotations

from typing import Iterable
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments.lm.runs import loss_of
from stiefax.experiments.lm.runs import round_rate

__all__ = [
  "SMALL_PRESET",
  "LARGE_PRESET",
  "SELECTION_SEEDS",
  "REST_LR",
  "B2H_FRAME_LR",
  "MAX_EXTENSIONS",
  "ARMS",
  "swept",
  "start",
  "fixed",
  "cell_of",
  "bracket",
  "best",
]

SMALL_PRESET = "sweep"
LARGE_PRESET = "large"

#: The seeds every rate of a grid has; the best cell is chosen on their mean.
SELECTION_SEEDS = (0, 1)

#: AdamW's rate on the embeddings, norm scales and vectors of the arms with a matrix
#: rule: A2's best rate of study 2 on the small model, on both models.
REST_LR = 5.5e-3

#: B2's AdamW rate in its frame-rate grid (its best of study 2).
B2_ADAMW_LR = 1e-2

#: B2-H's frame rate: B2's best of study 2.
B2H_FRAME_LR = 0.1

#: The most rates a grid adds beyond each of its starting edges.
MAX_EXTENSIONS = 4

#: The frame rate recorded by the arms without a frame rule (unused by them).
_NO_FRAME_RATE = 1.0

#: The arms of study 3, in report order.
ARMS = ("A2", "A2-qknorm", "B2", "AdamH", "AdamH-qknorm", "Muon", "MuonH", "B2-H", "SphereAdam")

_SWEPT = {"A2": "adamw_lr", "A2-qknorm": "adamw_lr", "B2": "frame_lr"}

#: Where each arm's small-model grid starts. A2's and A2-qknorm's are study 2's
#: (reused); B2's adds 0.03 below study 2's frame rates; the matrix rules start at
#: x3 steps around the paper's rule eta = sqrt(lr lambda) for AdamW at 5.5e-3 and
#: decay 0.1 (0.023), and the sphere Adam around B2's best frame rate (0.1).
_SMALL_START = {
  "A2": (3e-4, 1e-3, 2e-3, 3e-3, 5.5e-3, 1e-2, 3e-2, 1e-1, 3e-1),
  "A2-qknorm": (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1),
  "B2": (0.03, 0.1, 0.3, 1.0),
  "AdamH": (3e-3, 1e-2, 3e-2),
  "AdamH-qknorm": (3e-3, 1e-2, 3e-2),
  "Muon": (3e-3, 1e-2, 3e-2),
  "MuonH": (3e-3, 1e-2, 3e-2),
  "B2-H": (3e-3, 1e-2, 3e-2),
  "SphereAdam": (0.03, 0.1, 0.3),
}

Cell = tuple[float, float, float]


def swept(arm: str) -> str:
  """The configuration field ``arm`` sweeps: ``adamw_lr``, ``frame_lr`` or ``matrix_lr``."""
  if arm not in _SMALL_START:
    raise ValueError(f"{arm} is not an arm of study 3 ({', '.join(ARMS)})")
  return _SWEPT.get(arm, "matrix_lr")


def fixed(arm: str, matrix_lr: float) -> dict:
  """The cell's settings other than the swept rate (``matrix_lr``: the preset's)."""
  field = swept(arm)
  out = {"adamw_lr": REST_LR, "frame_lr": _NO_FRAME_RATE, "matrix_lr": matrix_lr}
  if arm == "B2":
    out["adamw_lr"] = B2_ADAMW_LR
  if arm == "B2-H":
    out["frame_lr"] = B2H_FRAME_LR
  del out[field]
  return out


def start(arm: str, preset: str, small_best: Optional[float] = None) -> tuple[float, ...]:
  """Where ``arm``'s grid starts: :data:`_SMALL_START` on the small model, the small
  model's best swept rate and x3 either side on the larger one."""
  if preset == LARGE_PRESET:
    if small_best is None:
      raise ValueError(f"{arm}: the larger model's grid needs the small model's best rate")
    return (round_rate(small_best / 3), small_best, round_rate(small_best * 3))
  return _SMALL_START[arm]


def cell_of(run: dict) -> float:
  """A run's swept rate."""
  return float(run["config"][swept(run["arm"])])


def _means(runs: Iterable[dict], rates: Sequence[float]) -> Optional[dict]:
  """``{rate: mean validation loss over the selection seeds}``, None while one lacks a seed."""
  by = {(cell_of(r), r["seed"]): r for r in runs}
  if any((x, s) not in by for x in rates for s in SELECTION_SEEDS):
    return None
  return {x: float(np.mean([loss_of(by[(x, s)]) for s in SELECTION_SEEDS])) for x in rates}


def bracket(runs: Iterable[dict], begin: Sequence[float]) -> tuple[list[float], bool]:
  """``(rates, done)``: the grid as far as ``runs`` (one arm, one setting) decide it.

  Starting from ``begin``, while every rate has its selection seeds and the best is at
  an edge that has fewer than :data:`MAX_EXTENSIONS` additions, the rate x3 beyond
  that edge joins. ``done`` says the grid is final: every rate has its seeds and the
  best is interior or at an edge that reached its limit.
  """
  runs = list(runs)
  rates = sorted(set(begin))
  added = {"low": 0, "high": 0}
  while True:
    means = _means(runs, rates)
    if means is None:
      return rates, False
    top = min(means, key=lambda x: (means[x], x))
    if top == rates[0] and added["low"] < MAX_EXTENSIONS:
      rates.insert(0, round_rate(rates[0] / 3))
      added["low"] += 1
    elif top == rates[-1] and added["high"] < MAX_EXTENSIONS:
      rates.append(round_rate(rates[-1] * 3))
      added["high"] += 1
    else:
      return rates, True


def best(runs: Iterable[dict], begin: Sequence[float]) -> Optional[tuple[float, bool]]:
  """``(best swept rate, at an edge)`` of the bracketed grid, None while it is not final."""
  runs = list(runs)
  rates, done = bracket(runs, begin)
  if not done:
    return None
  means = _means(runs, rates)
  assert means is not None
  top = min(means, key=lambda x: (means[x], x))
  return top, top in (rates[0], rates[-1])
