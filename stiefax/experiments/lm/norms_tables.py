"""The report of study 3 of docs/lm.md (``results/lm-norms``): constant-norm matrices.

For each model (the ``sweep`` preset, then the ``large`` one) and each arm of
:data:`stiefax.experiments.lm.norms.ARMS`:

* **the grid**: the final validation loss (bits per byte, ``min(loss, loss at init)``,
  mean over the selection seeds 0-1) at every rate of the arm's swept rate
  (:func:`stiefax.experiments.lm.norms.swept`), its best (``*``), and whether the grid
  is final, still open, or ends with its best at an edge the protocol may not extend;
* **the tuning budget**: rates and runs each arm was given, the rates the bracketing
  added on each side, and the core-hours its runs took;
* **the learning-rate sensitivity**: Wortsman et al.'s mean excess loss over the grid,
  and the excess loss one x3 step either side of the best, which compares arms whose
  grids differ in span;
* **each arm at its best rate**: the test loss over its seeds (0-5), and the paired
  differences to A2 and to A2-qknorm with the paired-t and bootstrap intervals and the
  verdict of the statistical standard (:func:`stiefax.experiments.stats.verdict`);
  the largest attention logit and the attention entropy of the same runs;
* **transfer** (larger model only): per arm, the larger model's validation loss at the
  small model's best rate minus its loss at its own best (mean over seeds 0-1), and how
  many x3 steps the best moved.

Figures (``out_dir``): loss against the swept rate per arm, one panel per model, and
the validation-loss curves of each arm at its best rate.

Which runs count is the command's rule (:mod:`stiefax.experiments.lm.norms`): an arm's
runs at its study-3 settings (:func:`stiefax.experiments.lm.norms.fixed`), its grid as
the runs decide it (:func:`stiefax.experiments.lm.norms.bracket`), its best once the
grid is final (:func:`stiefax.experiments.lm.norms.best`).
"""

from __future__ import annotations

import math
import pathlib
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import report as report_lib
from stiefax.experiments import stats
from stiefax.experiments.lm import norms
from stiefax.experiments.lm.config import ARMS
from stiefax.experiments.lm.config import PRESETS
from stiefax.experiments.lm.runs import diverged
from stiefax.experiments.lm.runs import loss_of
from stiefax.experiments.lm.runs import paired_loss_cells
from stiefax.experiments.lm.runs import run_config
from stiefax.experiments.report import num
from stiefax.experiments.report import table

__all__ = ["is_study3", "Grid", "grids", "report"]

#: The arms every other arm is paired against.
BASELINES = ("A2", "A2-qknorm")

#: The seeds of a verdict (the selection seeds and seeds 2-5 at the best rate).
VERDICT_SEEDS = (0, 1, 2, 3, 4, 5)


def is_study3(runs: Sequence[dict]) -> bool:
  """Whether ``runs`` hold an arm of study 3 that trains its matrices by a matrix rule."""
  return any(r["arm"] in norms.ARMS and norms.swept(r["arm"]) == "matrix_lr" for r in runs)


class Grid:
  """One arm's study-3 runs on one model, and what the protocol reads from them.

  Attributes:
    arm: the arm's name.
    preset: the model's preset.
    runs: the arm's runs at its study-3 settings on that model.
    begin: where its grid starts (the larger model's: around the small model's best).
    rates: its grid as the runs decide it (:func:`norms.bracket`).
    final: whether every rate has its selection seeds and no extension is due.
    best: its best swept rate once final, else None.
    at_edge: whether that best is the lowest or the highest rate of the final grid.
  """

  def __init__(self, arm: str, preset: str, runs: list[dict], begin: Sequence[float]) -> None:
    self.arm, self.preset, self.runs, self.begin = arm, preset, runs, tuple(begin)
    self.rates, self.final = norms.bracket(runs, begin)
    found = norms.best(runs, begin) if self.final else None
    self.best: Optional[float] = None if found is None else found[0]
    self.at_edge = bool(found and found[1])

  def seeds_at(self, rate: float) -> dict:
    """``{seed: run}`` at ``rate``."""
    return {r["seed"]: r for r in self.runs if norms.cell_of(r) == rate}

  def mean(self, rate: float) -> Optional[float]:
    """Mean validation loss over the selection seeds at ``rate`` (None if one is missing)."""
    seeds = self.seeds_at(rate)
    if any(s not in seeds for s in norms.SELECTION_SEEDS):
      return None
    return float(np.mean([loss_of(seeds[s]) for s in norms.SELECTION_SEEDS]))

  def added(self) -> tuple[int, int]:
    """The rates the bracketing added below and above the grid's start."""
    return (
      sum(x < min(self.begin) for x in self.rates),
      sum(x > max(self.begin) for x in self.rates),
    )


