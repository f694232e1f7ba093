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
import math
import shlex
from typing import Any
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import protocol
from stiefax.experiments import stats
from stiefax.experiments import store
from stiefax.experiments.arms import Arm
from stiefax.experiments.lm.config import PRESETS
from stiefax.experiments.lm.config import LMConfig

#: The frame rate of every preset (study 1's).
_DEFAULT_FRAME_RATE = LMConfig().frame_lr

__all__ = [
  "loss_of",
  "by_rate",
  "round_rate",
  "loss_verdict",
  "paired_loss_cells",
  "sweep_runs",
  "select_rate",
  "best_of",
  "sensitivity",
  "arm_definition",
  "run_config",
  "run_identity",
  "run_name",
  "run_key",
  "check_run",
  "diverged",
  "run_command",
]


def arm_definition(arm: Arm) -> dict:
  """How a run records its arm: rule, options, init, attention and description.

  The temperature, the gain-free q/k input and the per-head frame gain are recorded
  only where an arm has them, so the runs of the arms without them keep their hashes.
  """
  out = {
    "description": arm.description,
    "rule": arm.frames,
    "options": dict(arm.options),
    "orthonormal": arm.orthonormal,
    "attention": arm.attention,
    "frozen": arm.frame_lr == 0.0,
  }
  if arm.temperature:
    out["temperature"] = True
  if arm.qk_input != "gained":
    out["qk_input"] = arm.qk_input
  if arm.frame_gain:
    out["frame_gain"] = True
  if arm.matrices != "adamw":
    out["matrices"] = arm.matrices
  return out


def run_config(arm: Arm, config: LMConfig, corpus_facts: dict, preset: str) -> dict:
  """The ``"config"`` of a run (``matrix_lr`` only for an arm with a matrix rule)."""
  settings = dataclasses.asdict(config)
  if arm.matrices == "adamw":
    del settings["matrix_lr"]
  return {
    "experiment": "lm",
    "preset": preset,
    "arm": arm_definition(arm),
    "corpus": dict(corpus_facts),
    **settings,
  }


def run_identity(cfg: dict) -> dict:
  """The part of a run's configuration that decides its result: all of it."""
  return dict(cfg)


def _own_frame_rate(cfg: dict) -> bool:
  """Whether the run's frames move at ``frame_lr`` (a rule of their own, not frozen)."""
  return cfg["arm"]["rule"] != "adamw" and not cfg["arm"]["frozen"]


def run_name(arm: str, cfg: dict, seed: int) -> str:
  """``<arm>-<preset>-lr<adamw rate>[-flr<frame rate>][-mlr<matrix rate>]-<hash>-s<seed>.json``.

  The frame rate is named where the frames move at one other than the default 1.0,
  the matrix rate where the arm has a matrix rule.
  """
  stem = f"{arm}-{cfg['preset']}-lr{cfg['adamw_lr']:g}"
  if _own_frame_rate(cfg) and cfg["frame_lr"] != _DEFAULT_FRAME_RATE:
    stem += f"-flr{cfg['frame_lr']:g}"
  if "matrix_lr" in cfg:
    stem += f"-mlr{cfg['matrix_lr']:g}"
  return store.run_file_name(stem, run_identity(cfg), seed)


def run_key(run: dict) -> tuple:
  """Two files hold the same run when arm, configuration hash and seed agree."""
  return (run["arm"], store.digest(run_identity(run["config"])), run["seed"])


#: The history a run file must hold: non-empty lists of numbers, one per evaluation.
_HISTORY = ("step", "val_bpb", "max_logit")

#: The sizes of a run's configuration that the report and the rerun command read.
_SIZES = (
  "steps",
  "eval_every",
  "batch",
  "d_model",
  "depth",
  "heads",
  "kv_heads",
  "head_dim",
  "seq",
)

