"""The report of ``stiefax patches`` runs (also printed by ``stiefax report``).

``run`` protocol: per arm, test accuracy mean ± std (ddof=1), the paired difference to
A2 within seed (mean, t, p, wins k/n, paired-t and bootstrap 95% CIs), final isometry
error and wall-clock per epoch, then the paired contrasts of the paper's Table 7 and
the frozen arm's share of B2's gain. ``sweep-n``: a row per n (ddof=0, as the paper's
Table 3). ``sweep-eps``: a row per eps, paired against the smallest eps. ``select-lr``:
validation accuracy per rate. Those three tables are
:mod:`stiefax.experiments.patches.sweep_tables`; how runs are grouped into settings and
paired within seed, :mod:`stiefax.experiments.patches.groups`.
"""

from __future__ import annotations

import pathlib
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import report as report_lib
from stiefax.experiments import stats
from stiefax.experiments.patches.config import EXPERIMENT
from stiefax.experiments.patches.config import contrasts
from stiefax.experiments.patches.groups import arm_order as _arm_order
from stiefax.experiments.patches.groups import by_seed as _by_seed
from stiefax.experiments.patches.groups import group_key as _group_key
from stiefax.experiments.patches.groups import label as _label
from stiefax.experiments.patches.groups import paired_row as _paired_row
from stiefax.experiments.patches.groups import setting_order as _setting_order
from stiefax.experiments.patches.groups import title as _title
from stiefax.experiments.patches.runs import knob_of
from stiefax.experiments.patches.sweep_tables import eps_references as _eps_references
from stiefax.experiments.patches.sweep_tables import report_select as _report_select
from stiefax.experiments.patches.sweep_tables import report_sweep_eps as _report_sweep_eps
from stiefax.experiments.patches.sweep_tables import report_sweep_n as _report_sweep_n
from stiefax.experiments.report import PAIRED_HEADER
from stiefax.experiments.report import num as _num
from stiefax.experiments.report import paired_cells as _paired_cells
from stiefax.experiments.report import table as _table

__all__ = ["report", "CONTRASTS"]

# Paired contrasts of the paper's Table 7 (and section 4.5): (name, arm b, arm a, what
# b - a isolates). Printed for every group that holds both arms.
CONTRASTS = contrasts(
  (
    ("constraint alone", "frozen", "A2", "orthonormal frames never trained, vs AdamW"),
    ("training the frames", "B2", "frozen", "the Riemannian Adam step, vs frozen frames"),
    (
      "step rule (b,c)",
      "grassmann",
      "B2-SGD",
      "adaptive capped step vs fixed step, both Grassmann",
    ),
    ("projector (a)", "B2", "grassmann", "Stiefel vs Grassmann projector, adaptive step"),
    ("second moment", "B2", "elementwise", "scalar vs elementwise v"),
    ("corrected vs PA16", "B2", "B2-SGD", "all three changes at once"),
    # The Stiefel optimizer family (docs/optimizers.md), each against B2.
    ("manifold Muon", "B2-mmuon", "B2", "spectral-norm steepest descent vs Riemannian Adam"),
    ("QR retraction", "B2-qr", "B2", "QR vs polar retraction, same step"),
    ("Cayley retraction", "B2-cayley", "B2", "Cayley vs polar retraction, same step"),
    ("Muon, free frames", "A2-muon", "B2", "orthogonalized updates, frames unconstrained"),
    # Against the practitioners' logit controls (docs/reproduction.md, "Against QK-norm").
    ("QK-norm", "A2-qknorm", "A2", "LayerNorm on q and k, AdamW frames"),
    ("sigmaReparam", "A2-sigma", "A2", "spectrally normalised W_Q, W_K, AdamW"),
    ("frozen vs QK-norm", "frozen", "A2-qknorm", "orthonormal frames vs QK-norm"),
    ("B2 vs QK-norm", "B2", "A2-qknorm", "trained orthonormal frames vs QK-norm"),
    ("frozen vs sigmaReparam", "frozen", "A2-sigma", "orthonormal frames vs sigmaReparam"),
    ("B2 vs sigmaReparam", "B2", "A2-sigma", "trained orthonormal frames vs sigmaReparam"),
    ("QK-norm on B2", "B2-qknorm", "B2", "is the norm redundant with orthonormal frames?"),
  )
)  # then arm - base of each arm with a base (the registry's), not listed