_RATES = ("adamw_lr", "frame_lr", "matrix_lr")


def _settings(run: dict) -> bool:
  """Whether ``run`` is at its arm's study-3 settings: its preset's configuration, on
  its own text, and the rates of :func:`norms.fixed` but for the swept one."""
  cfg = run["config"]
  preset = PRESETS.get(cfg["preset"])
  if preset is None or run["arm"] not in ARMS:
    return False
  ref = run_config(ARMS[run["arm"]], preset, cfg["corpus"], cfg["preset"])
  if {k: v for k, v in cfg.items() if k not in _RATES} != {
    k: v for k, v in ref.items() if k not in _RATES
  }:
    return False
  keep = norms.fixed(run["arm"], preset.matrix_lr)
  return all(cfg.get(k, v) == v for k, v in keep.items())


def grids(runs: Sequence[dict]) -> dict[str, dict[str, Grid]]:
  """``{preset: {arm: Grid}}`` of the study-3 runs in ``runs`` (small model first)."""
  mine = [r for r in runs if r["arm"] in norms.ARMS and _settings(r)]
  out: dict[str, dict[str, Grid]] = {}
  for preset in (norms.SMALL_PRESET, norms.LARGE_PRESET):
    at = [r for r in mine if r["config"]["preset"] == preset]
    if not at:
      continue
    out[preset] = {}
    for arm in norms.ARMS:
      arm_runs = [r for r in at if r["arm"] == arm]
      if not arm_runs:
        continue
      if preset == norms.LARGE_PRESET:
        small = out.get(norms.SMALL_PRESET, {}).get(arm)
        if small is None or small.best is None:
          continue  # the larger grid starts at the small model's best: not known
        begin = norms.start(arm, preset, small.best)
      else:
        begin = norms.start(arm, preset)
      out[preset][arm] = Grid(arm, preset, arm_runs, begin)
  return out


def _swept_name(arm: str) -> str:
  return {"adamw_lr": "AdamW", "frame_lr": "frame", "matrix_lr": "matrix"}[norms.swept(arm)]


def _state(g: Grid) -> str:
  """``inside`` (final, its best inside), ``open``, or ``low edge``/``high edge``."""
  if not g.final:
    return "open"
  if g.at_edge:
    return f"{'low' if g.best == g.rates[0] else 'high'} edge"
  return "inside"


def _rate(x: Optional[float]) -> str:
  return num(x, ".3g")


#: Rates per line of the grid table (an arm with more continues on the next line), so
#: that the table fits a page's 80-character code column.
_PER_LINE = 3


def _grid_table(model: dict[str, Grid]) -> list[str]:
  rows = []
  for arm, g in model.items():
    shown = [f"{_rate(x)}{'*' if x == g.best else ''}: {num(g.mean(x), '.3f')}" for x in g.rates]
    for i in range(0, len(shown), _PER_LINE):
      first = i == 0
      rows.append(
        [
          arm if first else "",
          _swept_name(arm) if first else "",
          _state(g) if first else "",
          "; ".join(shown[i : i + _PER_LINE]),
        ]
      )
  return [
    "  each arm's grid: final validation loss, bits per byte, mean over seeds 0-1, at",
    "  each rate of its swept rate ('-': a seed is missing; *: its best). grid:",
    "  inside (final, its best inside), open (rates left to run), low or high edge",
    f"  (its best at that edge after the {norms.MAX_EXTENSIONS} added rates the protocol allows)",
    table(["arm", "swept", "grid", "rate: loss"], rows),
    "",
  ]


def _hours(rs: Sequence[dict]) -> float:
  return sum(float(r.get("wall_time") or 0.0) for r in rs) / 3600