#: The metrics the commands and the report read: (key, must be finite, may be None;
#: None: may be None or absent).
_METRICS = (
  ("init_val_bpb", True, False),
  ("val_bpb", False, False),
  ("test_bpb", False, False),
  ("max_logit_max", False, False),
  ("entropy", False, False),
  ("isometry", False, False),
  ("tokens_per_second", False, None),
  ("frame_lr", False, True),
)


def check_run(run: dict) -> Any:
  """Why ``run`` cannot be read by the command or the report (None if it can).

  By type, every field they read: the config's rates (finite, the AdamW rate > 0),
  preset, sizes (:data:`_SIZES`, integers > 0), corpus and arm; the metrics (the loss at init finite; NaN or infinite final
  losses are a diverged run's, :func:`diverged`); ``diverged`` a bool; the history's
  ``step``, ``val_bpb`` and ``max_logit`` lists of numbers of one length, the other
  history entries lists of that length too.
  """
  cfg, m, where = run["config"], run["metrics"], "its config"
  for key in _SIZES:
    problem = protocol.number_problem(cfg, key, where, positive=True, integer=True)
    if problem:
      return problem
  corpus = cfg.get("corpus")
  if not isinstance(corpus, dict) or not isinstance(corpus.get("python"), str):
    return "its config lacks the corpus's string 'python'"
  problem = protocol.number_problem(corpus, "train_bytes", "its corpus facts", integer=True)
  if problem:
    return problem
  for key in ("adamw_lr", "frame_lr", "max_norm"):
    problem = protocol.number_problem(cfg, key, where, finite=True, positive=key == "adamw_lr")
    if problem:
      return problem
  if not isinstance(cfg.get("preset"), str):
    return "its config lacks the string 'preset'"
  arm = cfg.get("arm")
  if not isinstance(arm, dict) or not isinstance(arm.get("rule"), str):
    return "its config lacks the arm's 'rule'"
  if not isinstance(arm.get("frozen"), bool):
    return "its config's arm lacks the bool 'frozen'"
  if not isinstance(m.get("diverged"), bool):
    return "its metrics lack the bool 'diverged'"
  for key, finite, none in _METRICS:
    problem = protocol.number_problem(
      m, key, "its metrics", finite=finite, none=none is not False, optional=none is None
    )
    if problem:
      return problem
  problem = protocol.history_problem(run, _HISTORY)
  if problem:
    return problem
  history = run["history"]
  rest = [k for k, v in history.items() if k not in _HISTORY]
  return protocol.list_problem(history, rest, "its histories", length=len(history["step"]))


def diverged(run: dict) -> bool:
  """Whether ``run`` diverged: recorded so, or its final validation loss not finite."""
  m = run["metrics"]
  v = m.get("val_bpb")
  return bool(m["diverged"]) or v is None or not math.isfinite(v)


def run_command(arm: str, cfg: dict, seed: int, out: Any) -> str:
  """The ``stiefax lm`` command line that reruns (or resumes) exactly this run.

  Settings equal to the preset's are left out; the others are spelled out.
  """
  preset = cfg["preset"]
  base = dataclasses.asdict(PRESETS[preset])
  parts = ["stiefax", "lm", "--preset", preset, "--arms", arm, "--seeds", str(seed)]
  parts += ["--lr", repr(cfg["adamw_lr"])]
  if cfg["frame_lr"] != base["frame_lr"]:
    parts += ["--frame-lr", repr(cfg["frame_lr"])]
  if "matrix_lr" in cfg:
    parts += ["--matrix-lr", repr(cfg["matrix_lr"])]
  for name in ("steps", "eval_every", "batch", "max_norm"):
    if cfg[name] != base[name]:
      parts += [f"--{name.replace('_', '-')}", str(cfg[name])]
  parts += ["--out", shlex.quote(str(out))]
  return " ".join(parts)


def loss_of(run: dict, key: str = "val_bpb") -> float:
  """``min(loss, loss at init)``; a diverged run's loss is its loss at init."""
  m = run["metrics"]
  init = m["init_val_bpb"]
  if not math.isfinite(init):  # a run no selection may choose
    return math.inf
  v = m.get(key)
  if m["diverged"] or v is None or not math.isfinite(v):
    return init
  return min(v, init)


