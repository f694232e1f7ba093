"""Which cells ``stiefax lm`` runs, read from the finished runs of a folder.

Study 1's best AdamW rate (``--lr best``), study 2's best cells and the larger model's
cells around them (``--lr best --select-from fair``, ``--lr around``, ``--arms
study2-*``), and study 3's bracketed grids, best cells and larger-model arms (``--lr
bracket``, ``--lr best --select-from norms``, ``--arms norms-large``). Each raises
:class:`~stiefax.experiments.flags.CommandError` while the runs it needs are not
finished.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Any
from typing import Optional

from stiefax.experiments.flags import CommandError
from stiefax.experiments.lm import fair
from stiefax.experiments.lm import norms
from stiefax.experiments.lm import runs as runs_lib
from stiefax.experiments.lm.config import ARMS
from stiefax.experiments.lm.config import PRESETS
from stiefax.experiments.lm.config import SWEEP_RATES
from stiefax.experiments.lm.config import LMConfig
from stiefax.experiments.report import load_runs

__all__ = [
  "small_runs",
  "study2_arm",
  "around_cells",
  "norms_runs",
  "norms_begin",
  "norms_cells",
  "norms_large_arms",
  "setting_runs",
  "warn_skipped",
  "best_cell",
  "best_rate",
]

_WARNED: set = set()


def small_runs(src: pathlib.Path, arm: str, facts: dict) -> list[dict]:
  """The small-model runs of study 2 of ``arm`` in ``src``."""
  return setting_runs(src, arm, PRESETS[fair.SMALL_PRESET], facts, fair.SMALL_PRESET)


def study2_arm(name: str, src: pathlib.Path, facts: dict) -> str:
  """The arm :data:`STUDY2_ARMS`' ``name`` stands for among study 2's runs in ``src``.

  Raises CommandError while a candidate's cells lack a selection seed.
  """
  runs = [r for arm in fair.STIEFEL_ARMS for r in small_runs(src, arm, facts)]
  best = fair.best_stiefel_arm(runs)
  if best is None:
    raise CommandError(
      f"--arms {name}: the cells of study 2's Stiefel arms ({', '.join(fair.STIEFEL_ARMS)})"
      f" in {src} are not finished at seeds 0-1."
    )
  return best if name == "best-stiefel" else fair.qknorm_partner(best)


def around_cells(src: pathlib.Path, arm: str, facts: dict) -> list[tuple[float, float]]:
  """``arm``'s cells on the larger model: its best cell of study 2's small model in
  ``src`` and the AdamW rates x3 either side (:func:`stiefax.experiments.lm.fair.around`)."""
  frame_best = None
  if arm in fair.E2_ARMS:
    frame_best = best_cell(src, "B2", PRESETS[fair.SMALL_PRESET], facts, fair.SMALL_PRESET)[1]
  small = best_cell(src, arm, PRESETS[fair.SMALL_PRESET], facts, fair.SMALL_PRESET, frame_best)
  return fair.around(small)


def norms_runs(
  out: pathlib.Path, arm: str, config: LMConfig, facts: dict, preset: str
) -> list[dict]:
  """``arm``'s finished runs of study 3's setting in ``out``: the preset's
  configuration, its settings other than the swept rate those of :func:`norms.fixed`."""
  keep = norms.fixed(arm, config.matrix_lr)
  mine = setting_runs(out, arm, config, facts, preset)
  return [r for r in mine if all(r["config"].get(k, v) == v for k, v in keep.items())]


def norms_begin(
  arm: str, preset: str, out: pathlib.Path, src: pathlib.Path, facts: dict
) -> tuple[float, ...]:
  """Where ``arm``'s grid of study 3 starts on ``preset`` (the larger model: around the
  small model's best in ``src``). Raises CommandError while that best is not final."""
  if preset != norms.LARGE_PRESET:
    return norms.start(arm, preset)
  small = PRESETS[norms.SMALL_PRESET]
  found = norms.best(norms_runs(src, arm, small, facts, norms.SMALL_PRESET), norms.start(arm, ""))
  if found is None:
    raise CommandError(f"--lr bracket: {arm}'s small-model grid in {src} is not final yet.")
  return norms.start(arm, preset, found[0])


def norms_cells(
  arm: str,
  config: LMConfig,
  preset: str,
  out: pathlib.Path,
  src: pathlib.Path,
  facts: dict,
  best: bool,
) -> list[LMConfig]:
  """The configurations of ``arm``'s cells of study 3: its bracketed grid as far as the
  runs in ``out`` decide it, or (``best``) its best cell once the grid is final."""
  try:
    field = norms.swept(arm)
  except ValueError as e:
    raise CommandError(f"--lr {'best' if best else 'bracket'}: {e}.") from None
  begin = norms_begin(arm, preset, out, src, facts)
  runs = norms_runs(out, arm, config, facts, preset)
  if best:
    found = norms.best(runs, begin)
    if found is None:
      raise CommandError(f"--lr best --select-from norms: {arm}'s grid in {out} is not final yet.")
    rates = [found[0]]
  else:
    rates = norms.bracket(runs, begin)[0]
  keep: dict[str, Any] = norms.fixed(arm, config.matrix_lr)
  return [dataclasses.replace(config, **{**keep, field: x}) for x in rates]


