"""How the report of ``stiefax patches`` runs groups them.

A setting is a run's identity less its arm's own fields (:func:`group_key`); within
one, arms are named (:func:`label`) and ordered (:func:`arm_order`), settings are
ordered (:func:`setting_order`) and titled (:func:`title`), and two arms are compared
paired within seed (:func:`by_seed`, :func:`paired_row`). The tables of
:mod:`stiefax.experiments.patches.tables` and
:mod:`stiefax.experiments.patches.sweep_tables` share them.
"""

from __future__ import annotations

import json
from typing import Iterable
from typing import Optional
from typing import Sequence

from stiefax.experiments import report as report_lib
from stiefax.experiments import stats
from stiefax.experiments.patches.config import ARMS
from stiefax.experiments.patches.runs import run_identity

__all__ = [
  "ARM_FIELDS",
  "group_key",
  "label",
  "setting_order",
  "arm_order",
  "title",
  "by_seed",
  "paired_row",
]

# Configuration fields that belong to an arm rather than to the setting it runs in.
ARM_FIELDS = (
  "protocol",
  "riemannian_lr",
  "penalty",
  "eps",
  "description",
  "frame_init",
  "attention",
)


def group_key(cfg: dict, drop: Sequence[str] = ()) -> str:
  """The setting a run belongs to: its identity less the arm's own fields and ``drop``."""
  ident = run_identity(cfg)
  for k in (*ARM_FIELDS, *drop):
    ident.pop(k, None)
  return json.dumps(ident, sort_keys=True)


def label(r: dict, knobs: dict) -> str:
  """The arm's name, with its knob when one arm runs at several knobs in a group."""
  if len(knobs.get(r["arm"], ())) < 2:
    return r["arm"]
  c = r["config"]
  if c.get("penalty") is not None:
    return f"{r['arm']} λ={c['penalty']:g}"
  if c.get("riemannian_lr") is not None:
    return f"{r['arm']} lr={c['riemannian_lr']:g}"
  return f"{r['arm']} lr={c['adamw_lr']:g}"


def setting_order(cfg: dict) -> tuple:
  """Settings in the tables: by depth, then the larger AdamW rate first, then n."""
  return (cfg["depth"], -cfg["adamw_lr"], cfg.get("n_train") or 0, cfg.get("epochs") or 0)


def arm_order(names: Iterable[str]) -> list[str]:
  return report_lib.arm_order(names, ARMS)


def title(cfg: dict) -> str:
  return (
    f"{cfg.get('dataset')} n_train={cfg.get('n_train')} test={cfg.get('n_test')}"
    f" epochs={cfg.get('epochs')} ({cfg.get('total_steps')} steps) depth={cfg.get('depth')}"
    f" d={cfg.get('d')} H={cfg.get('heads')} r={cfg.get('head_dim')}"
    f" adamw_lr={cfg.get('adamw_lr'):g}"
  )


def by_seed(runs: Sequence[dict], metric: str) -> dict:
  return report_lib.by_seed(runs, metric)


def paired_row(base: dict, other: dict) -> Optional[stats.Paired]:
  """``other - base`` in percentage points on their shared seeds (None: none shared)."""
  return report_lib.paired_by_seed(base, other, scale=100.0)