def _report_main(runs: Sequence[dict], out_dir: pathlib.Path, tag: str) -> list[str]:
  groups: dict = {}
  for r in runs:
    groups.setdefault(_group_key(r["config"]), []).append(r)
  lines, used = [], set()
  across: dict = {}  # contrast name -> {setting label: Paired}
  settings: list[tuple] = []  # (depth, -rate, n, label), to sort the columns
  sizes = {(g[0]["config"].get("n_train"), g[0]["config"].get("epochs")) for g in groups.values()}
  for gi, (_, group) in enumerate(sorted(groups.items(), key=lambda kv: str(kv[0]))):
    knobs: dict = {}
    for r in group:
      knobs.setdefault(r["arm"], set()).add(knob_of(r["config"]))
    by_arm: dict = {}
    for r in group:
      by_arm.setdefault(_label(r, knobs), []).append(r)
    base = _by_seed(by_arm.get("A2", []), "test_acc")
    rows = []
    for name in _arm_order(by_arm):
      rs = by_arm[name]
      acc = _by_seed(rs, "test_acc")
      mean, std = stats.summarize([100 * v for v in acc.values()])
      paired = _paired_row(base, acc) if name != "A2" and base else None
      iso = np.mean([r["metrics"]["isometry"] for r in rs])
      wall = np.mean([r["metrics"]["wall_per_epoch"] for r in rs])
      rows.append(
        [
          name,
          str(len(acc)),
          f"{mean:.2f} ± {std:.2f}",
          *_paired_cells(paired),
          f"{iso:.1e}",
          f"{wall:.2f}",
        ]
      )
    lines.append(f"patches ({tag}): {_title(group[0]['config'])}")
    lines.append(
      _table(
        [
          "arm",
          "seeds",
          "test acc %",
          "Δ vs A2 pp",
          *PAIRED_HEADER,
          "isometry",
          "s/epoch",
        ],
        rows,
      )
    )
    lines.append(
      "  mean ± sample std (ddof=1) over seeds; Δ paired within seed; paired-t and"
      " bootstrap 95% CIs (exact up to 12 seeds); verdict: both CIs agree on >= 6 seeds."
    )
    rows = []
    c = group[0]["config"]
    setting = f"depth {c['depth']}, lr {c['adamw_lr']:g}"
    if len(sizes) > 1:
      setting += f", n {c['n_train']}, {c['epochs']} epochs"
    settings.append((*_setting_order(c), setting))
    for name, b, a, what in CONTRASTS:
      if b in by_arm and a in by_arm:
        p = _paired_row(_by_seed(by_arm[a], "test_acc"), _by_seed(by_arm[b], "test_acc"))
        rows.append([name, f"{b} - {a}", *_paired_cells(p), what])
        if p is not None:
          across.setdefault((name, f"{b} - {a}"), {})[setting] = p
    if rows:
      lines.append("")
      lines.append(_table(["contrast", "arms", "Δ pp", *PAIRED_HEADER, "isolates"], rows))
    c = group[0]["config"]
    name = f"patches_{tag}_n{c['n_train']}_e{c['epochs']}_depth{c['depth']}_lr{c['adamw_lr']:g}"
    if name in used:
      name += f"_{gi}"
    used.add(name)
    png = _plot_main(by_arm, out_dir, name + ".png", _title(c))
    if png:
      lines.append(f"  plot: {png}")
    lines.append("")
  return lines + _across_settings(across, [label for *_, label in sorted(settings)])