def loss_verdict(p: stats.Paired) -> str:
  """The verdict of a paired loss difference ``b - a`` in words: ``"worse"`` (b's loss
  is higher), ``"better"``, ``"no difference"`` or ``"not settled"``
  (:func:`stiefax.experiments.stats.verdict`)."""
  return {"b > a": "worse", "b < a": "better"}.get(p.verdict, p.verdict)


def paired_loss_cells(a: dict, b: dict, key: str = "test_bpb") -> list[str]:
  """``[Δ (n), t 95% CI, bootstrap 95% CI, verdict]`` of ``b - a`` in ``key`` (bits per
  byte, :func:`loss_of`), paired by seed: ``a`` and ``b`` are ``{seed: run}``. Four
  dashes below two shared seeds; a t interval that is not finite (no spread) is '-'."""
  common = sorted(set(a) & set(b))
  if len(common) < 2:
    return ["-"] * 4
  p = stats.paired([loss_of(a[s], key) for s in common], [loss_of(b[s], key) for s in common])
  t_ci = "-" if not math.isfinite(p.t_low) else f"[{p.t_low:+.4f}, {p.t_high:+.4f}]"
  return [
    f"{p.mean:+.4f} ({len(common)})",
    t_ci,
    f"[{p.ci_low:+.4f}, {p.ci_high:+.4f}]",
    loss_verdict(p),
  ]


def round_rate(x: float) -> float:
  """``x`` to six significant digits: a rate x3 or /3 of a grid's (``3 * 1e-2`` is
  ``0.03``, not ``0.030000000000000002``), so run names and hashes stay the same."""
  return float(f"{x:.6g}")


def by_rate(runs: Sequence[dict]) -> dict:
  """``{AdamW rate: {seed: run}}`` of ``runs`` (one arm, one setting)."""
  out: dict = {}
  for r in runs:
    out.setdefault(r["config"]["adamw_lr"], {})[r["seed"]] = r
  return out


def sweep_runs(runs: Sequence[dict]) -> list[dict]:
  """The runs of ``runs`` (one arm, one setting) at the sweep's seeds: the seeds every
  rate of the arm has. Seeds added at the best rate alone (the best-rate comparison's)
  are left out, so each point of the sweep rests on the same seeds."""
  rates = by_rate(runs)
  if not rates:
    return []
  common = set.intersection(*(set(s) for s in rates.values()))
  return [r for r in runs if r["seed"] in common] if common else list(runs)


def select_rate(runs: Sequence[dict]) -> Optional[float]:
  """The rate of ``runs`` (one arm, one setting) with the lowest mean validation loss
  over the seeds every rate has; ties go to the smaller rate, and a rate whose mean is
  not finite is never chosen (:func:`best_of`)."""
  rates = by_rate(runs)
  if not rates:
    return None
  common = set.intersection(*(set(s) for s in rates.values()))
  if not common:
    return None
  means = {lr: np.mean([loss_of(seeds[s]) for s in common]) for lr, seeds in rates.items()}
  return best_of(means)


def best_of(means: dict) -> Any:
  """The key of ``means`` with the lowest finite mean loss (ties: the smaller key);
  NaN and infinite means are never chosen (None when no mean is finite)."""
  finite = {k: float(v) for k, v in means.items() if math.isfinite(v)}
  return min(finite, key=lambda k: (finite[k], k)) if finite else None


def sensitivity(runs: Sequence[dict]) -> float:
  """Wortsman et al.'s learning-rate sensitivity of one arm: the mean over rates of
  ``min(loss, loss at init) - best loss``, each rate's loss the mean over the sweep's
  seeds (:func:`sweep_runs`)."""
  rates = by_rate(sweep_runs(runs))
  means = [np.mean([loss_of(r) for r in seeds.values()]) for seeds in rates.values()]
  return float(np.mean(means) - np.min(means)) if means else float("nan")