def norms_large_arms(src: pathlib.Path, facts: dict) -> list[str]:
  """Study 3's arms for the larger model: A2, A2-qknorm and every arm whose best cell
  on the small model (mean validation loss, seeds 0-1) is within 0.01 bits per byte of
  the best arm's. Raises CommandError while a small-model grid is not final."""
  small = PRESETS[norms.SMALL_PRESET]
  scores = {}
  for arm in norms.ARMS:
    runs = norms_runs(src, arm, small, facts, norms.SMALL_PRESET)
    found = norms.best(runs, norms.start(arm, norms.SMALL_PRESET))
    if found is None:
      raise CommandError(f"--arms norms-large: {arm}'s small-model grid in {src} is not final.")
    at = [r for r in runs if norms.cell_of(r) == found[0] and r["seed"] in norms.SELECTION_SEEDS]
    scores[arm] = sum(runs_lib.loss_of(r) for r in at) / len(at)
  top = min(scores.values())
  near = [a for a in norms.ARMS if scores[a] <= top + 0.01]
  return list(dict.fromkeys(["A2", "A2-qknorm", *near]))


def setting_runs(
  out: pathlib.Path, arm: str, config: LMConfig, facts: dict, preset: str
) -> list[dict]:
  """The finished runs of ``arm`` in ``out`` whose configuration is ``config``'s but
  for the AdamW and frame rates."""
  groups, warnings = load_runs(out) if out.is_dir() else ({}, [])
  warn_skipped(warnings)
  ref = runs_lib.run_config(ARMS[arm], config, facts, preset)
  same = lambda c: {k: v for k, v in c.items() if k not in ("adamw_lr", "frame_lr", "matrix_lr")}
  return [r for r in groups.get("lm", []) if r["arm"] == arm and same(r["config"]) == same(ref)]


def warn_skipped(warnings: list) -> None:
  """Prints each line of ``warnings`` (the run files skipped) once per process."""
  for w in warnings:
    if w not in _WARNED:
      _WARNED.add(w)
      print(f"stiefax lm: warning: {w}", file=sys.stderr, flush=True)


def best_cell(
  out: pathlib.Path,
  arm: str,
  config: LMConfig,
  facts: dict,
  preset: str,
  frame_best: Optional[float] = None,
) -> tuple[float, float]:
  """``(AdamW rate, frame rate)`` of ``arm``'s best cell in study 2's grid
  (:mod:`stiefax.experiments.lm.fair`) among the finished runs in ``out``.

  Raises CommandError while a cell lacks a selection seed.
  """
  try:
    wanted = fair.cells(arm, frame_best)
  except ValueError as e:
    raise CommandError(f"--select-from fair: {e}") from None
  mine = setting_runs(out, arm, config, facts, preset)
  cell = fair.select_cell(mine, wanted)
  if cell is None:
    gaps = fair.missing(mine, wanted)
    shown = ", ".join(f"lr {a:g} frame-lr {f:g} seed {s}" for (a, f), s in gaps[:4])
    raise CommandError(
      f"best: {arm}'s cells of study 2 in {out} are not finished ({len(gaps)} run(s) missing:"
      f" {shown}{', ...' if len(gaps) > 4 else ''})."
    )
  return cell


def best_rate(out: pathlib.Path, arm: str, config: LMConfig, facts: dict, preset: str) -> float:
  """The AdamW rate of ``arm`` chosen on the validation split among the finished runs
  of this configuration in ``out`` (:func:`stiefax.experiments.lm.runs.select_rate`).

  Raises CommandError when there are none.
  """
  mine = [
    r
    for r in setting_runs(out, arm, config, facts, preset)
    if r["config"]["frame_lr"] == config.frame_lr
  ]
  have = {r["config"]["adamw_lr"] for r in mine}
  missing = [f"{lr:g}" for lr in SWEEP_RATES if lr not in have]
  if missing:
    raise CommandError(
      f"--lr best: the {arm} sweep in {out} is not finished (no run at rate"
      f" {','.join(missing)}); run --lr {','.join(f'{lr:g}' for lr in SWEEP_RATES)} first."
    )
  lr = runs_lib.select_rate([r for r in mine if r["config"]["adamw_lr"] in SWEEP_RATES])
  if lr is None:
    raise CommandError(f"--lr best: no seed of {arm} has every rate in {out}.")
  return lr