def _across_settings(across: dict, settings: Sequence[str]) -> list[str]:
  """Each contrast found in more than one setting: its difference and verdict per setting."""
  shown = [key for key, cells in across.items() if len(cells) > 1]
  if not shown:
    return []
  cols = [s for s in settings if any(s in across[k] for k in shown)]
  rows = []
  for name, arms in shown:
    cells = []
    for col in cols:
      p = across[(name, arms)].get(col)
      if p is None:
        cells.append("-")
      else:
        delta, *_, verdict = _paired_cells(p)
        cells.append(f"{delta} ({p.wins}/{p.n}, {verdict})")
    rows.append([name, arms, *cells])
  return [
    "patches (contrasts across settings): Δ pp (wins/seeds, verdict) per setting",
    _table(["contrast", "arms", *cols], rows),
    "  the verdicts of each setting's own table: both CIs agree on >= 6 paired seeds.",
    "",
  ]


def _report_frozen_share(runs: Sequence[dict]) -> list[str]:
  """How much of B2's gain over A2 the frozen arm keeps, in every setting that has all three.

  Per setting (depth, AdamW rate, ...), on the seeds that A2, frozen and B2 share: the
  paired gains ``frozen - A2`` and ``B2 - A2`` and their ratio, the frozen arm's share.
  A share near 1 says orthonormal frames alone earn the gain; near 0, that training
  them with the Riemannian step does.
  """
  groups: dict = {}
  for r in runs:
    groups.setdefault(_group_key(r["config"]), {}).setdefault(r["arm"], []).append(r)
  rows: list[list[str]] = []
  orders: list[tuple] = []
  for _key, by_arm in sorted(groups.items()):
    if not all(a in by_arm for a in ("A2", "frozen", "B2")):
      continue
    acc = {a: _by_seed(by_arm[a], "test_acc") for a in ("A2", "frozen", "B2")}
    seeds = sorted(set(acc["A2"]) & set(acc["frozen"]) & set(acc["B2"]))
    if not seeds:
      continue
    sub = {a: {s: acc[a][s] for s in seeds} for a in acc}
    fz = _paired_row(sub["A2"], sub["frozen"])
    b2 = _paired_row(sub["A2"], sub["B2"])
    tr = _paired_row(sub["frozen"], sub["B2"])
    # The three arms share ``seeds``, which is not empty, so every contrast is defined.
    assert fz is not None and b2 is not None and tr is not None
    c = by_arm["A2"][0]["config"]
    share = fz.mean / b2.mean if b2.mean else float("nan")
    share_lo, share_hi = stats.ratio_ci(fz.diffs, b2.diffs)
    orders.append(_setting_order(c))
    rows.append(
      [
        str(c["depth"]),
        f"{c['adamw_lr']:g}",
        f"{c['n_train']}/{c['epochs']}",
        str(len(seeds)),
        f"{100 * np.mean(list(sub['A2'].values())):.2f}",
        f"{fz.mean:+.2f} ({fz.wins}/{fz.n})",
        f"{b2.mean:+.2f} ({b2.wins}/{b2.n})",
        f"{tr.mean:+.2f} ({tr.wins}/{tr.n}, p={_num(tr.p, '.2g')})",
        _num(share, ".2f"),
        f"[{_num(share_lo, '.2f')}, {_num(share_hi, '.2f')}]",
      ]
    )
  rows = [row for _, row in sorted(zip(orders, rows), key=lambda t: t[0])]
  if not rows:
    return []
  return [
    "patches (frozen share): the frozen arm's share of B2's gain, per setting",
    _table(
      [
        "depth",
        "adamw_lr",
        "n/epochs",
        "seeds",
        "A2 %",
        "frozen-A2 pp (wins)",
        "B2-A2 pp (wins)",
        "B2-frozen pp (wins, p)",
        "share",
        "share 95% CI",
      ],
      rows,
    ),
    "  paired within seed on the seeds all three arms share; share = (frozen - A2) / (B2 - A2),"
    " its CI the bootstrap of the ratio over seeds.",
    "",
  ]


