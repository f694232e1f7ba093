"""The quick grokking preset over seeds and XLA CPU thread settings, and its summary.

``stiefax grok`` (the quick preset: A2 and B2 on c = (a + b) mod 23, 800 epochs) is run
for every seed under every thread setting, one ``stiefax grok`` process at a time, each
setting storing its runs in a folder of its own (``<out>/grok-quick-<setting>``; the run
store never overwrites a finished run, and a rerun of this script skips them). Then the
summary: per thread setting and arm, how many seeds memorized, grokked and sustained it
(k/n), the ranges of the grok epoch and of the peak, end and tail held-out accuracy, and
the training collapses (:mod:`stiefax.experiments.grok.collapses`), written as JSON
(``<out>/grok-quick-summary.json``), the source of the README's quick-preset figures.

    python -m benchmarks.grok_quick [--seeds 0,1,2,3,4] [--settings t1,t2] [--summary-only]
        [--plot docs/img/grok_quick_collapses.png]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
from typing import Optional
from typing import Sequence

#: XLA CPU thread settings: ``name -> XLA_FLAGS``. ``t1``: Eigen's thread pool off (one
#: intra-op thread); ``t2``: the default (one thread per core; this machine has two).
SETTINGS = {
  "t1": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
  "t2": "",
}
DEFAULT_OUT = pathlib.Path("results/checks")
SUMMARY_NAME = "grok-quick-summary.json"


def setting_dir(out: pathlib.Path, setting: str) -> pathlib.Path:
  return out / f"grok-quick-{setting}"


def run_setting(out: pathlib.Path, setting: str, seed: int) -> None:
  """``stiefax grok`` (quick preset, one seed) in a process of its own under ``setting``."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), SETTINGS[setting]) if f)
  command = [
    sys.executable,
    "-m",
    "stiefax.experiments.cli",
    "grok",
    "--preset",
    "quick",
    "--seeds",
    str(seed),
    "--out",
    str(setting_dir(out, setting)),
  ]
  print(f"[{setting}] XLA_FLAGS={env['XLA_FLAGS']!r}: {' '.join(command[2:])}", flush=True)
  subprocess.run(command, env=env, check=True)


def load_runs(directory: pathlib.Path) -> list[dict]:
  """The finished quick-preset runs stored in ``directory`` (sorted by arm, seed)."""
  runs = []
  for path in sorted(directory.glob("*.json")):
    record = json.loads(path.read_text())
    if record.get("experiment") == "grok" and record["config"].get("preset") == "quick":
      record["_file"] = path.name
      runs.append(record)
  return sorted(runs, key=lambda r: (r["arm"], r["seed"]))


def _range(values: Sequence[Optional[float]], digits: Optional[int] = None) -> Optional[list]:
  xs = [v for v in values if v is not None]
  if not xs:
    return None
  lo, hi = min(xs), max(xs)
  return [round(lo, digits), round(hi, digits)] if digits is not None else [lo, hi]


def arm_summary(runs: Sequence[dict]) -> dict:
  """The figures of one arm's runs under one setting (see the module docstring)."""
  from stiefax.experiments.grok import collapses  # pylint: disable=g-import-not-at-top

  ms = [r["metrics"] for r in runs]
  n = len(runs)
  count = lambda key: sum(m[key] is not None for m in ms)
  found = [collapses.find_collapses(r["history"], r["config"]["memorize_threshold"]) for r in runs]
  peaks = [max(r["history"]["test_acc"]) for r in runs]
  return {
    "seeds": [r["seed"] for r in runs],
    "n": n,
    "memorized": count("memorized_epoch"),
    "grokked": count("grokked_epoch"),
    "sustained": count("sustained_epoch"),
    "memorized_epoch": _range([m["memorized_epoch"] for m in ms]),
    "grokked_epoch": _range([m["grokked_epoch"] for m in ms]),
    "sustained_epoch": _range([m["sustained_epoch"] for m in ms]),
    "peak_test_acc": _range(peaks, 4),
    "end_test_acc": _range([m["end_test_acc"] for m in ms], 4),
    "tail_test_acc": _range([m["tail_test_acc"] for m in ms], 4),
    "end_train_acc": _range([m["end_train_acc"] for m in ms], 4),
    "max_isometry_after_init": _range([m["max_isometry_after_init"] for m in ms]),
    "collapses": sum(len(c) for c in found),
    "runs_with_collapse": sum(bool(c) for c in found),
    "collapses_per_run": [len(c) for c in found],
    "ended_in_collapse": sum(bool(c) and c[-1]["end"] is None for c in found),
    "wall_time_s": _range([r["wall_time"] for r in runs], 1),
    "per_seed": [
      {
        "seed": r["seed"],
        "file": r["_file"],
        "memorized_epoch": m["memorized_epoch"],
        "grokked_epoch": m["grokked_epoch"],
        "sustained_epoch": m["sustained_epoch"],
        "peak_test_acc": round(peak, 4),
        "end_test_acc": round(m["end_test_acc"], 4),
        "end_train_acc": round(m["end_train_acc"], 4),
        "collapses": c,
      }
      for r, m, peak, c in zip(runs, ms, peaks, found)
    ],
  }


