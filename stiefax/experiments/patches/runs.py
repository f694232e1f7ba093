"""What identifies a ``stiefax patches`` run: its configuration, hash, file name, command.

A run's configuration (the ``"config"`` of its JSON file) holds every setting it
depends on; :func:`config_hash` digests it (less where the data was read from), and
goes into the run's file name, so runs that differ in any setting never share a file.
:func:`run_command` is the command line that reruns exactly one run. These are frozen:
a run written by an earlier version of this code is recognised as the same run.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any
from typing import Optional

from stiefax.experiments import store
from stiefax.experiments.arms import Arm
from stiefax.experiments.patches.config import Setting
from stiefax.experiments.patches.config import frame_init
from stiefax.experiments.protocol import number_problem

#: The rates runs record under an earlier name, part of their identities (so fixed):
#: the frame rate, ``frame_lr``, is recorded as ``riemannian_lr``.
RECORDED_NAMES = {"frame_lr": "riemannian_lr"}

__all__ = [
  "RECORDED_NAMES",
  "DataFacts",
  "arm_definition",
  "run_config",
  "run_identity",
  "config_hash",
  "run_name",
  "run_key",
  "check_run",
  "knob_of",
  "run_command",
]


@dataclasses.dataclass(frozen=True)
class DataFacts:
  """What a run records about its data besides the command-line settings."""

  dataset: str  # the data set's name (images_lib.Images.name)
  classes: int
  n_test: int
  n_val: int
  tokens: int  # patches per image
  pca_fit_patches: int  # patches the whitening was fitted on

  @classmethod
  def of(cls, images: Any, data: Any) -> DataFacts:
    """From the :class:`~stiefax.experiments.patches.images.Images` and the
    :class:`~stiefax.experiments.patches.data.PatchData` of a run."""
    return cls(
      dataset=images.name,
      classes=len(images.classes),
      n_test=len(data.test_y),
      n_val=len(data.val_y),
      tokens=int(data.train_x.shape[1]),
      pca_fit_patches=int(data.whitening.n_fit),
    )


def arm_definition(arm: Arm) -> dict:
  """How a run records its arm: ``{"frame_init", "description"}``, and ``"attention"``
  for an arm whose attention is not plain (:mod:`stiefax.experiments.attention`).

  Entries of a run's ``"config"`` (the rule and rates are recorded with the settings).
  """
  definition = {"frame_init": frame_init(arm), "description": arm.description}
  if arm.attention != "plain":  # absent for the plain arms: their hashes predate it
    definition["attention"] = arm.attention
  return definition


def run_config(
  protocol: str,
  arm: Arm,
  setting: Setting,
  hp: dict,
  facts: DataFacts,
  *,
  data: Optional[str],
  patch: int,
  whiten_eps: float,
  pca_samples: int,
  order_seed: int,
  eval_split: str,
) -> dict:
  """The ``"config"`` of a run (``data``: the ``--data`` path as given)."""
  cfg = {
    "protocol": protocol,
    "dataset": facts.dataset,
    "data": data,
    "classes": facts.classes,
    "n_test": facts.n_test,
    "n_val": facts.n_val,
    "tokens": facts.tokens,
    "patch": patch,
    "whiten_eps": whiten_eps,
    "pca_samples": pca_samples,
    "pca_fit_patches": facts.pca_fit_patches,
    "order_seed": order_seed,
    "eval_split": eval_split,
    "steps_per_epoch": setting.steps_per_epoch,
    "total_steps": setting.total_steps,
    "warmup_steps": setting.warmup_steps,
    **arm_definition(arm),
  }
  cfg.update(dataclasses.asdict(setting))
  cfg.update({RECORDED_NAMES.get(k, k): v for k, v in hp.items()})
  if hp["eps"] is None:
    cfg["eps"] = None
  if not arm.penalty:
    cfg["penalty"] = None
  return cfg


def knob_of(cfg: dict) -> Optional[float]:
  """The rate ``--lr`` set for the run: lambda, else the frame rate (recorded as
  ``riemannian_lr``), else the AdamW rate."""
  for k in ("penalty", "riemannian_lr"):
    if cfg.get(k) is not None:
      return cfg[k]
  return cfg.get("adamw_lr")


def run_identity(cfg: dict) -> dict:
  """The part of a run's configuration that decides its result.

  Everything but where the data was read from (``"data"``, a path that differs between
  machines; the data set itself is named by ``"dataset"``).
  """
  return {k: v for k, v in json.loads(json.dumps(cfg)).items() if k != "data"}


def config_hash(cfg: dict) -> str:
  """8 hex digits of the SHA-256 of :func:`run_identity`, canonical JSON."""
  return store.digest(run_identity(cfg))


def run_name(protocol: str, arm: str, cfg: dict, seed: int) -> str:
  """``<protocol>-<arm>-n<n>[-eps<eps>|-k<knob>]-<config hash>-s<seed>.json``.

  The hash makes the name a function of the whole configuration, so runs that differ
  in any setting (depth, rates, budget, ...) never share a file.
  """
  stem = f"{protocol}-{arm}-n{cfg['n_train']}"
  if protocol == "sweep-eps":
    stem += f"-eps{cfg['eps']:.0e}"
  if protocol == "select-lr":
    stem += f"-k{knob_of(cfg):g}"
  return store.run_file_name(stem.replace("+", ""), run_identity(cfg), seed)


def run_key(run: dict) -> tuple:
  """Two files hold the same run when protocol, arm, :func:`config_hash` and seed agree."""
  return (run["config"].get("protocol"), run["arm"], config_hash(run["config"]), run["seed"])


def check_run(run: dict) -> Optional[str]:
  """What a run lacks for the report (``None`` if nothing); see ``stiefax report``.

  By type: the config's string ``protocol``; the metrics ``test_acc`` (a number or None),
  ``isometry`` and ``wall_per_epoch`` (numbers).
  """
  if not isinstance(run["config"].get("protocol"), str):
    return "its config lacks the string 'protocol'"
  for key in ("test_acc", "isometry", "wall_per_epoch"):
    problem = number_problem(run["metrics"], key, "its metrics", none=key == "test_acc")
    if problem:
      return problem
  return None


def _quote(value: object) -> str:
  return shlex.quote(str(value))


def run_command(protocol: str, arm: str, cfg: dict, seed: int, out: str) -> str:
  """The ``stiefax patches`` command line that reruns exactly this one run."""
  c = cfg
  knob = knob_of(c)
  parts = ["stiefax", "patches"]
  if protocol == "sweep-n":
    parts += ["sweep-n", "--ns", str(c["n_train"]), "--budget", str(c["total_steps"])]
  elif protocol == "sweep-eps":
    parts += [
      "sweep-eps",
      "--eps-values",
      repr(c["eps"]),
      "--n-train",
      str(c["n_train"]),
      "--epochs",
      str(c["epochs"]),
    ]
  else:
    parts += ["--n-train", str(c["n_train"]), "--epochs", str(c["epochs"])]
    if c.get("eps") is not None:
      parts += ["--eps", repr(c["eps"])]
  if c.get("data") is not None:
    parts += ["--data", _quote(c["data"])]
  if protocol == "select-lr":
    parts += ["--n-val", str(c["n_val"])]
  parts += [
    "--arms",
    arm,
    "--seeds",
    str(seed),
    "--depth",
    str(c["depth"]),
    "--patch",
    str(c["patch"]),
    "--d",
    str(c["d"]),
    "--heads",
    str(c["heads"]),
    "--head-dim",
    str(c["head_dim"]),
    "--mlp-ratio",
    str(c["mlp_ratio"]),
    "--batch-size",
    str(c["batch_size"]),
    "--warmup-epochs",
    str(c["warmup_epochs"]),
    "--adamw-lr",
    repr(c["adamw_lr"]),
    "--weight-decay",
    repr(c["weight_decay"]),
    "--max-norm",
    repr(c["max_norm"]),
    "--polar",
    c["polar"],
    "--whiten-eps",
    repr(c["whiten_eps"]),
    "--pca-samples",
    str(c["pca_samples"]),
    "--order-seed",
    str(c["order_seed"]),
  ]
  if knob is not None and arm != "frozen":
    parts += ["--lr", f"{arm}={knob!r}"]
  parts += ["--out", _quote(out)]
  return " ".join(parts)
