"""Study 1 of docs/lm.md: the tables of an AdamW-rate sweep of ``stiefax lm`` runs.

Per setting (everything but the arm and the AdamW rate): the learning-rate sweep
(final validation loss in bits per byte per arm and rate, and each arm's learning-rate
sensitivity as Wortsman et al. 2023 define it), the largest attention logit during
training and the attention entropy at the end per arm and rate, the comparison of the arms each at its own best rate
(test loss, paired differences to A2 with paired-t and bootstrap intervals and the
verdict of the statistical standard, attention logit and entropy, isometry error,
tokens per second), the same paired differences between other pairs of arms
(:data:`CONTRASTS`: the constraint against QK-norm and σReparam, the two combined,
frozen and QR against B2), and three figures: loss against rate, the largest logit against
steps at the two highest rates, and validation loss curves at the best rates.

An arm's best rate is the one with the lowest mean validation loss over the seeds that
every rate of the arm has (the sweep's seeds), so adding seeds at the best rate never
moves it; the sweep's tables (loss, sensitivity, logit, entropy) use those seeds only,
so every point of the sweep rests on the same seeds. An arm that lacks some of the setting's rates (a sweep still running) gets
no sensitivity and no best rate, and is left out of the best-rate comparison. A diverged run counts as its loss at init; so does a loss above it
(``min(loss, loss at init)``, as Wortsman et al.).

Runs of study 3 (an arm with a matrix rule among them, ``results/lm-norms``) get study
3's own tables instead (:mod:`stiefax.experiments.lm.norms_tables`).
"""

from __future__ import annotations

import math
import pathlib
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import report as report_lib
from stiefax.experiments import stats
from stiefax.experiments.arms import Contrasts
from stiefax.experiments.lm import fair
from stiefax.experiments.lm.config import ARMS
from stiefax.experiments.lm.runs import by_rate as _by_rate
from stiefax.experiments.lm.runs import diverged
from stiefax.experiments.lm.runs import loss_of
from stiefax.experiments.lm.runs import loss_verdict
from stiefax.experiments.lm.runs import select_rate
from stiefax.experiments.lm.runs import sensitivity
from stiefax.experiments.lm.runs import sweep_runs
from stiefax.experiments.report import num
from stiefax.experiments.report import table

__all__ = ["CONTRASTS", "study1_runs", "report"]


def study1_runs(runs: Sequence[dict]) -> list[dict]:
  """The runs of study 1's arms at study 1's frame rate (the sweep tables' runs)."""
  return [
    r
    for r in runs
    if r["arm"] not in fair.NEW_ARMS and r["config"]["frame_lr"] == fair.STUDY1_FRAME_LR
  ]


def _arms(runs: Sequence[dict]) -> dict:
  by_arm: dict = {}
  for r in runs:
    by_arm.setdefault(r["arm"], []).append(r)
  return {a: by_arm[a] for a in report_lib.arm_order(by_arm, ARMS)}


def _sweep_tables(by_arm: dict) -> list[str]:
  rates = sorted({r["config"]["adamw_lr"] for rs in by_arm.values() for r in rs})
  if len(rates) < 2:
    return []
  loss_rows, logit_rows, entropy_rows = [], [], []
  for arm, all_runs in by_arm.items():
    rs = sweep_runs(all_runs)
    by_rate = _by_rate(rs)
    cells, logit_cells, entropy_cells = [], [], []
    for lr in rates:
      seeds = by_rate.get(lr, {})
      if not seeds:
        cells.append("-")
        logit_cells.append("-")
        entropy_cells.append("-")
        continue
      div = sum(diverged(r) for r in seeds.values())
      mean = np.mean([loss_of(r) for r in seeds.values()])
      cells.append(f"{mean:.3f}" + (f" ({div}/{len(seeds)} div)" if div else ""))
      logits = [r["metrics"]["max_logit_max"] for r in seeds.values()]
      logit_cells.append(
        num(float(np.nanmax(logits)) if np.isfinite(logits).any() else None, ".1f")
      )
      ents = [r["metrics"].get("entropy") for r in seeds.values() if not diverged(r)]
      ents = [e for e in ents if e is not None and math.isfinite(e)]
      entropy_cells.append(num(float(np.mean(ents)) if ents else None, ".2f"))
    n = min(len(s) for s in by_rate.values())
    if set(by_rate) == set(rates):
      loss_rows.append(
        [arm, str(n), *cells, num(sensitivity(rs), ".3f"), num(select_rate(rs), "g")]
      )
    else:  # a partial sweep has no sensitivity and no best rate yet
      loss_rows.append([arm, str(n), *cells, f"- ({len(by_rate)}/{len(rates)} rates)", "-"])
    logit_rows.append([arm, *logit_cells])
    entropy_rows.append([arm, *entropy_cells])
  head = [f"{lr:g}" for lr in rates]
  return [
    "learning-rate sweep: final validation loss, bits per byte\n"
    "  (mean over the sweep's seeds; min(loss, loss at init))",
    table(["arm", "seeds", *head, "LR sensitivity", "best rate"], loss_rows),
    "",
    "largest attention logit max |q·k|/sqrt(r) during training (max over the sweep's seeds)",
    table(["arm", *head], logit_rows),
    "",
    "attention entropy at the end of training, nats (mean over the sweep's seeds that did"
    " not diverge)",
    table(["arm", *head], entropy_rows),
    "",
  ]