def identical_histories(a: Sequence[dict], b: Sequence[dict]) -> dict:
  """Per arm, the seeds whose evaluation histories are bit-identical in ``a`` and ``b``."""
  same: dict = {}
  by_key = {(r["arm"], r["seed"]): r["history"] for r in b}
  for r in a:
    other = by_key.get((r["arm"], r["seed"]))
    if other is not None:
      keys = ("train_loss", "train_acc", "test_acc", "isometry")
      if all(r["history"][k] == other[k] for k in keys):
        same.setdefault(r["arm"], []).append(r["seed"])
  return same


def summarize(out: pathlib.Path, settings: Sequence[str]) -> dict:
  """The summary of the runs under ``out`` for ``settings`` (the JSON this script writes)."""
  from stiefax.experiments.grok import collapses  # pylint: disable=g-import-not-at-top

  runs = {s: load_runs(setting_dir(out, s)) for s in settings}
  summary: dict = {
    "what": "stiefax grok --preset quick (A2, B2; c = (a + b) mod 23; 800 epochs,"
    " evaluation every 50) per seed under each XLA CPU thread setting",
    "command": "python -m benchmarks.grok_quick",
    "settings": {s: {"XLA_FLAGS": SETTINGS[s], "dir": setting_dir(out, s).name} for s in settings},
    "collapse_rule": collapses.RULE,
    "arms": {},
  }
  for s in settings:
    by_arm: dict = {}
    for r in runs[s]:
      by_arm.setdefault(r["arm"], []).append(r)
    for arm, rs in by_arm.items():
      summary["arms"].setdefault(arm, {})[s] = arm_summary(rs)
  if len(settings) == 2:
    summary["bit_identical_across_settings"] = identical_histories(*(runs[s] for s in settings))
  return summary


THREADS = {"t1": "1 thread", "t2": "2 threads"}


def _span(r: Optional[list], fmt: str = "{}") -> str:
  if r is None:
    return "-"
  lo, hi = (fmt.format(x) for x in r)
  return lo if lo == hi else f"{lo}-{hi}"


