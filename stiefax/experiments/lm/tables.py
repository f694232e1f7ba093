"""The report of ``stiefax lm`` runs (also printed by ``stiefax report``): which study
each setting's runs belong to, and its tables.

Runs are grouped by setting (everything but the arm and its rates). A folder with an arm
of study 3 (a matrix rule) is study 3's (:mod:`stiefax.experiments.lm.norms_tables`);
a setting with study 2's arms, frame rates or larger model gets study 2's tables
(:mod:`stiefax.experiments.lm.fair_tables`) and, on the small model, study 1's tables of
study 1's runs after them; any other setting gets study 1's
(:mod:`stiefax.experiments.lm.sweep_tables`). :func:`summary` is what ``stiefax lm``
prints after its runs.
"""

from __future__ import annotations

import json
import pathlib
from typing import Optional
from typing import Sequence

from stiefax.experiments.lm import fair
from stiefax.experiments.lm import fair_tables
from stiefax.experiments.lm import norms_tables
from stiefax.experiments.lm import sweep_tables
from stiefax.experiments.lm.runs import diverged
from stiefax.experiments.report import num
from stiefax.experiments.report import table

__all__ = ["report", "summary"]

_ARM_FIELDS = ("adamw_lr", "arm", "frame_lr", "matrix_lr")


def _group_key(cfg: dict) -> str:
  return json.dumps({k: v for k, v in cfg.items() if k not in _ARM_FIELDS}, sort_keys=True)


def _title(cfg: dict) -> str:
  return (
    f"lm ({cfg['preset']}): d={cfg['d_model']} depth={cfg['depth']}"
    f" heads={cfg['heads']}/{cfg['kv_heads']} r={cfg['head_dim']} seq={cfg['seq']}"
    f" batch={cfg['batch']} steps={cfg['steps']};\n  text: Python {cfg['corpus']['python']}"
    f" standard library, {cfg['corpus']['train_bytes']:,} training bytes"
  )


def report(runs: list[dict], out_dir: Optional[pathlib.Path]) -> str:
  """The tables (and PNG figures in ``out_dir``; none when it is None) of ``lm`` runs,
  per setting."""
  runs = [r for r in runs if r.get("experiment") == "lm"]
  if not runs:
    return "lm: no runs"
  if norms_tables.is_study3(runs):
    return "\n".join(norms_tables.report(runs, out_dir)).rstrip() + "\n"
  groups: dict = {}
  for r in runs:
    groups.setdefault(_group_key(r["config"]), []).append(r)
  lines: list[str] = []
  # A figure is named by its preset, and by its setting's index only where two
  # settings share a preset.
  presets = [g[0]["config"]["preset"] for _, g in sorted(groups.items())]
  for gi, (_, group) in enumerate(sorted(groups.items())):
    study2 = fair.is_study2(group)
    lines.append(_title(group[0]["config"]))
    lines.append("")
    if study2:
      lines += fair_tables.report(group)
      if fair.is_large(group):
        continue
      lines.append("study 1's arms at study 1's frame rate, as study 1 reports them:")
      lines.append("")
    preset = group[0]["config"]["preset"]
    stem = f"lm_{preset}" + (f"_{gi}" if presets.count(preset) > 1 else "")
    study1 = sweep_tables.study1_runs(group) if study2 else group
    lines += sweep_tables.report(study1, out_dir, stem)
    lines.append("")
  return "\n".join(lines).rstrip() + "\n"


def summary(records: Sequence[dict]) -> str:
  """What ``stiefax lm`` prints after its runs: a row per run, then plain words."""
  rows = []
  for r in records:
    m = r["metrics"]
    rows.append(
      [
        r["arm"],
        f"{r['config']['adamw_lr']:g}",
        num(m.get("frame_lr"), "g"),
        str(r["seed"]),
        "diverged" if diverged(r) else f"{m['val_bpb']:.4f}",
        "-" if diverged(r) else num(m["test_bpb"], ".4f"),
        num(m["max_logit_max"], ".1f"),
        num(m["entropy"], ".2f"),
        num(m["isometry"], ".1e"),
      ]
    )
  lines = [
    table(
      [
        "arm",
        "rate",
        "frame rate",
        "seed",
        "val bpb",
        "test bpb",
        "max logit",
        "entropy",
        "isometry",
      ],
      rows,
    )
  ]
  lines.append(_words(records))
  return "\n".join(lines)


def _words(records: Sequence[dict]) -> str:
  """Plain words on the runs just made: which ended lowest, by how much, and the logits.

  A run is named by its arm, and also by its AdamW rate, its frame rate and its seed
  where the runs span several of them, so no two runs read alike.
  """
  ok = [r for r in records if not diverged(r)]
  if len(ok) < 2:
    return ""
  parts = {
    "rate": lambda r: f"at {r['config']['adamw_lr']:g}",
    "frame": lambda r: (
      "" if r["metrics"].get("frame_lr") is None else f"frame {r['metrics']['frame_lr']:g}"
    ),
    "seed": lambda r: f"seed {r['seed']}",
  }
  # A part names runs only where it varies among the runs that have it (a frame
  # rate among the arms with a frame rule).
  varying = [f for f in parts.values() if len({f(r) for r in ok} - {""}) > 1]

  def name(r: dict) -> str:
    return " ".join(x for x in (r["arm"], *(f(r) for f in varying)) if x)

  ok.sort(key=lambda r: r["metrics"]["test_bpb"])
  best, worst = ok[0], ok[-1]
  gap = worst["metrics"]["test_bpb"] - best["metrics"]["test_bpb"]
  logits = sorted(ok, key=lambda r: r["metrics"]["max_logit_max"])
  seeds = sorted({r["seed"] for r in records})
  return (
    f"In words: {name(best)} ended lowest ({best['metrics']['test_bpb']:.3f} bits/byte on"
    f" the test split), {gap:.3f} below {name(worst)}; the largest attention logit ran"
    f" from {logits[0]['metrics']['max_logit_max']:.1f} ({name(logits[0])}) to"
    f" {logits[-1]['metrics']['max_logit_max']:.1f} ({name(logits[-1])})."
    f" {'One seed' if len(seeds) == 1 else f'{len(seeds)} seeds'} of one short run"
    " cannot tell a real difference from noise: the study of docs/lm.md can."
  )
