"""Image-patch benchmark (paper sections 3.3, 4.1, 4.2, 4.5-4.7).

``stiefax patches [run|sweep-n|sweep-eps] [options]``

Data: CIFAR-10 from the python-format archive or folder, or an image-folder copy
(``--data``; see :mod:`stiefax.experiments.patch_data`), or, with no ``--data``,
scikit-learn's ``digits`` (real 8x8 images shipped with the package: 4x4 patches, 4
tokens of raw dimension 16 whitened to d=16, 4 heads of r=4). Tokens are contrast-
normalized, PCA-whitened patches, cached on disk (``--cache``).

Model (the paper leaves depth, positions and pooling open; chosen here): the
whitened tokens are the embeddings (no extra input projection: the whitening *is*
the embedding), plus a learned positional embedding ``(P, d)`` (normal, std 0.02);
``--depth`` (default 1) pre-LN blocks ``x += MHA(LN(x)); x += MLP(LN(x))`` (Flax
``MultiHeadDotProductAttention`` with H heads of width r, so W_Q, W_K are
``(d, H, r)`` kernels = H frames in St(d, r); MLP d -> 4d -> d with GELU); final
LayerNorm, mean pooling over tokens, classifier ``W_cls``. Xavier-uniform kernels.

Training: batch 256 (the last partial batch of an epoch is kept), AdamW on every
non-frame parameter (rate ``--adamw-lr``, decay 0.05 on rank >= 2 tensors only, not
LayerNorm), 5-epoch linear warm-up then cosine to zero
(``optax.warmup_cosine_decay_schedule``), applied to the Riemannian rate too; plain
cross-entropy; test accuracy at the final epoch. The batch order and the initial
non-frame parameters depend on the seed only (shared across arms); the orthonormal
frames are drawn from the seed too (identical across the arms that use them).

Arms (``--arms``, or ``all`` for the paper's eight above the blank line):

  A2           AdamW + Xavier on everything (rate --adamw-lr, paper's 1e-2)
  A2-orth      AdamW, W_Q and W_K initialized orthonormal
  B2           riemannian_adam(1.0, eps=1e-8, max_norm=0.1) on W_Q, W_K
  B2-SGD       riemannian_sgd(0.02), Grassmann projector (alias PA16)
  frozen       the Riemannian arm at rate 0 (frames stay at their init)
  elementwise  riemannian_adam(0.03, moment="elementwise")
  grassmann    riemannian_adam(1.0, projector="grassmann")
  soft         AdamW + lambda * orthogonality_penalty (lambda = --penalty, 0.1)

  B2-mmuon     manifold_muon(0.05) on W_Q, W_K (spectral-norm steepest descent on St)
  A2-muon      optax.contrib.muon(0.02) on W_Q, W_K (Xavier init, unconstrained)
  B2-qr        B2 with the sign-fixed QR retraction
  B2-cayley    B2 with the Cayley retraction

Protocols: ``run`` (default; ``--seeds`` paired, ``--select-lr`` first picks each
arm's rate on the validation images [n_train : n_train + n_val]), ``sweep-n``
(``--ns`` at about ``--budget`` 2000 steps per run, paper Table 3), ``sweep-eps``
(``--eps-values`` for B2, Section 4.7). One JSON file per run goes to ``--out``;
``stiefax report DIR`` (or the table printed at the end) gives per-arm mean +- std,
the paired difference to A2 (t, p, wins, 20 000-resample bootstrap 95% CI),
isometry error and wall-clock per epoch.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import pathlib
import shlex
import time
import types
from typing import Any
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import patch_data
from stiefax.experiments import store
from stiefax.experiments.cli import CommandError
from stiefax.experiments.cli import writable_dir

EXPERIMENT = "patches"
PROTOCOLS = ("run", "sweep-n", "sweep-eps")


# --------------------------------------------------------------------------------- arms


@dataclasses.dataclass(frozen=True)
class Arm:
  """One row of the paper's Tables 6-7.

  ``knob`` is the hyperparameter ``--lr`` / ``--select-lr`` act on: the AdamW rate of
  the AdamW arms, the Riemannian rate of the frame arms, lambda of ``soft``.
  """

  name: str
  family: str  # "adamw" (every parameter on AdamW) or "riemannian" (frames apart)
  init: str  # frame init: "xavier" or "orthonormal"
  default: Optional[float]  # default knob (None: --adamw-lr / --penalty)
  grid: tuple[float, ...]  # --select-lr grid
  description: str
  rule: dict = dataclasses.field(default_factory=dict)  # riemannian_adam / sgd kwargs
  sgd: bool = False
  penalty: bool = False
  muon: str = ""  # "manifold" (stiefax.manifold_muon) or "euclidean" (optax.contrib.muon)


ARMS = {
  a.name: a
  for a in (
    Arm("A2", "adamw", "xavier", None, (1e-3, 3e-3, 1e-2, 3e-2), "AdamW + Xavier"),
    Arm(
      "A2-orth",
      "adamw",
      "orthonormal",
      None,
      (1e-3, 3e-3, 1e-2, 3e-2),
      "AdamW, orthonormal W_Q, W_K init",
    ),
    Arm(
      "B2",
      "riemannian",
      "orthonormal",
      1.0,
      (0.3, 1.0, 3.0),
      "Riemannian Adam (Stiefel projector, scalar v)",
    ),
    Arm(
      "B2-SGD",
      "riemannian",
      "orthonormal",
      0.02,
      (0.005, 0.02, 0.05),
      "Riemannian SGD, Grassmann projector (PA16)",
      {"projector": "grassmann"},
      sgd=True,
    ),
    Arm("frozen", "riemannian", "orthonormal", 0.0, (0.0,), "Riemannian arm at rate 0"),
    Arm(
      "elementwise",
      "riemannian",
      "orthonormal",
      0.03,
      (0.01, 0.03, 0.1),
      "Riemannian Adam, elementwise v",
      {"moment": "elementwise"},
    ),
    Arm(
      "grassmann",
      "riemannian",
      "orthonormal",
      1.0,
      (0.3, 1.0, 3.0),
      "Riemannian Adam, Grassmann projector",
      {"projector": "grassmann"},
    ),
    Arm(
      "soft",
      "adamw",
      "xavier",
      None,
      (0.01, 0.1, 1.0),
      "AdamW + lambda ||W^T W - I||_F^2",
      penalty=True,
    ),
    Arm(
      "B2-mmuon",
      "riemannian",
      "orthonormal",
      0.05,
      (0.02, 0.05, 0.1),
      "manifold Muon (spectral-norm steepest descent on St)",
      muon="manifold",
    ),
    Arm(
      "A2-muon",
      "riemannian",
      "xavier",
      0.02,
      (0.005, 0.02, 0.05),
      "optax.contrib.muon on W_Q, W_K, unconstrained",
      muon="euclidean",
    ),
    Arm(
      "B2-qr",
      "riemannian",
      "orthonormal",
      1.0,
      (0.3, 1.0, 3.0),
      "Riemannian Adam, QR retraction",
      {"retraction": "qr"},
    ),
    Arm(
      "B2-cayley",
      "riemannian",
      "orthonormal",
      1.0,
      (0.3, 1.0, 3.0),
      "Riemannian Adam, Cayley retraction",
      {"retraction": "cayley"},
    ),
  )
}
ALIASES = {
  "pa16": "B2-SGD",
  "b2sgd": "B2-SGD",
  "a2orth": "A2-orth",
  "soft-penalty": "soft",
  "penalty": "soft",
  "grassmann-adam": "grassmann",
  "elem": "elementwise",
}
ADAM_ARMS = ("B2", "elementwise", "grassmann")  # arms with a Riemannian eps
# The optimizer-family comparison (docs/optimizers.md); named explicitly, not in "all".
OPTIMIZER_ARMS = ("B2-mmuon", "A2-muon", "B2-qr", "B2-cayley")


def arm_by_name(name: str) -> Arm:
  key = name.strip()
  for k in ARMS:
    if k.lower() == key.lower():
      return ARMS[k]
  alias = ALIASES.get(key.lower().replace("_", "-")) or ALIASES.get(
    key.lower().replace("-", "").replace("_", "")
  )
  if alias:
    return ARMS[alias]
  raise CommandError(f"--arms: unknown arm {name!r}; choose from {', '.join(ARMS)} (or all)")


# ---------------------------------------------------------------------------- settings


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
  """The arm's rates: ``{"adamw_lr", "riemannian_lr", "penalty", "eps"}``."""
  hp = {"adamw_lr": setting.adamw_lr, "riemannian_lr": None, "penalty": None, "eps": None}
  if arm.penalty:
    hp["penalty"] = setting.penalty if knob is None else knob
  elif arm.family == "adamw":
    hp["adamw_lr"] = setting.adamw_lr if knob is None else knob
  else:
    hp["riemannian_lr"] = arm.default if knob is None else knob
  if arm.family == "riemannian" and not arm.sgd and not arm.muon:
    hp["eps"] = setting.eps
  return hp