def _budget_table(model: dict[str, Grid]) -> list[str]:
  rows = []
  for arm, g in model.items():
    low, high = g.added()
    sel = [r for r in g.runs if r["seed"] in norms.SELECTION_SEEDS and norms.cell_of(r) in g.rates]
    rows.append(
      [
        arm,
        str(len(g.rates)),
        f"{_rate(min(g.rates))}-{_rate(max(g.rates))}",
        f"{low} / {high}",
        str(len(sel)),
        str(len(g.runs)),
        f"{_hours(g.runs):.2f}",
      ]
    )
  return [
    "  tuning budget: rates in the grid, their span, rates the bracketing added below /",
    "  above the start, runs at seeds 0-1 (selection), all runs, core-hours of all runs",
    table(["arm", "rates", "span", "added", "selection runs", "runs", "core-hours"], rows),
    "",
  ]


def _excess(g: Grid, j: int, top: float) -> str:
  """The loss at ``g.rates[j]`` minus the best loss, and the rate ('-' if none)."""
  m = g.mean(g.rates[j]) if 0 <= j < len(g.rates) else None
  return "-" if m is None else f"{m - top:+.3f} ({_rate(g.rates[j])})"


def _sensitivity_table(model: dict[str, Grid]) -> list[str]:
  rows = []
  for arm, g in model.items():
    top = None if g.best is None else g.mean(g.best)
    if g.best is None or top is None:
      rows.append([arm, "-", "-", "-"])
      continue
    vals = [m for m in (g.mean(x) for x in g.rates) if m is not None]
    i = g.rates.index(g.best)
    sens = f"{float(np.mean(vals)) - top:.3f} ({len(vals)})"
    rows.append([arm, sens, _excess(g, i - 1, top), _excess(g, i + 1, top)])
  return [
    "  learning-rate sensitivity: mean over the grid of loss - best loss (Wortsman",
    "  et al.; (n) rates), and the excess loss at the grid's rates next to the best",
    "  (rate)",
    table(["arm", "sensitivity (n)", "next lower", "next higher"], rows),
    "",
  ]


def _test(run: dict) -> float:
  return loss_of(run, "test_bpb")


def _best_seeds(g: Grid) -> dict:
  if g.best is None:
    return {}
  return {s: r for s, r in g.seeds_at(g.best).items() if s in VERDICT_SEEDS}


def _best_tables(model: dict[str, Grid]) -> list[str]:
  chosen = {arm: _best_seeds(g) for arm, g in model.items() if g.best is not None}
  if not chosen:
    return []
  rows, attn = [], []
  for arm, seeds in chosen.items():
    rs = list(seeds.values())
    mean, std = stats.summarize([_test(r) for r in rs])
    spread = f"{mean:.4f}" if len(rs) < 2 else f"{mean:.4f} ± {std:.4f}"
    rows.append([arm, _rate(model[arm].best), str(len(rs)), spread])
    m = [r["metrics"] for r in rs]
    attn.append(
      [
        arm,
        f"{np.nanmax([x['max_logit_max'] for x in m]):.1f}",
        f"{np.nanmean([x['entropy'] for x in m]):.2f}",
        str(sum(diverged(r) for r in rs)),
      ]
    )
  lines = [
    "  each arm at its best rate: test loss, bits per byte, mean ± std over its seeds",
    table(["arm", "best rate", "seeds", "test bpb"], rows),
    "",
  ]
  for base in BASELINES:
    if base not in chosen:
      continue
    crow = [
      [f"{arm} - {base}", *paired_loss_cells(chosen[base], seeds)]
      for arm, seeds in chosen.items()
      if arm != base
    ]
    lines += [
      f"  against {base}: test loss Δ = arm - {base}, bits per byte, paired by seed",
      "  (negative is better; (n) paired seeds)",
      table(["arm - base", "Δ (n)", "t 95% CI", "bootstrap 95% CI", "verdict"], crow),
      "",
    ]
  lines += [
    f"  verdict: both 95% intervals agree, on >= {stats.MIN_SEEDS} paired seeds;"
    " otherwise not settled.",
    "",
    "  the same runs' attention: largest logit max |q·k|/sqrt(r) during training (max over",
    "  seeds), entropy at the end (nats, mean over seeds), diverged runs",
    table(["arm", "max logit", "entropy", "diverged"], attn),
    "",
  ]
  return lines