def _probed(runs: Sequence[dict], again: Sequence[dict] = ()) -> dict:
  """``{setting: {arm: [run, ...]}}`` of the runs that recorded the attention probe.

  A run is taken once per (setting, arm, seed): the reported copy if it has the probe,
  else a second copy of it (``again``: the same run trained on a later commit, which
  recorded the probe where the first did not).
  """
  groups: dict = {}
  seen = set()
  for r in (*runs, *again):
    if r["metrics"].get("max_logit") is None or not r.get("history", {}).get("max_logit"):
      continue
    key = _group_key(r["config"])
    if (key, r["arm"], r["seed"]) in seen:
      continue
    seen.add((key, r["arm"], r["seed"]))
    groups.setdefault(key, {}).setdefault(r["arm"], []).append(r)
  return groups


def _report_attention(
  runs: Sequence[dict], out_dir: pathlib.Path, again: Sequence[dict] = ()
) -> list[str]:
  """Per setting and arm: the largest attention logit and the attention entropy at the
  end of training (and the largest logit during it), for the runs that record them, with
  a figure of both against training steps per setting."""
  groups = _probed(runs, again)
  reported = {id(r) for r in runs}
  rows, plots = [], []
  order = lambda by_arm: _setting_order(next(iter(by_arm.values()))[0]["config"])
  for by_arm in sorted(groups.values(), key=order):
    for arm in _arm_order(by_arm):
      rs = by_arm[arm]
      c = rs[0]["config"]
      m = [r["metrics"] for r in rs]
      copies = sum(id(r) not in reported for r in rs)
      rows.append(
        [
          str(c["depth"]),
          f"{c['adamw_lr']:g}",
          arm,
          str(len(rs)) + (f" ({copies} rerun)" if copies else ""),
          f"{np.mean([x['max_logit'] for x in m]):.1f}",
          f"{np.max([x['max_logit_max'] for x in m]):.1f}",
          f"{np.mean([x['attn_entropy'] for x in m]):.3f}",
        ]
      )
    c = next(iter(by_arm.values()))[0]["config"]
    name = f"patches_attention_n{c['n_train']}_e{c['epochs']}_depth{c['depth']}_lr{c['adamw_lr']:g}"
    png = _plot_attention(by_arm, out_dir, name + ".png", _title(c))
    if png:
      plots.append(f"  plot: {png}")
  if not rows:
    return []
  return [
    "patches (attention): on the first 256 training images, after the last epoch",
    _table(
      ["depth", "adamw_lr", "arm", "seeds", "max logit", "max during", "entropy (nats)"], rows
    ),
    "  max logit = max |q·k|/sqrt(r) over layers, images, heads and pairs (mean over seeds);"
    " max during: over every epoch and seed; entropy: mean over queries; (k rerun): k seeds"
    " from a second copy of the run, the first having no probe.",
    *plots,
    "",
  ]


def _plot_attention(by_arm: dict, out_dir: pathlib.Path, name: str, title: str) -> Optional[str]:
  """Largest attention logit and attention entropy against training steps, per arm (mean
  over seeds, the band spanning the seeds)."""
  plt = report_lib.pyplot()
  if plt is None:
    return None
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  for i, arm in enumerate(_arm_order(by_arm)):
    rs = by_arm[arm]
    c = rs[0]["config"]
    n = min(len(r["history"]["max_logit"]) for r in rs)
    per_epoch = c["total_steps"] / c["epochs"] if c.get("total_steps") else 1.0
    steps = per_epoch * np.arange(1, n + 1)
    for ax, field in ((ax1, "max_logit"), (ax2, "attn_entropy")):
      y = np.asarray([r["history"][field][:n] for r in rs], dtype=float)
      ax.plot(steps, y.mean(0), color=f"C{i}", label=f"{arm} ({len(rs)})")
      if len(rs) > 1:
        ax.fill_between(steps, y.min(0), y.max(0), color=f"C{i}", alpha=0.2, lw=0)
  ax1.set_yscale("log")
  ax1.set_ylabel("max |q·k| / sqrt(r)")
  ax2.set_ylabel("attention entropy (nats)")
  for ax in (ax1, ax2):
    ax.set_xlabel("training step")
  ax1.legend(fontsize=8)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  return report_lib.save_figure(fig, plt, out_dir, name)


