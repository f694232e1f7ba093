"""The report of ``stiefax patches`` runs (also printed by ``stiefax report``).

``run`` protocol: per arm, test accuracy mean ± std (ddof=1), the paired difference to
A2 within seed (mean, t, p, wins k/n, paired-t and bootstrap 95% CIs), final isometry
error and wall-clock per epoch, then the paired contrasts of the paper's Table 7 and
the frozen arm's share of B2's gain. ``sweep-n``: a row per n (ddof=0, as the paper's
Table 3). ``sweep-eps``: a row per eps, paired against the smallest eps. ``select-lr``:
validation accuracy per rate.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Iterable
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import report as report_lib
from stiefax.experiments import stats
from stiefax.experiments.patches.config import ARMS
from stiefax.experiments.patches.config import EXPERIMENT
from stiefax.experiments.patches.config import Setting
from stiefax.experiments.patches.config import contrasts
from stiefax.experiments.patches.runs import knob_of
from stiefax.experiments.patches.runs import run_identity
from stiefax.experiments.report import PAIRED_HEADER
from stiefax.experiments.report import num as _num
from stiefax.experiments.report import paired_cells as _paired_cells
from stiefax.experiments.report import table as _table

__all__ = ["report", "CONTRASTS"]

# Configuration fields that belong to an arm rather than to the setting it runs in.
_ARM_FIELDS = (
  "protocol",
  "riemannian_lr",
  "penalty",
  "eps",
  "description",
  "frame_init",
  "attention",
)


def _group_key(cfg: dict, drop: Sequence[str] = ()) -> str:
  """The setting a run belongs to: its identity less the arm's own fields and ``drop``."""
  ident = run_identity(cfg)
  for k in (*_ARM_FIELDS, *drop):
    ident.pop(k, None)
  return json.dumps(ident, sort_keys=True)


def _label(r: dict, knobs: dict) -> str:
  """The arm's name, with its knob when one arm runs at several knobs in a group."""
  if len(knobs.get(r["arm"], ())) < 2:
    return r["arm"]
  c = r["config"]
  if c.get("penalty") is not None:
    return f"{r['arm']} λ={c['penalty']:g}"
  if c.get("riemannian_lr") is not None:
    return f"{r['arm']} lr={c['riemannian_lr']:g}"
  return f"{r['arm']} lr={c['adamw_lr']:g}"


def _setting_order(cfg: dict) -> tuple:
  """Settings in the tables: by depth, then the larger AdamW rate first, then n."""
  return (cfg["depth"], -cfg["adamw_lr"], cfg.get("n_train") or 0, cfg.get("epochs") or 0)


def _arm_order(names: Iterable[str]) -> list[str]:
  return report_lib.arm_order(names, ARMS)


def _title(cfg: dict) -> str:
  return (
    f"{cfg.get('dataset')} n_train={cfg.get('n_train')} test={cfg.get('n_test')}"
    f" epochs={cfg.get('epochs')} ({cfg.get('total_steps')} steps) depth={cfg.get('depth')}"
    f" d={cfg.get('d')} H={cfg.get('heads')} r={cfg.get('head_dim')}"
    f" adamw_lr={cfg.get('adamw_lr'):g}"
  )


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


def _by_seed(runs: Sequence[dict], metric: str) -> dict:
  return report_lib.by_seed(runs, metric)


def _paired_row(base: dict, other: dict) -> Optional[stats.Paired]:
  """``other - base`` in percentage points on their shared seeds (None: none shared)."""
  return report_lib.paired_by_seed(base, other, scale=100.0)


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


def _eps_references(sweep: Sequence[dict], runs: Sequence[dict]) -> list[dict]:
  """``run``-protocol runs of the swept arms in the sweep's setting, as extra eps points.

  The eps probe varies only eps, so the main study's B2 (eps = 1e-8) is its reference
  point and need not be trained twice.
  """
  keys = {(r["arm"], _group_key(r["config"])) for r in sweep}
  have = {(r["arm"], r["seed"], r["config"]["eps"]) for r in sweep}
  return [
    r
    for r in runs
    if (r["arm"], _group_key(r["config"])) in keys
    and r["config"].get("eps") is not None
    and (r["arm"], r["seed"], r["config"]["eps"]) not in have
  ]