# ------------------------------------------------------------------------------- model


def make_model(setting: Setting, tokens: int, num_classes: int):
  """The pre-LN encoder of the module docstring, as a Flax linen module."""
  return _model(
    setting.depth,
    setting.d,
    setting.heads,
    setting.head_dim,
    setting.mlp_ratio,
    tokens,
    num_classes,
  )[0]


@functools.lru_cache(maxsize=16)
def _model(depth, d, heads, head_dim, mlp_ratio, tokens, num_classes):
  """``(module, jitted init, jitted predict)``, shared by the arms of one shape."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  s = types.SimpleNamespace(depth=depth, d=d, heads=heads, head_dim=head_dim, mlp_ratio=mlp_ratio)
  xavier = nn.initializers.xavier_uniform()

  class PatchEncoder(nn.Module):
    """Pre-LN transformer encoder over whitened patch tokens ``(B, P, d)``."""

    @nn.compact
    def __call__(self, x):
      pos = self.param("pos_embedding", nn.initializers.normal(0.02), (tokens, s.d))
      h = x + pos[None]
      for i in range(s.depth):
        y = nn.LayerNorm(name=f"ln_attn_{i}")(h)
        y = nn.MultiHeadDotProductAttention(
          num_heads=s.heads,
          qkv_features=s.heads * s.head_dim,
          out_features=s.d,
          kernel_init=xavier,
          deterministic=True,
          name=f"attn_{i}",
        )(y)
        h = h + y
        y = nn.LayerNorm(name=f"ln_mlp_{i}")(h)
        y = nn.Dense(s.mlp_ratio * s.d, kernel_init=xavier, name=f"mlp_in_{i}")(y)
        y = nn.Dense(s.d, kernel_init=xavier, name=f"mlp_out_{i}")(nn.gelu(y))
        h = h + y
      h = nn.LayerNorm(name="ln_final")(h)
      return nn.Dense(num_classes, kernel_init=xavier, name="classifier")(jnp.mean(h, axis=1))

  model = PatchEncoder()
  predict = jax.jit(lambda params, x: jnp.argmax(model.apply(params, x), axis=-1))
  return model, jax.jit(model.init), predict


@functools.lru_cache(maxsize=1)
def _isometry_fn():
  import jax  # pylint: disable=g-import-not-at-top

  import stiefax  # pylint: disable=g-import-not-at-top

  return jax.jit(lambda p: stiefax.diagnostics.isometry_error(p, stiefax.flax.qk_labels))


def make_optimizer(arm: Arm, setting: Setting, hp: dict):
  """AdamW (A2-family) or ``stiefax.stiefel_adamw`` with the arm's frame rule."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  import stiefax  # pylint: disable=g-import-not-at-top

  def schedule(peak):
    return optax.warmup_cosine_decay_schedule(
      0.0, peak, setting.warmup_steps, setting.total_steps, 0.0
    )

  adamw_rate = schedule(hp["adamw_lr"])
  if arm.family == "adamw":
    return optax.adamw(
      adamw_rate,
      weight_decay=setting.weight_decay,
      mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p),
    )
  rate = hp["riemannian_lr"]
  rate = schedule(rate) if rate else 0.0
  if arm.muon == "manifold":
    rule = stiefax.manifold_muon(rate, **arm.rule)
  elif arm.muon == "euclidean":
    # W_Q, W_K are (d, heads, r) kernels: reduce over d, one matrix per head.
    dims = optax.contrib.MuonDimensionNumbers(reduction_axis=0, output_axis=2)
    rule = optax.contrib.muon(
      rate,
      weight_decay=setting.weight_decay,
      muon_weight_dimension_numbers=lambda p: jax.tree.map(lambda _: dims, p),
    )
  elif arm.sgd:
    rule = stiefax.riemannian_sgd(rate, polar=setting.polar, **arm.rule)
  else:
    rule = stiefax.riemannian_adam(
      rate, eps=hp["eps"], max_norm=setting.max_norm, polar=setting.polar, **arm.rule
    )
  return stiefax.stiefel_adamw(adamw_rate, weight_decay=setting.weight_decay, stiefel=rule)


def _frame_paths(params) -> list:
  import jax  # pylint: disable=g-import-not-at-top

  import stiefax  # pylint: disable=g-import-not-at-top

  labels = jax.tree.leaves(stiefax.flax.qk_labels(params))
  return [i for i, lab in enumerate(labels) if lab == "stiefel"]