def _best_table(by_arm: dict) -> tuple[list[str], dict]:
  chosen: dict = {}
  rates = {r["config"]["adamw_lr"] for rs in by_arm.values() for r in rs}
  for arm, rs in by_arm.items():
    if len(rates) > 1 and set(_by_rate(rs)) != rates:
      continue  # the sweep of this arm is not finished: no best rate yet
    lr = select_rate(rs)
    if lr is not None:
      chosen[arm] = {r["seed"]: r for r in rs if r["config"]["adamw_lr"] == lr}
  if not chosen:
    return [], chosen
  base = {s: loss_of(r, "test_bpb") for s, r in chosen.get("A2", {}).items()}
  rows, probe_rows = [], []
  for arm, seeds in chosen.items():
    rs = list(seeds.values())
    test = {s: loss_of(r, "test_bpb") for s, r in seeds.items()}
    mean, std = stats.summarize(list(test.values()))
    p = None
    if arm != "A2" and base:
      common = sorted(set(base) & set(test))
      if len(common) >= 2:  # one pair has no interval
        p = stats.paired([base[s] for s in common], [test[s] for s in common])
    m = [r["metrics"] for r in rs]
    tps = [x["tokens_per_second"] for x in m if x.get("tokens_per_second")]
    rows.append(
      [
        arm,
        f"{rs[0]['config']['adamw_lr']:g}",
        str(len(rs)),
        f"{mean:.4f} ± {std:.4f}",
        "-" if p is None else f"{p.mean:+.4f}",
        "-" if p is None else f"[{p.t_low:+.4f}, {p.t_high:+.4f}]",
        "-" if p is None else f"[{p.ci_low:+.4f}, {p.ci_high:+.4f}]",
        "-" if p is None else loss_verdict(p),
      ]
    )
    probe_rows.append(
      [
        arm,
        f"{np.nanmean([x['max_logit_max'] for x in m]):.1f}",
        f"{np.nanmean([x['entropy'] for x in m]):.2f}",
        f"{np.nanmean([x['isometry'] for x in m]):.1e}",
        num(float(np.mean(tps)) if tps else None, ",.0f"),
      ]
    )
  return [
    "each arm at its best rate: test loss, bits per byte\n"
    "  (paired by seed; Δ = arm - A2, negative is better)",
    table(
      [
        "arm",
        "rate",
        "seeds",
        "test bpb",
        "Δ vs A2",
        "t 95% CI",
        "bootstrap 95% CI",
        "verdict",
      ],
      rows,
    ),
    f"  verdict: both 95% intervals agree, on >= {stats.MIN_SEEDS} paired seeds;"
    " otherwise not settled.",
    "",
    "each arm at its best rate: attention, isometry and speed (mean over its seeds)",
    table(["arm", "max logit", "entropy", "isometry", "tokens/s"], probe_rows),
    "  max logit: largest during training; entropy: at the end; isometry: max|W^T W - I|"
    " at the end.",
    "",
  ], chosen


#: Pairs (b, a) compared at their best rates beside the protocol's Δ vs A2: does the
#: constraint do more than QK-norm or σReparam, do the two combine, and what do training
#: the frames and the retraction add.
CONTRASTS = Contrasts(
  ARMS,
  (
    ("B2", "A2-qknorm"),
    ("B2", "A2-sigma"),
    ("A2-qknorm", "A2-sigma"),
    ("B2-qknorm", "A2-qknorm"),
    ("B2-qknorm", "B2"),
    ("B2", "frozen"),
    ("B2-qr", "B2"),
  ),
  known=lambda b, a: a == "A2",  # the protocol's Δ vs A2 shows those
)  # then arm - base of each arm with a base (the registry's), not listed


