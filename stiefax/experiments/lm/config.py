"""The settings of an ``stiefax lm`` run, its presets, arms and optimizer."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING
from typing import Optional

from stiefax.experiments import arms
from stiefax.experiments.arms import Arm

if TYPE_CHECKING:
  import optax

  from stiefax.experiments import optim
  from stiefax.experiments.lm.model import ModelConfig

__all__ = ["EXPERIMENT", "ADDED_BY_STUDY", "ARMS", "LMConfig", "PRESETS", "SWEEP_RATES", "hyper"]

EXPERIMENT = "lm"

#: The arms each later study of docs/lm.md added, in report order.
ADDED_BY_STUDY = {
  2: ("A2-temp", "B2-temp", "B2-fold", "B2-diag"),
  3: ("AdamH", "AdamH-qknorm", "Muon", "MuonH", "B2-H", "SphereAdam"),
}

#: The arms ``stiefax lm`` offers (the registry's entries that name it), in report order:
#: these first, then any other in registry order.
ARMS = arms.offered(
  "lm",
  ("A2", "A2-qknorm", "A2-sigma", "frozen", "B2", "B2-qr", "B2-qknorm")
  + ADDED_BY_STUDY[2]
  + ADDED_BY_STUDY[3],
)


@dataclasses.dataclass(frozen=True)
class LMConfig:
  """Everything a run depends on besides the arm and the seed.

  Attributes:
    d_model, depth, heads, kv_heads, head_dim, mlp_dim, seq: the decoder
      (:class:`stiefax.experiments.lm.model.ModelConfig`).
    batch: sequences per step.
    steps: training steps.
    warmup_steps: linear warm-up from 0, then cosine decay to 0 at ``steps``
      (``optax.warmup_cosine_decay_schedule``), for the AdamW and the frame rates alike.
    adamw_lr: AdamW's peak rate (every parameter but the frames of a Stiefel arm).
    frame_lr: the frames' peak rate (Stiefel arms): ``stiefel_learning_rate`` of
      ``stiefax.stiefel_adamw``, on the AdamW schedule.
    weight_decay: AdamW's decoupled decay, on tensors of rank >= 2.
    b1, b2: the moments' decays (AdamW and Riemannian Adam).
    eps: AdamW's and the Riemannian Adam's eps.
    max_norm: the Riemannian Adam's step cap tau.
    eval_every: steps between evaluations (validation loss and the attention probe).
    val_windows, test_windows: held-out windows of ``seq + 1`` bytes.
    probe_windows: validation windows the attention probe reads.
    matrix_lr: the peak rate of the arm's matrix rule (``Arm.matrices``: AdamH, MuonH,
      Muon, the sphere Adam), on the same schedule; recorded only by the arms that have
      one, so the other arms' runs keep their identities.
  """

  d_model: int = 64
  depth: int = 2
  heads: int = 4
  kv_heads: int = 2
  head_dim: int = 16
  mlp_dim: int = 256
  seq: int = 128
  batch: int = 16
  steps: int = 600
  warmup_steps: int = 60
  adamw_lr: float = 3e-3
  frame_lr: float = 1.0
  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  max_norm: float = 0.1
  eval_every: int = 100
  val_windows: int = 256
  test_windows: int = 512
  probe_windows: int = 8
  matrix_lr: float = 0.01

  @property
  def model(self) -> ModelConfig:
    # The model (Flax, JAX) is imported here, not by `stiefax lm --help`.
    from stiefax.experiments.lm.model import ModelConfig

    return ModelConfig(
      d_model=self.d_model,
      depth=self.depth,
      heads=self.heads,
      kv_heads=self.kv_heads,
      head_dim=self.head_dim,
      mlp_dim=self.mlp_dim,
      seq=self.seq,
    )

  def check(self) -> None:
    """Raises ValueError naming the first setting that cannot run."""
    for name in ("d_model", "depth", "heads", "kv_heads", "head_dim", "mlp_dim", "seq"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
    for name in ("batch", "steps", "eval_every", "val_windows", "test_windows"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
    if self.heads % self.kv_heads:
      raise ValueError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim}: RoPE needs an even head size")
    if self.head_dim > self.d_model:
      raise ValueError(f"head_dim={self.head_dim} > d_model={self.d_model}: no St(d, r) frame")
    if not 0 <= self.warmup_steps < self.steps:
      raise ValueError(f"warmup_steps={self.warmup_steps}: must be in [0, steps={self.steps})")
    if not 1 <= self.probe_windows <= self.val_windows:
      raise ValueError(f"probe_windows={self.probe_windows}: must be in [1, val_windows]")
    for name in ("adamw_lr", "frame_lr", "weight_decay", "max_norm", "matrix_lr"):
      v = getattr(self, name)
      if not (v >= 0 and v < float("inf")):
        raise ValueError(f"{name}={v}: must be finite and >= 0")
    for name in ("b1", "b2"):
      if not 0 <= getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}: must be in [0, 1)")


#: ``quick``: the default, a few minutes for the seven arms on this CPU. ``sweep``: the
#: studies of docs/lm.md (about 5 minutes a run on one core). ``large``: study 2's
#: larger model.
PRESETS = {
  "quick": LMConfig(),
  "sweep": LMConfig(
    d_model=128,
    depth=2,
    heads=8,
    kv_heads=4,
    head_dim=16,
    mlp_dim=512,
    seq=128,
    batch=16,
    steps=1000,
    warmup_steps=100,
    eval_every=100,
  ),
  # Study 2's larger model (docs/lm.md): head size 32, 4.3x the parameters of sweep
  # (2.23 M against 0.52 M) and 2x its training tokens.
  "large": LMConfig(
    d_model=256,
    depth=2,
    heads=8,
    kv_heads=4,
    head_dim=32,
    mlp_dim=1152,
    seq=128,
    batch=16,
    steps=2000,
    warmup_steps=200,
    eval_every=200,
  ),
}

#: The AdamW rates of the learning-rate sweep, x3 apart (docs/lm.md).
SWEEP_RATES = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)


def schedule(config: LMConfig, peak: float) -> optax.Schedule:
  """Linear warm-up to ``peak`` over ``warmup_steps``, then cosine to 0 at ``steps``."""
  import optax

  return optax.warmup_cosine_decay_schedule(0.0, peak, config.warmup_steps, config.steps, 0.0)


def frame_rate(arm: Arm, config: LMConfig) -> Optional[float]:
  """The peak rate of the arm's frame rule (None: the frames are AdamW parameters)."""
  if not arm.apart:
    return None
  return 0.0 if arm.frame_lr == 0.0 else config.frame_lr


def hyper(arm: Arm, config: LMConfig) -> optim.Hyper:
  """The settings of the arm's optimizer (:func:`stiefax.experiments.optim.make_optimizer`):
  ``optax.adamw`` or ``stiefax.stiefel_adamw`` with the arm's frame rule, on schedules:
  the frames at ``frame_lr`` times the AdamW schedule over its peak, the rule of
  ``stiefax.stiefel_adamw`` (:func:`stiefax.experiments.optim.frame_rate`).

  The frames are found by name in Gemma's layout (:func:`stiefax.layouts.qk_frames`).
  """
  import stiefax
  from stiefax.experiments import optim

  return optim.Hyper(
    adamw_lr=schedule(config, config.adamw_lr),
    frame_lr=frame_rate(arm, config) or 0.0,
    peak_lr=config.adamw_lr,
    weight_decay=config.weight_decay,
    b1=config.b1,
    b2=config.b2,
    eps=config.eps,
    max_norm=config.max_norm,
    adamw_eps=config.eps,
    frames=stiefax.layouts.qk_frames(),
    matrix_lr=schedule(config, config.matrix_lr) if arm.matrices != "adamw" else 0.0,
  )
