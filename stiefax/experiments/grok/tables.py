"""The report of grokking runs (printed by ``stiefax report``): tables and plots.

Per setting: per arm, how many runs memorized, grokked and sustained it (k/n), the
median epochs, the end and tail held-out accuracy (mean ± sample std), the training
collapses (:mod:`stiefax.experiments.grok.collapses`) and the final isometry error; the
paired difference of the tail mean against A2 with its t and bootstrap intervals and
the statistical standard's verdict; PNG plots of the accuracy, isometry and
effective-learning-rate histories.

Then the paper's studies (:data:`~stiefax.experiments.grok.config.STUDIES`), per preset
and budget: the five-seed runs (a) and (b) side by side, with their paired differences
and, below six paired seeds, a plain line that they are not settled; and Table 5, the
harnessing arms at seed 0 under run (a)'s A2 and B2. Rows without runs say so, so the
tables show what is still missing. They are printed for the paper preset, and for any
other preset once it holds more than the single-seed default runs.
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
from stiefax.experiments.grok.config import STUDIES
from stiefax.experiments.grok.config import Study

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


_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _seeds_words(n: int) -> str:
  """``"five seeds"``, ``"one seed"``, ``"12 seeds"``."""
  return f"{_WORDS[n] if n < len(_WORDS) else n} seed{'' if n == 1 else 's'}"


def _seed_list(seeds: Iterable[int]) -> str:
  """Seeds as ranges: ``0-4``, ``0,2-4``; ``-`` for none."""
  ordered: list[int] = sorted(set(seeds))
  parts: list[list[int]] = []
  for s in ordered:
    if parts and s == parts[-1][1] + 1:
      parts[-1][1] = s
    else:
      parts.append([s, s])
  return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts) or "-"


def _family(run: dict) -> str:
  c = run.get("config", {})
  return f"preset={c.get('preset')} epochs={c.get('epochs')} eval_every={c.get('eval_every')}"


def _studied(runs: Sequence[dict]) -> bool:
  """Whether a preset's runs get the study tables: the paper preset always; another once
  it holds more than seed 0 at the default setting of the arms it trains."""
  return any(
    r["config"].get("preset") == "paper"
    or r["seed"] != 0
    or r["config"].get("stabilize")
    or any(r["arm"] in s.arms and len(s.seeds) == 1 for s in STUDIES)
    for r in runs
  )


def _of_study(runs: Sequence[dict], study: Study) -> dict:
  """``{arm: [run, ...]}`` at the study's setting: its arms (every seed found, so that
  more seeds can settle it), then any other arm found there at several seeds."""
  by_arm: dict = {arm: [] for arm in study.arms}
  for r in runs:
    if bool(r["config"].get("stabilize")) == study.stabilize:
      by_arm.setdefault(r["arm"], []).append(r)
  return {
    arm: sorted(by_arm[arm], key=lambda r: r["seed"])
    for arm in _arm_order(by_arm)
    if arm in study.arms or len(by_arm[arm]) > 1
  }


def _k_of_n(ms: Sequence[dict], key: str) -> str:
  return f"{sum(m[key] is not None for m in ms)}/{len(ms)}"


def _missing(study: Study, by_arm: dict) -> list[str]:
  """``"<arm> seeds <list>"`` for each arm of ``study`` whose seeds are not all there."""
  out = []
  for arm in study.arms:
    left = set(study.seeds) - {r["seed"] for r in by_arm.get(arm, [])}
    if left:
      out.append(f"{arm} seed{'s' * (len(left) > 1)} {_seed_list(left)}")
  return out


def _five_seed_tables(runs: Sequence[dict]) -> str:
  """The multi-seed studies side by side, their paired differences against A2 and, below
  :data:`~stiefax.experiments.stats.MIN_SEEDS` paired seeds, the plain verdict."""
  studies = [s for s in STUDIES if len(s.seeds) > 1]
  rows, paired, plain, missing = [], [], [], []
  for study in studies:
    by_arm = _of_study(runs, study)
    left = _missing(study, by_arm)
    if left:
      missing.append(f"{study.name} {', '.join(left)}")
    for arm, rs in by_arm.items():
      if not rs:
        continue
      ms = [r["metrics"] for r in rs]
      tail_m, tail_s = stats.summarize([m["tail_test_acc"] for m in ms])
      rows.append(
        [
          study.name,
          arm,
          _seed_list(r["seed"] for r in rs),
          _k_of_n(ms, "grokked_epoch"),
          _k_of_n(ms, "sustained_epoch"),
          _median(m["grokked_epoch"] for m in ms),
          _median(m["sustained_epoch"] for m in ms),
          f"{tail_m:.3f}±{tail_s:.3f}",
        ]
      )
    base = report_lib.by_seed(by_arm.get("A2", []), "tail_test_acc")
    for arm, rs in by_arm.items():
      other = report_lib.by_seed(rs, "tail_test_acc")
      n = len(set(base) & set(other))
      if arm == "A2" or not n:
        continue
      pr = report_lib.paired_by_seed(base, other, scale=100.0, min_seeds=2)
      cells = report_lib.paired_cells(pr) if pr is not None else ["(needs >= 2 paired seeds)"]
      paired.append([study.name, f"{arm} - A2", str(n), *cells])
      if n < stats.MIN_SEEDS:
        plain.append(
          f"  {study.name}, {arm} - A2: {_seeds_words(n)}: not settled by the project's"
          f" standard (>= {stats.MIN_SEEDS} paired seeds, the paired-t and bootstrap 95%"
          " intervals agreeing)."
        )
  header = ["study", "arm", "seeds", "grok k/n", "sust k/n", "med grok epoch"]
  header += ["med sust epoch", "tail held-out"]
  width = 3 + 1 + len(report_lib.PAIRED_HEADER)
  title = "; ".join(f"{s.name}, paper {s.section}" for s in studies)
  seeds = " and ".join(sorted({_seed_list(s.seeds) for s in studies}))
  lines = [f"Five-seed studies ({title}; seeds {seeds}):", report_lib.table(header, rows)]
  if missing:
    lines.append(f"  no runs yet: {'; '.join(missing)}")
  lines += [
    "Paired difference of the tail held-out mean vs A2 (arm - A2, per seed, pp):",
    report_lib.table(
      ["study", "contrast", "n", "Δ pp", *report_lib.PAIRED_HEADER],
      [row + [""] * (width - len(row)) for row in paired],
    ),
    *plain,
  ]
  return "\n".join(lines)


def _table5(runs: Sequence[dict]) -> str:
  """Table 5: the harnessing arms at seed 0, under the five-seed A2 and B2 of run (a)."""
  (harness,) = [s for s in STUDIES if len(s.seeds) == 1]
  (baseline,) = [s for s in STUDIES if len(s.seeds) > 1 and s.stabilize == harness.stabilize]
  rows = []
  for arm, rs in _of_study(runs, baseline).items():
    if arm not in baseline.arms or not rs:
      continue
    ms = [r["metrics"] for r in rs]
    rows.append(
      [
        f"{arm} ({baseline.name})",
        _seed_list(r["seed"] for r in rs),
        _median(m["memorized_epoch"] for m in ms),
        f"{_median(m['grokked_epoch'] for m in ms)} ({_k_of_n(ms, 'grokked_epoch')})",
        f"{_median(m['sustained_epoch'] for m in ms)} ({_k_of_n(ms, 'sustained_epoch')})",
        f"{stats.summarize([m['end_test_acc'] for m in ms])[0]:.3f}",
        f"{stats.summarize([m['tail_test_acc'] for m in ms])[0]:.3f}",
        f"{max(m['final_isometry'] for m in ms):.2e}",
      ]
    )
  found = _of_study(runs, harness)
  for arm in harness.arms:
    for r in found[arm]:
      m = r["metrics"]
      rows.append(
        [
          arm,
          str(r["seed"]),
          _median([m["memorized_epoch"]]),
          _median([m["grokked_epoch"]]),
          _median([m["sustained_epoch"]]),
          f"{m['end_test_acc']:.3f}",
          f"{m['tail_test_acc']:.3f}",
          f"{m['final_isometry']:.2e}",
        ]
      )
  header = ["arm", "seeds", "memorized", "first >= 0.95", "sustained", "end held-out"]
  header += ["tail held-out", "final iso"]
  lines = [f"Table 5 (paper {harness.section}):", report_lib.table(header, rows)]
  left = _missing(harness, found)
  if left:
    lines.append(f"  no runs yet: {', '.join(left)}")
  lines.append(
    f"  ({baseline.name}'s rows: medians over seeds (k/n reached), means of the end and"
    " tail held-out accuracy, the largest final isometry error; memorized: train accuracy"
    " >= 0.99; sustained: 3 evaluations in a row >= 0.95)"
  )
  return "\n".join(lines)


def _study_tables(runs: Sequence[dict]) -> list[str]:
  """The study tables of each preset and budget whose runs get them (:func:`_studied`)."""
  families: dict = {}
  for r in runs:
    families.setdefault(_family(r), []).append(r)
  parts = []
  for family, rs in sorted(families.items()):
    if _studied(rs):
      parts.append(
        f"The paper's grokking studies [{family}]:\n{_five_seed_tables(rs)}\n\n{_table5(rs)}"
      )
  return parts


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
  return "\n\n".join(parts + _study_tables(runs))