def init_params(model, arm: Arm, seed: int, tokens: int, d: int, model_init=None):
  """Seeded init: non-frame parameters depend on the seed only; frames per ``arm.init``.

  ``model_init`` is ``model.init`` or a jitted copy of it.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  import stiefax  # pylint: disable=g-import-not-at-top

  key = jax.random.key(seed)
  k_init, k_frames = jax.random.split(key)
  params = (model_init or model.init)(k_init, jnp.zeros((1, tokens, d), jnp.float32))
  if arm.init == "orthonormal":
    leaves, treedef = jax.tree.flatten(params)
    init = stiefax.flax.orthonormal_init()
    for j, i in enumerate(_frame_paths(params)):
      leaves[i] = init(jax.random.fold_in(k_frames, j), leaves[i].shape, leaves[i].dtype)
    params = jax.tree.unflatten(treedef, leaves)
  return params


class Trainer:
  """The jitted epoch (a ``lax.scan`` over its batches) and evaluation of one arm.

  Built once per (arm, setting, rates) and reused across seeds, so each arm compiles
  once.
  """

  def __init__(self, arm: Arm, setting: Setting, hp: dict, tokens: int, num_classes: int):
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import optax  # pylint: disable=g-import-not-at-top

    import stiefax  # pylint: disable=g-import-not-at-top
    from stiefax import geometry  # pylint: disable=g-import-not-at-top

    self.arm, self.setting, self.hp = arm, setting, hp
    self.tokens, self.num_classes = tokens, num_classes
    self.model = model = make_model(setting, tokens, num_classes)
    self.tx = tx = make_optimizer(arm, setting, hp)
    lam = hp["penalty"]
    spec = stiefax.FrameSpec()
    frame_ids: list = []

    def loss_fn(params, x, y, w):
      logits = model.apply(params, x)
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
      loss = jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)
      total = loss
      if lam is not None:
        total = total + lam * stiefax.flax.orthogonality_penalty(params, stiefax.flax.qk_labels)
      correct = jnp.sum((jnp.argmax(logits, -1) == y) * w)
      return total, (loss, correct)

    def frame_norm(frames):  # mean over frames of ||X||_F
      return jnp.mean(jnp.sqrt(geometry.frame_sq_norm(frames)))

    def epoch(params, opt_state, xs, ys, idx, w):
      def step(carry, batch):
        params, opt_state = carry
        b_idx, b_w = batch
        (_, (loss, correct)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          params, xs[b_idx], ys[b_idx], b_w
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        p_l, g_l, n_l = (jax.tree.leaves(t) for t in (params, grads, new_params))
        stats = [jnp.zeros([], jnp.float32)] * 3
        if frame_ids:
          k = float(len(frame_ids))
          w_f = [spec.to_frames(p_l[i]) for i in frame_ids]
          g_f = [spec.to_frames(g_l[i]) for i in frame_ids]
          stats = [
            sum(frame_norm(g) for g in g_f) / k,
            sum(frame_norm(geometry.stiefel_project(w, g)) for w, g in zip(w_f, g_f)) / k,
            sum(frame_norm(spec.to_frames(n_l[i] - p_l[i])) for i in frame_ids) / k,
          ]
        return (new_params, opt_state), (loss * jnp.sum(b_w), correct, jnp.sum(b_w), *stats)

      (params, opt_state), out = jax.lax.scan(step, (params, opt_state), (idx, w))
      return params, opt_state, out

    self._frame_ids = frame_ids
    self._tx_init = jax.jit(tx.init)
    self._epoch = jax.jit(epoch, donate_argnums=(0, 1))
    _, self._model_init, self._predict = _model(
      setting.depth,
      setting.d,
      setting.heads,
      setting.head_dim,
      setting.mlp_ratio,
      tokens,
      num_classes,
    )
    self._iso = _isometry_fn()

  def init(self, seed: int):
    params = init_params(self.model, self.arm, seed, self.tokens, self.setting.d, self._model_init)
    if not self._frame_ids:
      self._frame_ids.extend(_frame_paths(params))
    return params, self._tx_init(params)

  def accuracy(self, params, x: np.ndarray, y: np.ndarray, chunk: int = 1000) -> float:
    """Accuracy over ``(x, y)`` in fixed-size chunks (the last one padded)."""
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

    if len(y) == 0:
      return float("nan")
    chunk = min(chunk, len(y))
    correct = 0
    for s in range(0, len(y), chunk):
      xb = x[s : s + chunk]
      n = xb.shape[0]
      if n < chunk:
        xb = np.concatenate([xb, np.zeros((chunk - n,) + xb.shape[1:], xb.dtype)])
      pred = np.asarray(self._predict(params, jnp.asarray(xb)))[:n]
      correct += int(np.sum(pred == y[s : s + n]))
    return correct / len(y)

  def batches(self, rng: np.random.Generator, n: int):
    """One epoch's batch indices ``(S, B)`` and weights (0 pads the last batch)."""
    s, b = self.setting.steps_per_epoch, self.setting.batch_size
    perm = rng.permutation(n)
    idx = np.zeros(s * b, np.int32)
    w = np.zeros(s * b, np.float32)
    idx[:n], w[:n] = perm, 1.0
    return idx.reshape(s, b), w.reshape(s, b)