def _transfer_table(small: dict[str, Grid], large: dict[str, Grid]) -> list[str]:
  rows = []
  for arm, g in large.items():
    s = small[arm].best
    assert s is not None  # a larger grid exists only once the small best is known
    at_small = g.mean(s)
    own = None if g.best is None else g.mean(g.best)
    moved = "-" if g.best is None else f"{round(math.log(g.best / s, 3)):+d}"
    gap = None if at_small is None or own is None else at_small - own
    rows.append(
      [
        arm,
        _rate(s),
        _rate(g.best),
        moved,
        num(at_small, ".4f"),
        num(own, ".4f"),
        num(gap, "+.4f"),
      ]
    )
  return [
    "  transfer: the larger model's validation loss (mean over seeds 0-1) at the",
    "  small model's best rate and at its own best; x3 steps the best moved; the gap",
    "  (0: the small model's rate is the larger model's best)",
    table(
      ["arm", "small best", "large best", "steps", "at small best", "at own best", "gap"],
      rows,
    ),
    "",
  ]


def _color(arm: str) -> str:
  """One colour per arm in every figure and panel: its place among study 3's arms."""
  return f"C{norms.ARMS.index(arm) % 10}" if arm in norms.ARMS else "k"


def _model_name(preset: str) -> str:
  return {norms.SMALL_PRESET: "small model", norms.LARGE_PRESET: "larger model"}.get(preset, preset)


def _plots(by_model: dict[str, dict[str, Grid]], out_dir: pathlib.Path) -> list[str]:
  plt = report_lib.pyplot()
  if plt is None:
    return []
  made = []
  fig, axes = plt.subplots(1, len(by_model), figsize=(6 * len(by_model), 4), squeeze=False)
  for ax, (preset, model) in zip(axes[0], by_model.items()):
    for arm, g in model.items():
      pts = [(x, g.mean(x)) for x in g.rates]
      pts = [(x, m) for x, m in pts if m is not None]
      if pts:
        xs, ys = zip(*pts)
        label = f"{arm} ({_swept_name(arm)})"
        ax.plot(xs, ys, marker="o", label=label, color=_color(arm))
    ax.set_xscale("log")
    ax.set_xlabel("swept peak learning rate")
    ax.set_title(f"{_model_name(preset)}: loss against each arm's swept rate")
    ax.legend(fontsize=7)
  axes[0][0].set_ylabel("final validation loss (bits/byte)")
  fig.tight_layout()
  made.append(report_lib.save_figure(fig, plt, out_dir, "lm_norms_rates.png"))
  for preset, model in by_model.items():
    fig, ax = plt.subplots(figsize=(6, 4))
    ends = []
    for arm, g in model.items():
      hs = [r["history"] for r in _best_seeds(g).values() if not diverged(r)]
      if hs:
        n = min(len(h["val_bpb"]) for h in hs)
        curve = np.asarray(np.mean([h["val_bpb"][:n] for h in hs], axis=0))
        ax.plot(hs[0]["step"][:n], curve, label=f"{arm} ({len(hs)} seeds)", color=_color(arm))
        ends.append(curve)
    if ends and min(len(c) for c in ends) > 2:
      low = min(float(np.min(c)) for c in ends)
      ax.set_ylim(low - 0.05, max(float(c[2]) for c in ends) + 0.05)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (bits/byte)")
    ax.set_title(f"{_model_name(preset)}: each arm at its best rate (mean over seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    made.append(report_lib.save_figure(fig, plt, out_dir, f"lm_norms_{preset}_best_curves.png"))
  return [f"  plot: {p}" for p in made if p]


def report(runs: Sequence[dict], out_dir: Optional[pathlib.Path]) -> list[str]:
  """The tables of study 3 (and its figures in ``out_dir``; none when it is None)."""
  by_model = grids(runs)
  lines = ["study 3 (docs/lm.md): constant-norm matrices", ""]
  names = {norms.SMALL_PRESET: "the small model", norms.LARGE_PRESET: "the larger model"}
  for preset, model in by_model.items():
    lines += [f"study 3, {names[preset]} (preset {preset}):", ""]
    lines += _grid_table(model)
    lines += _budget_table(model)
    lines += _sensitivity_table(model)
    lines += _best_tables(model)
    if preset == norms.LARGE_PRESET and model:
      lines += _transfer_table(by_model[norms.SMALL_PRESET], model)
  if out_dir is not None and by_model:
    lines += _plots(by_model, pathlib.Path(out_dir))
  return lines