def _plot_main(by_arm: dict, out_dir: pathlib.Path, name: str, title: str) -> Optional[str]:
  plt = report_lib.pyplot()
  if plt is None:
    return None
  names = _arm_order(by_arm)
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  for i, a in enumerate(names):
    accs = [
      100 * r["metrics"]["test_acc"] for r in by_arm[a] if r["metrics"].get("test_acc") is not None
    ]
    ax1.bar(i, np.mean(accs), color=f"C{i}", alpha=0.6)
    ax1.plot([i] * len(accs), accs, "k.", ms=4)
    iso = np.mean(
      [
        r["history"]["isometry"]
        for r in by_arm[a]
        if len(r["history"]["isometry"]) == len(by_arm[a][0]["history"]["isometry"])
      ],
      axis=0,
    )
    ax2.semilogy(np.arange(1, len(iso) + 1), np.maximum(iso, 1e-9), label=a, color=f"C{i}")
  ax1.set_xticks(range(len(names)), names, rotation=30)
  ax1.set_ylabel("test accuracy (%)")
  lo = min(
    100 * r["metrics"]["test_acc"]
    for a in names
    for r in by_arm[a]
    if r["metrics"].get("test_acc") is not None
  )
  ax1.set_ylim(max(0, lo - 5), None)
  ax2.set_xlabel("epoch")
  ax2.set_ylabel("isometry error max|W^T W - I|")
  ax2.legend(fontsize=8)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  return report_lib.save_figure(fig, plt, out_dir, name)


def report(runs: list[dict], out_dir: pathlib.Path, *, again: Sequence[dict] = ()) -> str:
  """Paper-style tables of ``patches`` runs (and PNG plots written to ``out_dir``).

  ``run`` protocol: per arm, test accuracy mean ± std (ddof=1), the paired difference
  to A2 within seed (mean, t, p, wins k/n, paired-t and bootstrap 95% CIs), final
  isometry error and wall-clock per epoch. ``sweep-n``: a row per n (ddof=0, as the
  paper's Table 3). ``sweep-eps``: a row per eps, paired against the smallest eps.
  ``select-lr``: validation accuracy per rate.

  Args:
    runs: result dicts (the JSON files); runs of other experiments are ignored.
    out_dir: where plots go.
    again: second copies of runs in ``runs`` (trained again on a later commit); only the
      attention probe reads them, for runs whose first copy predates it.

  Returns:
    The report text.
  """
  out_dir = pathlib.Path(out_dir)
  runs = [r for r in runs if r.get("experiment") == EXPERIMENT]
  if not runs:
    return "patches: no runs"
  by_protocol: dict = {}
  for r in runs:
    by_protocol.setdefault(r["config"].get("protocol", "run"), []).append(r)
  lines: list[str] = []
  if "select-lr" in by_protocol:
    lines += _report_select(by_protocol["select-lr"])
  if "run" in by_protocol:
    lines += _report_main(by_protocol["run"], out_dir, "run")
    lines += _report_frozen_share(by_protocol["run"])
    again_run = [r for r in again if r["config"].get("protocol", "run") == "run"]
    lines += _report_attention(by_protocol["run"], out_dir, again_run)
  if "sweep-n" in by_protocol:
    lines += _report_sweep_n(by_protocol["sweep-n"], out_dir)
  if "sweep-eps" in by_protocol:
    sweep = by_protocol["sweep-eps"]
    lines += _report_sweep_eps(sweep + _eps_references(sweep, by_protocol.get("run", [])), out_dir)
  return "\n".join(lines).rstrip() + "\n"