def figures_table(summary: dict) -> str:
  """The summary as the Markdown table the README and the docs quote."""
  lines = [
    "| arm | XLA CPU threads | memorized | grokked | first grok epoch | sustained"
    " | held-out peak | held-out end | collapses (runs with one) | runs ending in one |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for arm, per in summary["arms"].items():
    for s, a in per.items():
      n = a["n"]
      lines.append(
        f"| {arm} | {THREADS.get(s, s)} | {a['memorized']}/{n} | {a['grokked']}/{n}"
        f" | {_span(a['grokked_epoch'])} | {a['sustained']}/{n}"
        f" | {_span(a['peak_test_acc'], '{:.2f}')} | {_span(a['end_test_acc'], '{:.2f}')}"
        f" | {a['collapses']} ({a['runs_with_collapse']}/{n}) | {a['ended_in_collapse']}/{n} |"
      )
  return "\n".join(lines)


def figures_text(summary: dict) -> tuple[str, ...]:
  """The summary in plain words, one line per arm (what ``stiefax grok`` prints)."""
  lines = []
  for arm, per in summary["arms"].items():
    settings = list(per)
    n = {per[s]["n"] for s in settings}
    if len(n) != 1:
      raise ValueError(f"{arm}: the settings have different numbers of seeds {sorted(n)}")
    k = n.pop()
    both = lambda key, per=per, settings=settings, k=k: " and ".join(
      f"{per[s][key]}/{k}" for s in settings
    )

    def span(key, fmt="{}", per=per, settings=settings):
      lo = [per[s][key][0] for s in settings if per[s][key] is not None]
      hi = [per[s][key][1] for s in settings if per[s][key] is not None]
      return _span([min(lo), max(hi)] if lo else None, fmt)

    per_run = [c for s in settings for c in per[s]["collapses_per_run"]]
    lines.append(
      f"{arm}: memorized {both('memorized')} seeds, grokked {both('grokked')}"
      f" (first at epoch {span('grokked_epoch')}), sustained {both('sustained')};"
      f" held-out peak {span('peak_test_acc', '{:.2f}')}, end {span('end_test_acc', '{:.2f}')};"
      f" {_span([min(per_run), max(per_run)])} training collapses per run,"
      f" {both('ended_in_collapse')} runs ending inside one"
    )
  return tuple(lines)


def _every_setting(summary: dict, arm: str, test) -> bool:
  return all(test(a) for a in summary["arms"][arm].values())


#: What the README says of the quick preset on any machine: each claim held in every
#: run of the committed measurement; the slow test checks them on a fresh one.
CLAIMS = (
  (
    "every run memorizes the training set (train accuracy >= 0.99) by epoch 50",
    lambda m: all(
      _every_setting(m, arm, lambda a: a["memorized"] == a["n"] and a["memorized_epoch"][1] <= 50)
      for arm in ("A2", "B2")
    ),
  ),
  (
    "A2 reaches held-out accuracy >= 0.95 in at least 4 of 5 seeds",
    lambda m: _every_setting(m, "A2", lambda a: a["grokked"] >= 4),
  ),
  (
    "B2 holds it for 3 evaluations in a row in none",
    lambda m: _every_setting(m, "B2", lambda a: a["sustained"] == 0),
  ),
  (
    "every run has at least one training collapse",
    lambda m: all(
      _every_setting(m, arm, lambda a: a["runs_with_collapse"] == a["n"]) for arm in ("A2", "B2")
    ),
  ),
  (
    "B2's W_Q, W_K stay on the Stiefel manifold to float32 rounding (isometry error"
    " below 2e-6) while A2's leave it (above 0.5)",
    lambda m: (
      _every_setting(m, "B2", lambda a: a["max_isometry_after_init"][1] < 2e-6)
      and _every_setting(m, "A2", lambda a: a["max_isometry_after_init"][0] > 0.5)
    ),
  ),
)


def claims_text() -> tuple[str, ...]:
  """The words of the claims of :data:`CLAIMS`, as the README and the docs quote them."""
  return tuple(text for text, _ in CLAIMS)


def check_claims(summary: dict) -> list[str]:
  """The claims of :data:`CLAIMS` that ``summary`` does not bear out (none: all hold)."""
  return [text for text, test in CLAIMS if not test(summary)]


def plot(out: pathlib.Path, settings: Sequence[str], path: pathlib.Path) -> None:
  """Training loss and accuracies of every run, one column per arm, collapses marked."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  from stiefax.experiments.grok import collapses  # pylint: disable=g-import-not-at-top

  runs = {s: load_runs(setting_dir(out, s)) for s in settings}
  arms = sorted({r["arm"] for rs in runs.values() for r in rs})
  fig, axes = plt.subplots(2, len(arms), figsize=(5.2 * len(arms), 6.0), sharex=True, squeeze=False)
  cmap = plt.get_cmap("tab10")
  styles = dict(zip(settings, ("-", "--", ":")))
  for col, arm in enumerate(arms):
    loss_ax, acc_ax = axes[0, col], axes[1, col]
    for s in settings:
      for r in (r for r in runs[s] if r["arm"] == arm):
        h, color = r["history"], cmap(r["seed"] % 10)
        label = f"seed {r['seed']}" if s == settings[0] else None
        loss_ax.semilogy(h["epoch"], h["train_loss"], styles[s], color=color, lw=1, label=label)
        acc_ax.plot(h["epoch"], h["test_acc"], styles[s], color=color, lw=1)
        found = collapses.find_collapses(h, r["config"]["memorize_threshold"])
        where = {c["start"] for c in found}
        xs = [e for e in h["epoch"] if e in where]
        ys = [lo for e, lo in zip(h["epoch"], h["train_loss"]) if e in where]
        loss_ax.plot(xs, ys, "x", color=color, ms=6)
    n = sum(
      len(collapses.find_collapses(r["history"]))
      for s in settings
      for r in runs[s]
      if r["arm"] == arm
    )
    k = sum(r["arm"] == arm for s in settings for r in runs[s])
    loss_ax.set_title(f"{arm}: training loss ({n} collapses caught in {k} runs, x)")
    acc_ax.set_title(f"{arm}: held-out accuracy")
    acc_ax.axhline(0.95, color="0.5", lw=0.8, ls=":")
    acc_ax.set_ylim(-0.02, 1.02)
    acc_ax.set_xlabel("epoch")
    for ax in (loss_ax, acc_ax):
      ax.grid(alpha=0.3)
  axes[0, 0].set_ylabel("training loss (full batch)")
  axes[1, 0].set_ylabel("held-out accuracy")
  axes[0, 0].legend(fontsize=7, ncol=2, loc="upper right")
  fig.text(
    0.5,
    0.005,
    "quick preset, seeds 0-4; "
    + ", ".join(
      f"{name} {THREADS.get(s, s)}" for name, s in zip(("solid:", "dashed:", "dotted:"), settings)
    )
    + " (XLA CPU); evaluations every 50 epochs; x: an evaluation starting a collapse",
    ha="center",
    fontsize=8,
  )
  fig.tight_layout(rect=(0, 0.03, 1, 1))
  fig.savefig(path, dpi=110)
  plt.close(fig)
  print(f"plot: {path}")


def main(argv: Optional[Sequence[str]] = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", default="0,1,2,3,4")
  parser.add_argument("--settings", default=",".join(SETTINGS), help="from " + ",".join(SETTINGS))
  parser.add_argument("--out", default=str(DEFAULT_OUT))
  parser.add_argument("--summary-only", action="store_true", help="only summarize stored runs")
  parser.add_argument("--plot", default=None, help="also write the figure to this PNG")
  args = parser.parse_args(argv)
  out = pathlib.Path(args.out)
  settings = [s for s in args.settings.split(",") if s]
  unknown = [s for s in settings if s not in SETTINGS]
  if unknown:
    parser.error(f"unknown setting(s) {','.join(unknown)}; choose from {','.join(SETTINGS)}")
  if not args.summary_only:
    for seed in (int(s) for s in args.seeds.split(",")):
      for setting in settings:
        run_setting(out, setting, seed)
  summary = summarize(out, settings)
  path = out / SUMMARY_NAME
  text = json.dumps(summary, indent=1) + "\n"
  path.write_text(text)
  print(f"summary -> {path}")
  if args.plot:
    plot(out, settings, pathlib.Path(args.plot))
  print("\n".join(figures_text(summary)))
  failed = check_claims(summary)
  print("claims: " + ("all hold" if not failed else "NOT holding: " + "; ".join(failed)))
  print(figures_table(summary))
  for arm, per in summary["arms"].items():
    for s, a in per.items():
      print(
        f"  {arm:<3} {s}: n={a['n']} memorized {a['memorized']}/{a['n']}, grokked"
        f" {a['grokked']}/{a['n']} (epochs {a['grokked_epoch']}), sustained"
        f" {a['sustained']}/{a['n']}; held-out peak {a['peak_test_acc']}, end"
        f" {a['end_test_acc']}; collapses {a['collapses']} in {a['runs_with_collapse']} runs"
      )


if __name__ == "__main__":
  main()
