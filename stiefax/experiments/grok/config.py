"""The grokking configuration: presets, the arms offered, and the paper's metrics."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING
from typing import Any
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import arms
from stiefax.experiments.arms import Arm

if TYPE_CHECKING:
  from stiefax.experiments import optim


@dataclasses.dataclass(frozen=True)
class GrokConfig:
  """Everything that defines a grokking run except the arm and the seed."""

  modulus: int = 97  # p: c = (a + b) mod p; the vocabulary is p + 1 (the "=" token)
  train_fraction: float = 0.4  # share of the p^2 pairs used as the full training batch
  d_model: int = 128
  num_heads: int = 4
  head_dim: int = 32  # r: each head's W_Q, W_K is a frame in St(d_model, head_dim)
  num_layers: int = 2
  ffn_mult: int = 4
  readout_hidden: int = 128
  learning_rate: float = 1e-3  # AdamW rate (also B2m's frame rate)
  weight_decay: float = 1.0  # decoupled decay on matrices (rank >= 2)
  b1: float = 0.9
  b2: float = 0.999
  warmup: int = 0  # linear warm-up steps of every rate (0: constant)
  frame_lr: float = 1.0  # eta_R of the Riemannian Adam (runs record it as riemannian_lr)
  tau: float = 0.1  # step cap ||eta||_F <= tau sqrt(r)
  riemannian_eps: float = 1e-3  # eps of the Riemannian Adam
  epochs: int = 20_000  # full-batch steps
  eval_every: int = 100
  memorize_threshold: float = 0.99
  grok_threshold: float = 0.95
  sustain_k: int = 3  # consecutive evaluations >= grok_threshold
  tail_fraction: float = 0.25  # tail mean over the final quarter of the run


#: The fields that runs record under an earlier name, part of their identities (so
#: fixed): the frame rate, ``frame_lr``, is recorded as ``riemannian_lr``.
RECORDED_NAMES = {"frame_lr": "riemannian_lr"}


def recorded(config: GrokConfig) -> dict:
  """Every field of ``config`` as runs record it, in order (:data:`RECORDED_NAMES`)."""
  return {RECORDED_NAMES.get(k, k): v for k, v in dataclasses.asdict(config).items()}


PAPER = GrokConfig()
STABILIZED: dict[str, Any] = dict(b2=0.98, warmup=10)  # Power et al. (2022)

QUICK = dataclasses.replace(
  PAPER, modulus=23, train_fraction=0.7, weight_decay=5.0, **STABILIZED, epochs=800, eval_every=50
)

PRESETS: dict[str, dict[str, Any]] = {
  "quick": dict(config=QUICK, arms=("A2", "B2"), seeds=(0,)),
  "paper": dict(config=PAPER, arms=("A2", "B2"), seeds=(0,)),
}


#: The arms of ``stiefax grok`` (the registry's entries that name it), in the order of
#: its help and its report: these first, then any other in registry order.
ARMS = arms.offered(
  "grok",
  (
    "A2",
    "B2",
    "B2m",
    "B2m-can",
    "B2-frz",
    "A2-nwf",
    "B2-hi",
    "B2-sn",
    "B2-comb",
    "B2-mmuon",
    "A2-muon",
    "B2-qr",
    "B2-cayley",
    "A2-qknorm",
    "A2-sigma",
    "B2-qknorm",
  ),
)
# Frame rates of the optimizer-family arms (grok has no rate selection).
MMUON_LR, MUON_LR = ARMS["B2-mmuon"].frame_lr, ARMS["A2-muon"].frame_lr


@dataclasses.dataclass(frozen=True)
class Study:
  """One of the paper's grokking studies: arms trained over seeds at one setting.

  ``stiefax report`` prints a table per study and ``studies/gpu.sh`` trains them, in
  the order of :data:`STUDIES` (the order of their value), each arm's seeds as one
  program (``--vmap-seeds``).
  """

  name: str  # how the report and the lease plan name it
  section: str  # where the paper reports it
  arms: tuple[str, ...]
  seeds: tuple[int, ...]
  stabilize: bool  # the Power et al. setting (--stabilize)


#: The studies that wait for an accelerator: the five-seed runs (a) and (b) of section
#: 4.3 (the paper: A2 5/5 against B2 4/5 at the default setting; A2 5/5 against B2 2/5,
#: t = -3.8 in A2's favour, stabilized) and the harnessing arms of section 4.4 (Table
#: 5, seed 0; its A2 and B2 rows are run (a)'s).
STUDIES = (
  Study("run (a)", "4.3, default setting", ("A2", "B2"), (0, 1, 2, 3, 4), False),
  Study("run (b)", "4.3, --stabilize", ("A2", "B2"), (0, 1, 2, 3, 4), True),
  Study("Table 5", "4.4, default setting", ("A2-nwf", "B2-hi", "B2-sn", "B2-comb"), (0,), False),
)


# ----------------------------------------------------------------------------
# Metrics on an evaluation history (epochs ascending).
# ----------------------------------------------------------------------------


def first_epoch(epochs: Sequence[int], values: Sequence[float], threshold: float) -> Optional[int]:
  """The first evaluated epoch with ``value >= threshold`` (``None`` if never).

  >>> first_epoch([0, 100, 200], [0.1, 0.99, 0.5], 0.99)
  100
  """
  for e, v in zip(epochs, values):
    if v >= threshold:
      return int(e)
  return None


def memorized_epoch(
  epochs: Sequence[int], train_acc: Sequence[float], threshold: float = 0.99
) -> Optional[int]:
  """First evaluated epoch with training accuracy ``>= threshold``."""
  return first_epoch(epochs, train_acc, threshold)


def grokked_epoch(
  epochs: Sequence[int], test_acc: Sequence[float], threshold: float = 0.95
) -> Optional[int]:
  """First evaluated epoch with held-out accuracy ``>= threshold`` (single crossing)."""
  return first_epoch(epochs, test_acc, threshold)


def sustained_epoch(
  epochs: Sequence[int], test_acc: Sequence[float], threshold: float = 0.95, k: int = 3
) -> Optional[int]:
  """First epoch from which held-out accuracy stays ``>= threshold`` for ``k`` evaluations.

  The paper's sustained metric (section 4.4): a single spike does not count.

  >>> sustained_epoch([0, 100, 200, 300, 400], [0.96, 0.1, 0.97, 0.98, 0.99], k=3)
  200
  """
  if k < 1:
    raise ValueError(f"sustained_epoch: k={k} must be >= 1.")
  run = 0
  for i, v in enumerate(test_acc):
    run = run + 1 if v >= threshold else 0
    if run == k:
      return int(epochs[i - k + 1])
  return None


def tail_mean(epochs: Sequence[int], values: Sequence[float], fraction: float = 0.25) -> float:
  """Mean of ``values`` over the evaluations in the final ``fraction`` of the run.

  Evaluations at epochs ``>= (1 - fraction) * last_epoch`` count: for 20 000 epochs,
  epochs 15 000-20 000 (the paper's tail window).

  >>> tail_mean([0, 100, 200, 300, 400], [0.0, 0.0, 0.0, 0.5, 1.0])
  0.75
  """
  at = np.asarray(epochs, np.float64)
  if at.size == 0:
    return float("nan")
  keep = at >= (1.0 - fraction) * at[-1]
  return float(np.mean(np.asarray(values, np.float64)[keep]))


def run_metrics(history: dict, config: GrokConfig) -> dict:
  """The per-run metrics of the paper from an evaluation history.

  With the attention probe in the history, also its last largest logit
  (``max_logit``), the largest over the run (``max_logit_max``) and the last mean
  attention entropy (``attn_entropy``).
  """
  ep, tr, te, iso = (history[k] for k in ("epoch", "train_acc", "test_acc", "isometry"))
  metrics = {
    "memorized_epoch": memorized_epoch(ep, tr, config.memorize_threshold),
    "grokked_epoch": grokked_epoch(ep, te, config.grok_threshold),
    "sustained_epoch": sustained_epoch(ep, te, config.grok_threshold, config.sustain_k),
    "end_train_acc": float(tr[-1]),
    "end_test_acc": float(te[-1]),
    "tail_test_acc": tail_mean(ep, te, config.tail_fraction),
    "initial_isometry": float(iso[0]),
    "final_isometry": float(iso[-1]),
    "max_isometry": float(np.max(iso)),
    "max_isometry_after_init": float(np.max(iso[1:])) if len(iso) > 1 else float(iso[0]),
  }
  if history.get("max_logit"):
    metrics["max_logit"] = float(history["max_logit"][-1])
    metrics["max_logit_max"] = float(np.max(history["max_logit"]))
    metrics["attn_entropy"] = float(history["attn_entropy"][-1])
  return metrics


def hyper(arm: Arm, config: GrokConfig) -> optim.Hyper:
  """The settings of the arm's optimizer (:func:`stiefax.experiments.optim.make_optimizer`).

  AdamW at ``learning_rate`` (with ``warmup`` linear warm-up steps); the frames of the
  Riemannian Adam arms at ``frame_lr`` (eps ``riemannian_eps``, cap ``tau``), of the
  other frame rules at the arm's ``frame_lr``, of B2m and A2-nwf at the AdamW rate,
  each following the AdamW warm-up (:func:`stiefax.experiments.optim.frame_rate`).
  """
  # Optax and the optimizer factory (JAX) are imported here, not by `stiefax grok --help`.
  import optax

  from stiefax.experiments import optim

  lr: optax.ScalarOrSchedule = config.learning_rate
  if config.warmup > 0 and config.learning_rate > 0:
    lr = optax.warmup_constant_schedule(0.0, config.learning_rate, config.warmup)
  if arm.frame_lr is None:
    frame_lr = config.learning_rate
  elif arm.frames == "riemannian_adam":
    frame_lr = config.frame_lr
  else:
    frame_lr = arm.frame_lr
  return optim.Hyper(
    adamw_lr=lr,
    frame_lr=frame_lr,
    peak_lr=config.learning_rate,
    weight_decay=config.weight_decay if arm.weight_decay is None else arm.weight_decay,
    b1=config.b1,
    b2=config.b2,
    eps=config.riemannian_eps,
    max_norm=config.tau,
  )