def train(
  trainer: Trainer,
  data: patch_data.PatchData,
  seed: int,
  *,
  eval_split: str = "test",
  eval_every: int = 0,
  progress: bool = True,
  desc: str = "",
) -> dict:
  """Trains one (arm, seed) and returns ``{"metrics", "history", "wall_time"}``."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top

  s = trainer.setting
  t_start = time.perf_counter()
  xs, ys = jnp.asarray(data.train_x), jnp.asarray(data.train_y)
  ex, ey = (data.test_x, data.test_y) if eval_split == "test" else (data.val_x, data.val_y)
  params, opt_state = trainer.init(seed)
  rng = np.random.default_rng([seed, 1])  # batch order: the seed's, shared across arms
  keys = (
    "train_loss",
    "train_acc",
    "isometry",
    "frame_grad_norm",
    "frame_tangent_norm",
    "frame_step_norm",
    "epoch_time",
    "lr_adamw",
    "lr_riemannian",
  )
  hist = {k: [] for k in keys}
  hist[f"{eval_split}_acc"] = []
  hist[f"{eval_split}_acc_epoch"] = []
  lr_sched = _schedules(trainer)
  diverged = False
  bar = tqdm(range(s.epochs), desc=desc, disable=not progress, leave=False, unit="ep")
  for ep in bar:
    idx, w = trainer.batches(rng, data.train_x.shape[0])
    t0 = time.perf_counter()
    params, opt_state, out = trainer._epoch(
      params, opt_state, xs, ys, jnp.asarray(idx), jnp.asarray(w)
    )
    out = [np.asarray(o, np.float64) for o in jax.block_until_ready(out)]
    hist["epoch_time"].append(time.perf_counter() - t0)
    loss_sum, correct, count, g, tg, st = out
    hist["train_loss"].append(float(loss_sum.sum() / count.sum()))
    hist["train_acc"].append(float(correct.sum() / count.sum()))
    hist["frame_grad_norm"].append(float(g.mean()))
    hist["frame_tangent_norm"].append(float(tg.mean()))
    hist["frame_step_norm"].append(float(st.mean()))
    hist["isometry"].append(float(trainer._iso(params)))
    end_step = (ep + 1) * s.steps_per_epoch - 1
    hist["lr_adamw"].append(lr_sched[0](end_step))
    hist["lr_riemannian"].append(lr_sched[1](end_step))
    if not math.isfinite(hist["train_loss"][-1]):
      diverged = True
      break
    if eval_every and (ep + 1) % eval_every == 0 and ep + 1 < s.epochs:
      hist[f"{eval_split}_acc"].append(trainer.accuracy(params, ex, ey))
      hist[f"{eval_split}_acc_epoch"].append(ep + 1)
    bar.set_postfix(
      loss=f"{hist['train_loss'][-1]:.3f}",
      acc=f"{hist['train_acc'][-1]:.3f}",
      iso=f"{hist['isometry'][-1]:.1e}",
    )
  bar.close()
  final_acc = trainer.accuracy(params, ex, ey)
  hist[f"{eval_split}_acc"].append(final_acc)
  hist[f"{eval_split}_acc_epoch"].append(len(hist["train_loss"]))
  times = hist["epoch_time"]
  steady = times[1:] if len(times) > 1 else times
  late = max(1, len(hist["frame_step_norm"]) // 4)
  tang = float(np.mean(hist["frame_tangent_norm"][-late:]))
  metrics = {
    f"{eval_split}_acc": final_acc,
    "isometry": hist["isometry"][-1],
    "isometry_max": float(np.max(hist["isometry"])),
    "wall_per_epoch": float(np.median(steady)),
    "compile_time": float(max(0.0, times[0] - np.median(steady))) if len(times) > 1 else None,
    "train_loss": hist["train_loss"][-1],
    "train_acc": hist["train_acc"][-1],
    "late_step_per_grad": float(np.mean(hist["frame_step_norm"][-late:])) / tang
    if tang > 0
    else None,
    "diverged": diverged,
  }
  if eval_split != "test":
    metrics["test_acc"] = None
  return {"metrics": metrics, "history": hist, "wall_time": time.perf_counter() - t_start}


def _schedules(trainer: Trainer):
  import optax  # pylint: disable=g-import-not-at-top

  s, hp = trainer.setting, trainer.hp

  def make(peak):
    if not peak:
      return lambda step: 0.0
    f = optax.warmup_cosine_decay_schedule(0.0, peak, s.warmup_steps, s.total_steps, 0.0)
    return lambda step: float(f(step))

  return make(hp["adamw_lr"]), make(hp["riemannian_lr"])


# --------------------------------------------------------------------------- arguments


def _floats(text: str, flag: str) -> list[float]:
  try:
    return [float(t) for t in text.split(",") if t.strip()]
  except ValueError:
    raise CommandError(f"{flag}: expected comma-separated numbers, got {text!r}") from None


def _ints(text: str, flag: str) -> list[int]:
  out = []
  try:
    for t in text.split(","):
      t = t.strip()
      if not t:
        continue
      if "-" in t[1:]:
        lo, hi = t.split("-", 1)
        out.extend(range(int(lo), int(hi) + 1))
      else:
        out.append(int(float(t)) if "e" in t.lower() else int(t))
  except ValueError:
    raise CommandError(
      f"{flag}: expected comma-separated integers or ranges like 0-11, got {text!r}"
    ) from None
  if not out:
    raise CommandError(f"{flag}: empty list")
  if len(set(out)) != len(out):
    raise CommandError(f"{flag}: repeated values in {text!r}")
  return out


def _arm_map(text: Optional[str], flag: str, sep: str = ",") -> dict:
  """``"B2=1.0,A2=0.01"`` -> ``{"B2": "1.0", ...}`` with arm names resolved."""
  out = {}
  if not text:
    return out
  for item in text.split(sep):
    if not item.strip():
      continue
    if "=" not in item:
      raise CommandError(f"{flag}: expected ARM=VALUE items, got {item!r}")
    name, value = item.split("=", 1)
    out[arm_by_name(name).name] = value.strip()
  return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.description = __doc__.split("\n\n", 1)[0]
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  parser.epilog = __doc__.split("\n\n", 1)[1]
  add = parser.add_argument
  add(
    "protocol",
    nargs="?",
    default="run",
    choices=PROTOCOLS,
    help="run (default): paired seeds; sweep-n: data-size sweep; sweep-eps: eps probe",
  )
  g = parser.add_argument_group("data")
  g.add_argument(
    "--data",
    default=None,
    help="cifar-10-python.tar.gz, cifar-10-batches-py/, an image-folder copy"
    " (folder or .tar.gz), or 'random' (timing); default: sklearn digits",
  )
  g.add_argument(
    "--cache", default=None, help="cache folder (default $STIEFAX_CACHE or ~/.cache/stiefax)"
  )
  g.add_argument("--no-cache", action="store_true", help="do not read or write the cache")
  g.add_argument(
    "--n-train", type=int, default=None, help="first n training images (default 10000; digits 1000)"
  )
  g.add_argument(
    "--n-val",
    type=int,
    default=None,
    help="validation images after the training set, for --select-lr"
    " (default min(5000, rest of the pool))",
  )
  g.add_argument("--patch", type=int, default=None, help="patch side (default 8; digits 4)")
  g.add_argument(
    "--d", type=int, default=None, help="whitened dimension = model width (default 128; digits 16)"
  )
  g.add_argument("--whiten-eps", type=float, default=0.1, help="whitening eps (default 0.1)")
  g.add_argument(
    "--pca-samples", type=int, default=100_000, help="patches in the whitening fit (default 100000)"
  )
  g.add_argument(
    "--order-seed",
    type=int,
    default=0,
    help="seed of the class-interleaved order of image-folder copies",
  )
  g = parser.add_argument_group("model")
  g.add_argument("--depth", type=int, default=1, help="encoder blocks (default 1)")
  g.add_argument("--heads", type=int, default=None, help="H (default 8; digits 4)")
  g.add_argument("--head-dim", type=int, default=None, help="r (default 16; digits 4)")
  g.add_argument("--mlp-ratio", type=int, default=4, help="MLP width / d (default 4)")
  g = parser.add_argument_group("training")
  g.add_argument("--arms", default="A2,B2", help="comma-separated arms, or all (default A2,B2)")
  g.add_argument("--seeds", default="0,1,2", help="seeds, e.g. 0,1,2 or 0-11 (default 0,1,2)")
  g.add_argument(
    "--epochs", type=int, default=None, help="epochs (default 40; 100 when n-train >= 50000)"
  )
  g.add_argument("--batch-size", type=int, default=256)
  g.add_argument("--warmup-epochs", type=int, default=5)
  g.add_argument(
    "--adamw-lr",
    type=float,
    default=1e-2,
    help="AdamW rate of the non-frame parameters (default 1e-2, the paper's"
    " validation-selected A2 rate)",
  )
  g.add_argument("--weight-decay", type=float, default=0.05)
  g.add_argument(
    "--lr",
    default=None,
    help="per-arm rate overrides, e.g. B2=1.0,A2=0.003 (the Riemannian rate"
    " of frame arms; the AdamW rate of A2, A2-orth; lambda of soft)",
  )
  g.add_argument("--eps", type=float, default=1e-8, help="Riemannian Adam eps (default 1e-8)")
  g.add_argument("--max-norm", type=float, default=0.1, help="step cap tau (default 0.1)")
  g.add_argument("--penalty", type=float, default=0.1, help="soft-penalty lambda (default 0.1)")
  g.add_argument("--polar", default="auto", help="polar retraction method (default auto)")
  g = parser.add_argument_group("protocols")
  g.add_argument(
    "--select-lr", action="store_true", help="pick each arm's rate on the validation images first"
  )
  g.add_argument("--grid", default=None, help="--select-lr grids, e.g. B2=0.3:1:3,A2=0.001:0.01")
  g.add_argument("--select-seeds", default="0", help="seeds of the selection (default 0)")
  g.add_argument(
    "--ns",
    default=None,
    help="sweep-n sizes (default 1000,2000,5000,10000,20000,50000; digits 125,250,500,1000)",
  )
  g.add_argument("--budget", type=int, default=2000, help="sweep-n steps per run (default 2000)")
  g.add_argument(
    "--eps-values",
    default="1e-8,1e-6,1e-4,1e-2,1e-1",
    help="sweep-eps values (default 1e-8,1e-6,1e-4,1e-2,1e-1)",
  )
  g = parser.add_argument_group("output")
  g.add_argument("--out", default="runs/patches", help="results folder (default runs/patches)")
  g.add_argument(
    "--eval-every",
    type=int,
    default=0,
    help="also record accuracy every k epochs (default: final epoch only)",
  )
  g.add_argument(
    "--force",
    action="store_true",
    help="rerun runs whose JSON already exists with the same configuration",
  )
  g.add_argument("--no-progress", action="store_true", help="no progress bars")


# -------------------------------------------------------------------------- protocols


@dataclasses.dataclass
class Context:
  args: argparse.Namespace
  images: patch_data.Images
  out: pathlib.Path
  cache: Optional[pathlib.Path]
  progress: bool
  defaults: dict


def _positive(value, flag, allow_zero=False):
  if value is None:
    return
  if value < 0 or (value == 0 and not allow_zero):
    raise CommandError(f"{flag} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _validate(args) -> None:
  for flag in (
    "n_train",
    "patch",
    "d",
    "depth",
    "heads",
    "head_dim",
    "mlp_ratio",
    "epochs",
    "batch_size",
    "budget",
    "pca_samples",
  ):
    _positive(getattr(args, flag), "--" + flag.replace("_", "-"))
  for flag in (
    "n_val",
    "warmup_epochs",
    "adamw_lr",
    "weight_decay",
    "eps",
    "penalty",
    "eval_every",
  ):
    _positive(getattr(args, flag), "--" + flag.replace("_", "-"), allow_zero=True)
  _positive(args.max_norm, "--max-norm")
  _positive(args.whiten_eps, "--whiten-eps")  # Lambda + eps must be invertible
  import stiefax  # pylint: disable=g-import-not-at-top

  if args.polar not in stiefax.POLAR_METHODS:
    raise CommandError(f"--polar {args.polar!r}: choose from {', '.join(stiefax.POLAR_METHODS)}")


def _setting(ctx: Context, n_train: int, epochs: int, eps: Optional[float] = None) -> Setting:
  a, dflt = ctx.args, ctx.defaults
  s = Setting(
    n_train=n_train,
    epochs=epochs,
    batch_size=a.batch_size,
    warmup_epochs=a.warmup_epochs,
    depth=a.depth,
    d=dflt["d"],
    heads=dflt["heads"],
    head_dim=dflt["head_dim"],
    mlp_ratio=a.mlp_ratio,
    adamw_lr=a.adamw_lr,
    weight_decay=a.weight_decay,
    eps=a.eps if eps is None else eps,
    max_norm=a.max_norm,
    penalty=a.penalty,
    polar=a.polar,
  )
  if s.heads * s.head_dim > s.d:
    raise CommandError(
      f"--heads {s.heads} x --head-dim {s.head_dim} = {s.heads * s.head_dim} exceeds"
      f" --d {s.d}: each head's W_Q, W_K frame lies in St(d, r) and the paper's heads"
      f" need H*r <= d; lower --heads or --head-dim"
    )
  return s


def _data(ctx: Context, n_train: int, n_val: int) -> patch_data.PatchData:
  a, dflt = ctx.args, ctx.defaults
  data = patch_data.prepare(
    ctx.images,
    n_train=n_train,
    n_val=n_val,
    patch=dflt["patch"],
    d=dflt["d"],
    whiten_eps=a.whiten_eps,
    pca_samples=a.pca_samples,
    cache_dir=ctx.cache,
    order_seed=a.order_seed,
  )
  return data


def _run_config(
  ctx: Context,
  protocol: str,
  arm: Arm,
  setting: Setting,
  hp: dict,
  data: patch_data.PatchData,
  eval_split: str,
) -> dict:
  cfg = {
    "protocol": protocol,
    "dataset": ctx.images.name,
    "data": ctx.args.data,
    "classes": len(ctx.images.classes),
    "n_test": len(data.test_y),
    "n_val": len(data.val_y),
    "tokens": int(data.train_x.shape[1]),
    "patch": ctx.defaults["patch"],
    "whiten_eps": ctx.args.whiten_eps,
    "pca_samples": ctx.args.pca_samples,
    "pca_fit_patches": data.whitening.n_fit,
    "order_seed": ctx.args.order_seed,
    "eval_split": eval_split,
    "steps_per_epoch": setting.steps_per_epoch,
    "total_steps": setting.total_steps,
    "warmup_steps": setting.warmup_steps,
    "frame_init": arm.init,
    "description": arm.description,
  }
  cfg.update(dataclasses.asdict(setting))
  cfg.update(hp)
  if hp["eps"] is None:
    cfg["eps"] = None
  if not arm.penalty:
    cfg["penalty"] = None
  return cfg


def run_identity(cfg: dict) -> dict:
  """The part of a run's configuration that decides its result.

  Everything but where the data was read from (``"data"``, a path that differs between
  machines; the data set itself is named by ``"dataset"``).
  """
  return {k: v for k, v in json.loads(json.dumps(cfg)).items() if k != "data"}


def config_hash(cfg: dict) -> str:
  """8 hex digits of the SHA-256 of :func:`run_identity`, canonical JSON."""
  return store.digest(run_identity(cfg))


def _run_name(protocol: str, arm: str, cfg: dict, seed: int) -> str:
  """``<protocol>-<arm>-n<n>[-eps<eps>|-k<knob>]-<config hash>-s<seed>.json``.

  The hash makes the name a function of the whole configuration, so runs that differ
  in any setting (depth, rates, budget, ...) never share a file.
  """
  name = f"{protocol}-{arm}-n{cfg['n_train']}"
  if protocol == "sweep-eps":
    name += f"-eps{cfg['eps']:.0e}"
  if protocol == "select-lr":
    knob = (
      cfg["penalty"]
      if cfg["penalty"] is not None
      else (cfg["riemannian_lr"] if cfg["riemannian_lr"] is not None else cfg["adamw_lr"])
    )
    name += f"-k{knob:g}"
  return f"{name}-{config_hash(cfg)}-s{seed}.json".replace("+", "")


_code_version = store.code_version


def run_key(run: dict) -> tuple:
  """Two files hold the same run when protocol, arm, :func:`config_hash` and seed agree."""
  return (run["config"].get("protocol"), run["arm"], config_hash(run["config"]), run["seed"])


def _quote(value) -> str:
  return shlex.quote(str(value))


def run_command(protocol: str, arm: str, cfg: dict, seed: int, out: str) -> str:
  """The ``stiefax patches`` command line that reruns exactly this one run."""
  c = cfg
  knob = (
    c["penalty"]
    if c.get("penalty") is not None
    else c["riemannian_lr"]
    if c.get("riemannian_lr") is not None
    else c["adamw_lr"]
  )
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


def _execute(
  ctx: Context,
  protocol: str,
  arm: Arm,
  setting: Setting,
  knob: Optional[float],
  data: patch_data.PatchData,
  seeds: Sequence[int],
  eval_split: str = "test",
  trainer: Optional[Trainer] = None,
) -> list[dict]:
  """Runs ``arm`` over ``seeds`` (skipping finished runs), writing one JSON per run."""
  hp = arm_hparams(arm, setting, knob)
  cfg = _run_config(ctx, protocol, arm, setting, hp, data, eval_split)
  results = []
  for seed in seeds:
    path = ctx.out / _run_name(protocol, arm.name, cfg, seed)
    if path.is_file() and not ctx.args.force:
      try:
        old = json.loads(path.read_text())
        if run_identity(old.get("config", {})) == run_identity(cfg):
          results.append(old)
          continue
      except (OSError, ValueError, AttributeError):
        pass
    if trainer is None:
      trainer = Trainer(arm, setting, hp, data.train_x.shape[1], data.num_classes)
    desc = f"{arm.name} n={setting.n_train} seed={seed}"
    out = train(
      trainer,
      data,
      seed,
      eval_split=eval_split,
      eval_every=ctx.args.eval_every,
      progress=ctx.progress,
      desc=desc,
    )
    rec = {
      "experiment": EXPERIMENT,
      "arm": arm.name,
      "seed": int(seed),
      "config": cfg,
      "command": run_command(protocol, arm.name, cfg, seed, str(ctx.out)),
      "code": _code_version(),
      **out,
    }
    store.write_json(path, rec, overwrite=True)
    m = rec["metrics"]
    acc = m.get(f"{eval_split}_acc")
    print(
      f"  {arm.name:<11} seed {seed:<3} {eval_split} acc {100 * acc:6.2f}%  "
      f"isometry {m['isometry']:.1e}  {m['wall_per_epoch']:.2f} s/epoch",
      flush=True,
    )
    results.append(rec)
  return results


def _select(
  ctx: Context, arms: Sequence[Arm], setting: Setting, data, grids: dict
) -> tuple[dict, list]:
  """``--select-lr``: the knob with the best mean validation accuracy, per arm.

  Returns ``({arm: knob}, selection runs)``.
  """
  seeds = _ints(ctx.args.select_seeds, "--select-seeds")
  chosen, runs = {}, []
  for arm in arms:
    grid = grids.get(arm.name, arm.grid)
    best = None
    for knob in grid:
      res = _execute(ctx, "select-lr", arm, setting, knob, data, seeds, eval_split="val")
      runs += res
      acc = float(np.mean([r["metrics"]["val_acc"] for r in res]))
      if best is None or acc > best[1]:
        best = (knob, acc)
    chosen[arm.name] = best[0]
    print(
      f"selected {arm.name}: {best[0]:g} (validation accuracy {100 * best[1]:.2f}%)", flush=True
    )
  return chosen, runs


def _protocol_run(ctx: Context, arms: Sequence[Arm], seeds: Sequence[int]) -> list[dict]:
  a, dflt = ctx.args, ctx.defaults
  n_train = dflt["n_train"]
  epochs = a.epochs or (100 if n_train >= 50_000 else 40)
  knobs = {k: _knob(v, "--lr") for k, v in _arm_map(a.lr, "--lr").items()}
  setting = _setting(ctx, n_train, epochs)
  runs = []
  if a.select_lr:
    pool = ctx.images.train_x.shape[0]
    n_val = a.n_val if a.n_val is not None else min(5000, pool - n_train)
    if n_val < 1:
      raise CommandError(
        f"--select-lr needs validation images after the first {n_train}:"
        f" the pool has {pool}; lower --n-train or set --n-val"
      )
    data = _data(ctx, n_train, n_val)
    grids = {
      k: [_knob(x, "--grid") for x in v.split(":")] for k, v in _arm_map(a.grid, "--grid").items()
    }
    chosen, runs = _select(ctx, [arm for arm in arms if arm.name != "frozen"], setting, data, grids)
    knobs.update(chosen)
  # The runs hold no validation slice: the training images and the whitening fit do not
  # depend on it, so a run at a selected rate has the same configuration (and pairs in
  # the report) with a run given that rate by --lr.
  data = _data(ctx, n_train, 0)
  print(
    f"patches: {ctx.images.name}, n_train={n_train}, test={len(data.test_y)},"
    f" {epochs} epochs x {setting.steps_per_epoch} steps, arms"
    f" {','.join(x.name for x in arms)}, seeds {','.join(map(str, seeds))}",
    flush=True,
  )
  for arm in arms:
    runs += _execute(ctx, "run", arm, setting, knobs.get(arm.name), data, seeds)
  return runs


def _knob(text: str, flag: str) -> float:
  try:
    v = float(text)
  except ValueError:
    raise CommandError(f"{flag}: {text!r} is not a number") from None
  if not math.isfinite(v) or v < 0:
    raise CommandError(f"{flag}: rates must be finite and >= 0, got {text!r}")
  return v


def _protocol_sweep_n(ctx: Context, arms: Sequence[Arm], seeds: Sequence[int]) -> list[dict]:
  a = ctx.args
  if a.epochs is not None:
    raise CommandError("sweep-n sets the epochs from --budget (steps per run); drop --epochs")
  ns = _ints(a.ns, "--ns") if a.ns else ctx.defaults["ns"]
  knobs = {k: _knob(v, "--lr") for k, v in _arm_map(a.lr, "--lr").items()}
  runs = []
  for n in ns:
    spe = math.ceil(n / a.batch_size)
    epochs = max(1, a.budget // spe)
    setting = _setting(ctx, n, epochs)
    data = _data(ctx, n, 0)
    print(f"sweep-n: n={n}, {epochs} epochs x {spe} steps = {epochs * spe} steps", flush=True)
    for arm in arms:
      runs += _execute(ctx, "sweep-n", arm, setting, knobs.get(arm.name), data, seeds)
  return runs


def _protocol_sweep_eps(ctx: Context, arms: Sequence[Arm], seeds: Sequence[int]) -> list[dict]:
  a = ctx.args
  bad = [arm.name for arm in arms if arm.name not in ADAM_ARMS]
  if bad:
    raise CommandError(
      f"sweep-eps varies the Riemannian Adam eps: arms {bad} have none;"
      f" use --arms from {', '.join(ADAM_ARMS)}"
    )
  values = _floats(a.eps_values, "--eps-values")
  if not values or any(v < 0 or not math.isfinite(v) for v in values):
    raise CommandError(f"--eps-values: need finite values >= 0, got {a.eps_values!r}")
  n_train = ctx.defaults["n_train"]
  epochs = a.epochs or (100 if n_train >= 50_000 else 40)
  knobs = {k: _knob(v, "--lr") for k, v in _arm_map(a.lr, "--lr").items()}
  data = _data(ctx, n_train, 0)
  runs = []
  for eps in values:
    setting = _setting(ctx, n_train, epochs, eps=eps)
    print(f"sweep-eps: eps={eps:g}", flush=True)
    for arm in arms:
      runs += _execute(ctx, "sweep-eps", arm, setting, knobs.get(arm.name), data, seeds)
  return runs


def run(args: argparse.Namespace) -> int:
  _validate(args)
  digits = args.data is None
  if args.arms.strip().lower() == "all":
    arms = [a for a in ARMS.values() if a.name not in OPTIMIZER_ARMS]
  else:
    names = [t for t in args.arms.split(",") if t.strip()]
    if not names:
      raise CommandError("--arms: empty list")
    arms = [arm_by_name(t) for t in names]
    if len({a.name for a in arms}) != len(arms):
      raise CommandError(f"--arms: repeated arm in {args.arms!r}")
  if args.protocol == "sweep-eps" and args.arms == "A2,B2":
    arms = [ARMS["B2"]]
  seeds = _ints(args.seeds, "--seeds")
  if any(s < 0 for s in seeds):
    raise CommandError(f"--seeds must be >= 0, got {args.seeds!r}")
  cache = (
    None
    if args.no_cache
    else pathlib.Path(args.cache).expanduser()
    if args.cache
    else patch_data.default_cache_dir()
  )
  progress = not args.no_progress
  images = patch_data.load_images(
    args.data, order_seed=args.order_seed, cache_dir=cache, progress=progress
  )
  defaults = {
    "n_train": args.n_train or (1000 if digits else 10_000),
    "patch": args.patch or (4 if digits else 8),
    "d": args.d or (16 if digits else 128),
    "heads": args.heads or (4 if digits else 8),
    "head_dim": args.head_dim or (4 if digits else 16),
    "ns": [125, 250, 500, 1000] if digits else [1000, 2000, 5000, 10_000, 20_000, 50_000],
  }
  out = writable_dir(pathlib.Path(args.out).expanduser(), "--out")  # fail before training
  ctx = Context(args, images, out, cache, progress, defaults)
  fn = {"run": _protocol_run, "sweep-n": _protocol_sweep_n, "sweep-eps": _protocol_sweep_eps}[
    args.protocol
  ]
  t0 = time.perf_counter()
  runs = fn(ctx, arms, seeds)
  print(f"\n{len(runs)} runs in {time.perf_counter() - t0:.1f} s; results in {ctx.out}\n")
  print(report(runs, ctx.out))
  return 0


# ------------------------------------------------------------------------------ report


def _pct(x: float) -> str:
  return "nan" if x is None or not math.isfinite(x) else f"{100 * x:.2f}"


def _num(x: Optional[float], fmt: str) -> str:
  return "-" if x is None or not math.isfinite(x) else format(x, fmt)


# Configuration fields that belong to an arm rather than to the setting it runs in.
_ARM_FIELDS = ("protocol", "riemannian_lr", "penalty", "eps", "description", "frame_init")


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


def _knob_of(cfg: dict) -> Optional[float]:
  for k in ("penalty", "riemannian_lr"):
    if cfg.get(k) is not None:
      return cfg[k]
  return cfg.get("adamw_lr")


def _arm_order(name: str) -> tuple:
  names = list(ARMS)
  base = name.split(" ")[0]
  return (names.index(base) if base in names else len(names), name)


def _title(cfg: dict) -> str:
  return (
    f"{cfg.get('dataset')} n_train={cfg.get('n_train')} test={cfg.get('n_test')}"
    f" epochs={cfg.get('epochs')} ({cfg.get('total_steps')} steps) depth={cfg.get('depth')}"
    f" d={cfg.get('d')} H={cfg.get('heads')} r={cfg.get('head_dim')}"
    f" adamw_lr={cfg.get('adamw_lr'):g}"
  )


# Paired contrasts of the paper's Table 7 (and section 4.5): (name, arm b, arm a, what
# b - a isolates). Printed for every group that holds both arms.
CONTRASTS = (
  ("constraint alone", "frozen", "A2", "orthonormal frames never trained, vs AdamW"),
  ("training the frames", "B2", "frozen", "the Riemannian Adam step, vs frozen frames"),
  ("step rule (b,c)", "grassmann", "B2-SGD", "adaptive capped step vs fixed step, both Grassmann"),
  ("projector (a)", "B2", "grassmann", "Stiefel vs Grassmann projector, adaptive step"),
  ("second moment", "B2", "elementwise", "scalar vs elementwise v"),
  ("corrected vs PA16", "B2", "B2-SGD", "all three changes at once"),
)


def _by_seed(runs: Sequence[dict], metric: str) -> dict:
  return {r["seed"]: r["metrics"].get(metric) for r in runs if r["metrics"].get(metric) is not None}


def _paired_row(base: dict, other: dict) -> Optional[Any]:
  from stiefax.experiments import stats  # pylint: disable=g-import-not-at-top

  common = sorted(set(base) & set(other))
  if not common:
    return None
  return stats.paired([100 * base[s] for s in common], [100 * other[s] for s in common])


def _paired_cells(p) -> list[str]:
  if p is None:
    return ["-"] * 5
  return [
    f"{p.mean:+.2f}",
    _num(p.t, ".2f"),
    _num(p.p, ".2g"),
    f"{p.wins}/{p.n}",
    f"[{p.ci_low:+.2f}, {p.ci_high:+.2f}]",
  ]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
  fmt = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
  return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def _report_main(runs: Sequence[dict], out_dir: pathlib.Path, tag: str) -> list[str]:
  from stiefax.experiments import stats  # pylint: disable=g-import-not-at-top

  groups: dict = {}
  for r in runs:
    groups.setdefault(_group_key(r["config"]), []).append(r)
  lines, used = [], set()
  for gi, (_, group) in enumerate(sorted(groups.items(), key=lambda kv: str(kv[0]))):
    knobs: dict = {}
    for r in group:
      knobs.setdefault(r["arm"], set()).add(_knob_of(r["config"]))
    by_arm: dict = {}
    for r in group:
      by_arm.setdefault(_label(r, knobs), []).append(r)
    base = _by_seed(by_arm.get("A2", []), "test_acc")
    rows = []
    for name in sorted(by_arm, key=_arm_order):
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
          "t",
          "p",
          "wins",
          "95% CI (pp)",
          "isometry",
          "s/epoch",
        ],
        rows,
      )
    )
    lines.append(
      "  mean ± sample std (ddof=1) over seeds; Δ paired within seed;"
      " bootstrap CI over 20 000 resamples."
    )
    rows = []
    for name, b, a, what in CONTRASTS:
      if b in by_arm and a in by_arm:
        p = _paired_row(_by_seed(by_arm[a], "test_acc"), _by_seed(by_arm[b], "test_acc"))
        rows.append([name, f"{b} - {a}", *_paired_cells(p), what])
    if rows:
      lines.append("")
      lines.append(
        _table(["contrast", "arms", "Δ pp", "t", "p", "wins", "95% CI (pp)", "isolates"], rows)
      )
    c = group[0]["config"]
    name = f"patches_{tag}_n{c['n_train']}_e{c['epochs']}_depth{c['depth']}_lr{c['adamw_lr']:g}"
    if name in used:
      name += f"_{gi}"
    used.add(name)
    png = _plot_main(by_arm, out_dir, name + ".png", _title(c))
    if png:
      lines.append(f"  plot: {png}")
    lines.append("")
  return lines


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
  rows = []
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
    c = by_arm["A2"][0]["config"]
    share = fz.mean / b2.mean if b2.mean else float("nan")
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
      ]
    )
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
      ],
      rows,
    ),
    "  paired within seed on the seeds all three arms share; share = (frozen - A2) / (B2 - A2).",
    "",
  ]


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
  from stiefax.experiments import stats  # pylint: disable=g-import-not-at-top

  by_n: dict = {}
  for r in runs:
    by_n.setdefault(r["config"]["n_train"], {}).setdefault(r["arm"], []).append(r)
  arms = sorted({r["arm"] for r in runs}, key=_arm_order)
  rows, curves = [], {a: [] for a in arms}
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
      cells += [f"{p.mean:+.2f}", _num(p.t, ".2f"), f"{p.wins}/{p.n}"] if p else ["-"] * 3
    rows.append(cells)
  header = ["n", "steps", "epochs"] + [f"{a} %" for a in arms]
  for a in arms:
    if a != "A2":
      header += [f"{a}-A2 pp", "t", "wins"]
  lines = [
    "patches (sweep-n): data-size sweep at a fixed step budget",
    _table(header, rows),
    "  mean ± population std (ddof=0) over seeds, as the paper's Table 3.",
  ]
  png = _plot_xy(curves, out_dir, "patches_sweep_n.png", "n_train", "test accuracy (%)")
  if png:
    lines.append(f"  plot: {png}")
  return lines + [""]


def _report_sweep_eps(runs: Sequence[dict], out_dir: pathlib.Path) -> list[str]:
  from stiefax.experiments import stats  # pylint: disable=g-import-not-at-top

  lines = ["patches (sweep-eps): Riemannian Adam eps probe (paper 4.7)"]
  for arm in sorted({r["arm"] for r in runs}, key=_arm_order):
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
        ["eps", "seeds", "test acc %", f"Δ vs {ref_eps:.0e} pp", "t", "p", "wins", "95% CI (pp)"],
        rows,
      )
    )
    png = _plot_xy(
      {arm: curve}, out_dir, f"patches_sweep_eps_{arm}.png", "eps", "test accuracy (%)"
    )
    if png:
      lines.append(f"  plot: {png}")
    lines.append("")
  return lines


def _report_select(runs: Sequence[dict]) -> list[str]:
  by_arm: dict = {}
  for r in runs:
    c = r["config"]
    knob = (
      c["penalty"]
      if c.get("penalty") is not None
      else (c["riemannian_lr"] if c.get("riemannian_lr") is not None else c["adamw_lr"])
    )
    by_arm.setdefault(r["arm"], {}).setdefault(knob, []).append(r["metrics"]["val_acc"])
  rows = []
  for arm in sorted(by_arm, key=_arm_order):
    scores = {k: float(np.mean(v)) for k, v in by_arm[arm].items()}
    best = max(scores, key=scores.get)
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


def _plt():
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

    return plt
  except ImportError:
    return None


def _plot_main(by_arm: dict, out_dir: pathlib.Path, name: str, title: str) -> Optional[str]:
  plt = _plt()
  if plt is None:
    return None
  names = sorted(by_arm, key=_arm_order)
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
  return _save(fig, plt, out_dir, name)


def _plot_xy(
  curves: dict, out_dir: pathlib.Path, name: str, xlabel: str, ylabel: str
) -> Optional[str]:
  plt = _plt()
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
  return _save(fig, plt, out_dir, name)


def _save(fig, plt, out_dir: pathlib.Path, name: str) -> Optional[str]:
  try:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    fig.savefig(path, dpi=110)
    return str(path)
  except OSError:
    return None
  finally:
    plt.close(fig)


def report(runs: list[dict], out_dir: pathlib.Path) -> str:
  """Paper-style tables of ``patches`` runs (and PNG plots written to ``out_dir``).

  ``run`` protocol: per arm, test accuracy mean ± std (ddof=1), the paired difference
  to A2 within seed (mean, t, p, wins k/n, 20 000-resample bootstrap 95% CI), final
  isometry error and wall-clock per epoch. ``sweep-n``: a row per n (ddof=0, as the
  paper's Table 3). ``sweep-eps``: a row per eps, paired against the smallest eps.
  ``select-lr``: validation accuracy per rate.

  Args:
    runs: result dicts (the JSON files); runs of other experiments are ignored.
    out_dir: where plots go.

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
  if "sweep-n" in by_protocol:
    lines += _report_sweep_n(by_protocol["sweep-n"], out_dir)
  if "sweep-eps" in by_protocol:
    sweep = by_protocol["sweep-eps"]
    lines += _report_sweep_eps(sweep + _eps_references(sweep, by_protocol.get("run", [])), out_dir)
  return "\n".join(lines).rstrip() + "\n"