def _contrast_table(chosen: dict) -> list[str]:
  """Paired test-loss differences b - a between arms, each at its own best rate."""
  rows = []
  for b, a in CONTRASTS:
    if a not in chosen or b not in chosen:
      continue
    la = {s: loss_of(r, "test_bpb") for s, r in chosen[a].items()}
    lb = {s: loss_of(r, "test_bpb") for s, r in chosen[b].items()}
    common = sorted(set(la) & set(lb))
    if len(common) < 2:  # one pair has no interval
      continue
    p = stats.paired([la[s] for s in common], [lb[s] for s in common])
    wins = sum(lb[s] < la[s] for s in common)
    rows.append(
      [
        f"{b} - {a}",
        str(len(common)),
        f"{p.mean:+.4f}",
        f"[{p.t_low:+.4f}, {p.t_high:+.4f}]",
        f"[{p.ci_low:+.4f}, {p.ci_high:+.4f}]",
        f"{wins}/{len(common)}",
        loss_verdict(p),
      ]
    )
  if not rows:
    return []
  return [
    "contrasts at the best rates: test loss, bits per byte\n"
    "  (Δ = b - a, paired by seed; negative: b is better)",
    table(["b - a", "seeds", "Δ", "t 95% CI", "bootstrap 95% CI", "b lower", "verdict"], rows),
    "",
  ]


def _plots(by_arm: dict, chosen: dict, out_dir: pathlib.Path, stem: str) -> list[str]:
  plt = report_lib.pyplot()
  if plt is None:
    return []
  made = []
  rates = sorted({r["config"]["adamw_lr"] for rs in by_arm.values() for r in rs})
  if len(rates) > 1:
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (arm, rs) in enumerate(by_arm.items()):
      by_rate = _by_rate(sweep_runs(rs))
      xs = sorted(by_rate)
      ys = [np.mean([loss_of(r) for r in by_rate[x].values()]) for x in xs]
      ax.plot(xs, ys, marker="o", label=arm, color=f"C{i}")
    ax.set_xscale("log")
    ax.set_xlabel("AdamW peak learning rate")
    ax.set_ylabel("final validation loss (bits/byte)")
    ax.set_title("learning-rate sensitivity")
    ax.legend(fontsize=8)
    fig.tight_layout()
    made.append(report_lib.save_figure(fig, plt, out_dir, f"{stem}_lr_sweep.png"))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, lr in zip(axes, rates[-2:]):
      for i, (arm, rs) in enumerate(by_arm.items()):
        r = _by_rate(rs).get(lr, {})
        if r:
          h = r[min(r)]["history"]
          ax.plot(h["step"], h["max_logit"], label=arm, color=f"C{i}")
      ax.set_yscale("log")
      ax.set_xlabel("step")
      ax.set_title(f"rate {lr:g} (lowest seed)")
    axes[0].set_ylabel("largest attention logit")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    made.append(report_lib.save_figure(fig, plt, out_dir, f"{stem}_max_logit.png"))
  if chosen:
    fig, ax = plt.subplots(figsize=(6, 4))
    curves: list[np.ndarray] = []
    for i, (arm, seeds) in enumerate(chosen.items()):
      hs = [r["history"] for r in seeds.values() if not diverged(r)]
      if hs:
        n = min(len(h["val_bpb"]) for h in hs)
        curve = np.asarray(np.mean([h["val_bpb"][:n] for h in hs], axis=0))
        lr = next(iter(seeds.values()))["config"]["adamw_lr"]
        ax.plot(hs[0]["step"][:n], curve, label=f"{arm} (rate {lr:g})", color=f"C{i}")
        curves.append(curve)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (bits/byte)")
    if curves and min(len(c) for c in curves) > 2:
      # The first evaluations (the loss at init is 8 bits/byte) would hide the end.
      low = min(float(np.min(c)) for c in curves)
      ax.set_ylim(low - 0.05, max(float(c[2]) for c in curves) + 0.05)
    ax.set_title("each arm at its best rate (mean over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    made.append(report_lib.save_figure(fig, plt, out_dir, f"{stem}_best_curves.png"))
  return [f"  plot: {p}" for p in made if p]


def report(runs: Sequence[dict], out_dir: Optional[pathlib.Path], stem: str) -> list[str]:
  """Study 1's tables of one setting's ``runs`` (and its figures in ``out_dir``, named
  ``<stem>_*.png``; none when it is None)."""
  by_arm = _arms(runs)
  lines = _sweep_tables(by_arm)
  best, chosen = _best_table(by_arm)
  lines += best
  lines += _contrast_table(chosen)
  if out_dir is not None:
    lines += _plots(by_arm, chosen, pathlib.Path(out_dir), stem)
  return lines
