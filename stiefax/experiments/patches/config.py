"""The arms ``stiefax patches`` offers, the setting of a run and the arm's rates."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING
from typing import Any
from typing import Optional
from typing import Sequence

from stiefax.experiments import arms
from stiefax.experiments.arms import Arm
from stiefax.experiments.flags import CommandError

if TYPE_CHECKING:
  import optax

  from stiefax.experiments import optim

EXPERIMENT = "patches"
PROTOCOLS = ("run", "sweep-n", "sweep-eps")

#: The sizes a run takes where the command line leaves them unset: ``digits`` without
#: ``--data`` (scikit-learn's 8x8 digits), ``paper`` with it (CIFAR-10 at the paper's
#: sizes); ``ns``: the data sizes of ``sweep-n``.
PRESETS: dict[str, dict[str, Any]] = {
  "digits": dict(n_train=1000, patch=4, d=16, heads=4, head_dim=4, ns=(125, 250, 500, 1000)),
  "paper": dict(
    n_train=10_000,
    patch=8,
    d=128,
    heads=8,
    head_dim=16,
    ns=(1000, 2000, 5000, 10_000, 20_000, 50_000),
  ),
}

#: The paper's eight arms, ``--arms all``.
PAPER_ARMS = ("A2", "A2-orth", "B2", "B2-SGD", "frozen", "elementwise", "grassmann", "soft")

#: The arms of ``stiefax patches`` (the registry's entries that name it): the paper's
#: eight, then the optimizer-family arms, then any other in registry order.
ARMS = arms.offered(
  "patches",
  (
    *PAPER_ARMS,
    "B2-mmuon",
    "A2-muon",
    "B2-qr",
    "B2-cayley",
    "A2-qknorm",
    "A2-sigma",
    "B2-qknorm",
  ),
)
ADAM_ARMS = ("B2", "elementwise", "grassmann")  # arms with a Riemannian eps
# The optimizer-family comparison (docs/optimizers.md); named explicitly, not in "all".
OPTIMIZER_ARMS = ("B2-mmuon", "A2-muon", "B2-qr", "B2-cayley")
# The practitioners' logit controls (QK-norm, sigmaReparam; docs/reproduction.md,
# "Against QK-norm and sigmaReparam"); named explicitly, not in "all".
LOGIT_ARMS = ("A2-qknorm", "A2-sigma", "B2-qknorm")


def arm_help() -> str:
  """The arms of ``--help``, from the registry: ``--arms all`` (the paper's eight), the
  optimizer-family and the logit-control arms, then any other the registry offers, each
  line the arm's description and its default frame rate ``frame_lr``."""
  named = (*PAPER_ARMS, *OPTIMIZER_ARMS, *LOGIT_ARMS)
  groups = (PAPER_ARMS, OPTIMIZER_ARMS, LOGIT_ARMS, [n for n in ARMS if n not in named])
  width = max(len(name) for name in ARMS) + 2

  def line(arm: Arm) -> str:
    rate = "" if arm.frame_lr is None else f"; frame_lr {arm.frame_lr:g}"
    return f"  {arm.name:<{width}}{arm.description}{rate}"

  return "\n\n".join("\n".join(line(ARMS[n]) for n in group) for group in groups if group)


def contrasts(listed: Sequence[tuple[str, str, str, str]]) -> Sequence:
  """The report's contrasts ``(name, b, a, what)``: ``listed`` (the paper's), then
  ``(arm, arm, base, description)`` for every arm with a ``base`` they lack (live)."""
  return arms.Contrasts(
    ARMS,
    listed,
    pair=lambda c: (c[1], c[2]),
    row=lambda b, a: (b, b, a, ARMS[b].description),
  )


def arm_by_name(name: str) -> Arm:
  """The arm ``name`` spells (any case, or an alias such as ``pa16``)."""
  arm = arms.lookup(name, ARMS)
  if arm is None:
    raise CommandError(f"--arms: unknown arm {name!r}; choose from {', '.join(ARMS)} (or all)")
  return arm


def frame_init(arm: Arm) -> str:
  """``"orthonormal"`` or ``"xavier"``: how the arm's runs record their frames' init."""
  return "orthonormal" if arm.orthonormal else "xavier"


@dataclasses.dataclass(frozen=True)
class Setting:
  """Everything one training run depends on besides the arm and the seed."""

  n_train: int
  epochs: int
  batch_size: int = 256
  warmup_epochs: int = 5
  depth: int = 1
  d: int = 128
  heads: int = 8
  head_dim: int = 16
  mlp_ratio: int = 4
  adamw_lr: float = 1e-2
  weight_decay: float = 0.05
  eps: float = 1e-8
  max_norm: float = 0.1
  penalty: float = 0.1
  polar: str = "auto"

  @property
  def steps_per_epoch(self) -> int:
    return math.ceil(self.n_train / self.batch_size)

  @property
  def total_steps(self) -> int:
    return self.steps_per_epoch * self.epochs

  @property
  def warmup_steps(self) -> int:
    return max(0, min(self.warmup_epochs * self.steps_per_epoch, self.total_steps - 1))


def arm_hparams(arm: Arm, setting: Setting, knob: Optional[float]) -> dict:
  """The arm's rates: ``{"adamw_lr", "frame_lr", "penalty", "eps"}`` (runs record
  ``frame_lr`` as ``riemannian_lr``, :func:`stiefax.experiments.patches.runs.run_config`).

  ``knob`` (``--lr`` / ``--select-lr``) is the AdamW rate of the arms without a frame
  rule of their own, lambda of ``soft``, else the frame rate ``frame_lr`` (``None``:
  the arm's default, ``Arm.frame_lr``).
  """
  hp: dict = {"adamw_lr": setting.adamw_lr, "frame_lr": None, "penalty": None, "eps": None}
  if arm.penalty:
    hp["penalty"] = setting.penalty if knob is None else knob
  elif not arm.apart:
    hp["adamw_lr"] = setting.adamw_lr if knob is None else knob
  else:
    hp["frame_lr"] = arm.frame_lr if knob is None else knob
  if arm.frames == "riemannian_adam":
    hp["eps"] = setting.eps
  return hp


def schedule(setting: Setting, peak: float) -> optax.Schedule:
  """5-epoch (``warmup_epochs``) linear warm-up to ``peak``, then cosine to zero."""
  import optax  # here, not by `stiefax patches --help`

  return optax.warmup_cosine_decay_schedule(
    0.0, peak, setting.warmup_steps, setting.total_steps, 0.0
  )


def hyper(setting: Setting, hp: dict) -> optim.Hyper:
  """The settings of the arm's optimizer (:func:`stiefax.experiments.optim.make_optimizer`):
  ``optax.adamw`` or ``stiefax.stiefel_adamw`` with the arm's frame rule, on schedules.

  ``hp``: the arm's rates (:func:`arm_hparams`). The frames run at ``frame_lr`` times
  the AdamW schedule over its peak, the rule of ``stiefax.stiefel_adamw``.
  """
  from stiefax.experiments import optim  # JAX: here, not by `stiefax patches --help`

  return optim.Hyper(
    adamw_lr=schedule(setting, hp["adamw_lr"]),
    frame_lr=hp["frame_lr"] or 0.0,
    peak_lr=hp["adamw_lr"],
    weight_decay=setting.weight_decay,
    eps=setting.eps if hp["eps"] is None else hp["eps"],
    max_norm=setting.max_norm,
    polar=setting.polar,
  )


def learning_rates(setting: Setting, hp: dict, step: int) -> tuple[float, float]:
  """``(AdamW rate, frame rate)`` at ``step`` (0.0 for a rate that is unset or zero); the
  frame rate is ``frame_lr`` times the AdamW schedule over its peak."""
  adamw = float(schedule(setting, hp["adamw_lr"])(step)) if hp["adamw_lr"] else 0.0
  frames = hp["frame_lr"] * adamw / hp["adamw_lr"] if hp["frame_lr"] and adamw else 0.0
  return adamw, frames