def _report_sweep_n(runs: Sequence[dict], out_dir: pathlib.Path) -> list[str]:
  by_n: dict = {}
  for r in runs:
    by_n.setdefault(r["config"]["n_train"], {}).setdefault(r["arm"], []).append(r)
  arms = _arm_order({r["arm"] for r in runs})
  rows: list[list[str]] = []
  curves: dict[str, list] = {a: [] for a in arms}
  for n in sorted(by_n):
    cfg = next(iter(by_n[n].values()))[0]["config"]
    base = _by_seed(by_n[n].get("A2", []), "test_acc")
    cells = [str(n), str(cfg["total_steps"]), str(cfg["epochs"])]
    for a in arms:
      acc = _by_seed(by_n[n].get(a, []), "test_acc")
      mean, std = stats.summarize([100 * v for v in acc.values()], ddof=0)
      cells.append(f"{mean:.2f} ± {std:.2f}" if acc else "-")
      curves[a].append((n, mean, std))
    for a in arms:
      if a == "A2":
        continue
      p = _paired_row(base, _by_seed(by_n[n].get(a, []), "test_acc")) if base else None
      cells += _paired_cells(p)
    rows.append(cells)
  header = ["n", "steps", "epochs"] + [f"{a} %" for a in arms]
  for a in arms:
    if a != "A2":
      header += [f"{a}-A2 pp", *PAIRED_HEADER]
  lines = [
    "patches (sweep-n): data-size sweep at a fixed step budget",
    _table(header, rows),
    "  mean ± population std (ddof=0) over seeds, as the paper's Table 3; Δ paired within"
    " seed; bootstrap CI exact (every resample of the seeds).",
  ]
  png = _plot_xy(curves, out_dir, "patches_sweep_n.png", "n_train", "test accuracy (%)")
  if png:
    lines.append(f"  plot: {png}")
  return lines + [""]


def _report_sweep_eps(runs: Sequence[dict], out_dir: pathlib.Path) -> list[str]:
  lines = ["patches (sweep-eps): Riemannian Adam eps probe (paper 4.7)"]
  for arm in _arm_order({r["arm"] for r in runs}):
    by_eps: dict = {}
    for r in runs:
      if r["arm"] == arm:
        by_eps.setdefault(r["config"]["eps"], []).append(r)
    ref_eps = min(by_eps)
    ref = _by_seed(by_eps[ref_eps], "test_acc")
    rows, curve = [], []
    for eps in sorted(by_eps):
      acc = _by_seed(by_eps[eps], "test_acc")
      mean, std = stats.summarize([100 * v for v in acc.values()])
      p = _paired_row(ref, acc) if eps != ref_eps else None
      rows.append([f"{eps:.0e}", str(len(acc)), f"{mean:.2f} ± {std:.2f}", *_paired_cells(p)])
      curve.append((eps, mean, std))
    lines.append(f"{arm}: {_title(by_eps[ref_eps][0]['config'])}")
    lines.append(
      _table(
        ["eps", "seeds", "test acc %", f"Δ vs {ref_eps:.0e} pp", *PAIRED_HEADER],
        rows,
      )
    )
    png = _plot_xy(
      {arm: curve}, out_dir, f"patches_sweep_eps_{arm}.png", "eps", "test accuracy (%)"
    )
    if png:
      lines.append(f"  plot: {png}")
    default = Setting.eps
    if ref_eps > default:
      lines.append(
        f"  paired against eps={ref_eps:.0e}, the smallest here: no {arm} run at the default"
        f" eps={default:.0e} in this setting; report these runs with a folder that has them"
        " (such as the main study's) to pair against the default"
      )
    lines.append("")
  return lines


def _report_select(runs: Sequence[dict]) -> list[str]:
  by_arm: dict = {}
  for r in runs:
    knob = knob_of(r["config"])
    by_arm.setdefault(r["arm"], {}).setdefault(knob, []).append(r["metrics"]["val_acc"])
  rows = []
  for arm in _arm_order(by_arm):
    scores = {k: float(np.mean(v)) for k, v in by_arm[arm].items()}
    best = max(scores, key=scores.__getitem__)
    rows.append(
      [
        arm,
        "  ".join(
          f"{k:g}:{100 * v:.2f}" + ("*" if k == best else "") for k, v in sorted(scores.items())
        ),
      ]
    )
  return [
    "patches (select-lr): validation accuracy % per rate (* = selected)",
    _table(["arm", "rate: val acc"], rows),
    "",
  ]


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


def _plot_xy(
  curves: dict, out_dir: pathlib.Path, name: str, xlabel: str, ylabel: str
) -> Optional[str]:
  plt = report_lib.pyplot()
  if plt is None:
    return None
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, (a, pts) in enumerate(curves.items()):
    pts = [p for p in pts if math.isfinite(p[1])]
    if not pts:
      continue
    x, m, s = map(np.asarray, zip(*pts))
    ax.errorbar(np.maximum(x, 1e-12), m, yerr=s, marker="o", capsize=3, label=a, color=f"C{i}")
  ax.set_xscale("log")
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.legend()
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
