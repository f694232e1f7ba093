"""What identifies a ``stiefax lm`` run: its configuration, hash, file name and command.

A run is (arm, configuration, seed). The configuration holds every field of
:class:`~stiefax.experiments.lm.config.LMConfig` (the AdamW rate among them), the
arm's definition and the corpus's facts (sizes and digests of the three splits), so a
run on another interpreter's standard library never pairs with these. The learning-
rate sweep and the best-rate comparison are runs of the same kind: the comparison at
an arm's best rate reuses the sweep's runs of that rate.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from stiefax.experiments import store
from stiefax.experiments.arms import Arm
from stiefax.experiments.lm.config import PRESETS
from stiefax.experiments.lm.config import LMConfig

__all__ = ["arm_definition", "run_config", "run_identity", "run_name", "run_key", "run_command"]


def arm_definition(arm: Arm) -> dict:
  """How a run records its arm: rule, options, init, attention and description."""
  return {
    "description": arm.description,
    "rule": arm.frames,
    "options": dict(arm.options),
    "orthonormal": arm.orthonormal,
    "attention": arm.attention,
    "frozen": arm.rate == 0.0,
  }


def run_config(arm: Arm, config: LMConfig, corpus_facts: dict, preset: str) -> dict:
  """The ``"config"`` of a run."""
  return {
    "experiment": "lm",
    "preset": preset,
    "arm": arm_definition(arm),
    "corpus": dict(corpus_facts),
    **dataclasses.asdict(config),
  }


def run_identity(cfg: dict) -> dict:
  """The part of a run's configuration that decides its result: all of it."""
  return dict(cfg)


def run_name(arm: str, cfg: dict, seed: int) -> str:
  """``<arm>-<preset>-lr<adamw rate>-<config hash>-s<seed>.json``."""
  stem = f"{arm}-{cfg['preset']}-lr{cfg['adamw_lr']:g}"
  return store.run_file_name(stem, run_identity(cfg), seed)


def run_key(run: dict) -> tuple:
  """Two files hold the same run when arm, configuration hash and seed agree."""
  return (run["arm"], store.digest(run_identity(run["config"])), run["seed"])


def check_run(run: dict) -> Any:
  """Why ``run`` cannot be reported (None if it can)."""
  cfg = run.get("config", {})
  for key in ("adamw_lr", "preset", "arm", "steps"):
    if key not in cfg:
      return f"its config lacks {key!r}"
  for key in ("val_bpb", "test_bpb", "init_val_bpb", "diverged"):
    if key not in run.get("metrics", {}):
      return f"its metrics lack {key!r}"
  return None


def run_command(arm: str, cfg: dict, seed: int, out: Any) -> str:
  """The ``stiefax lm`` command line that reruns (or resumes) exactly this run.

  Settings equal to the preset's are left out; the others are spelled out.
  """
  preset = cfg["preset"]
  base = dataclasses.asdict(PRESETS[preset])
  parts = ["stiefax", "lm", "--preset", preset, "--arms", arm, "--seeds", str(seed)]
  parts += ["--lr", repr(cfg["adamw_lr"])]
  for name in ("steps", "eval_every", "batch"):
    if cfg[name] != base[name]:
      parts += [f"--{name.replace('_', '-')}", str(cfg[name])]
  parts += ["--out", shlex.quote(str(out))]
  return " ".join(parts)
