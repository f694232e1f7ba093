"""Training one (arm, seed) of the image-patch benchmark.

Batch 256 (the last partial batch of an epoch is kept, its padding weighted 0), plain
cross-entropy (plus the soft arm's penalty), one jitted ``lax.scan`` over an epoch's
batches; the batch order depends on the seed only (shared across arms).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import stiefax
from stiefax import geometry
from stiefax.experiments import attention
from stiefax.experiments import optim
from stiefax.experiments.arms import Arm
from stiefax.experiments.patches import data as data_lib
from stiefax.experiments.patches import model as model_lib
from stiefax.experiments.patches.config import Setting
from stiefax.experiments.patches.config import hyper
from stiefax.experiments.patches.config import learning_rates
from stiefax.experiments.progress import progress_bar

__all__ = [
  "EpochStats",
  "Trainer",
  "train",
  "Programs",
  "ModelConfig",
  "model_programs",
  "programs",
  "init_model",
  "init_params",
]

#: Per-step outputs of :meth:`Trainer.epoch`, each of shape ``(steps,)``.
EpochStats = tuple[Any, Any, Any, Any, Any, Any]


class Trainer:
  """The jitted epoch and evaluation of one (arm, setting, rates).

  Built once and reused across seeds, so each arm compiles once. Everything it holds
  is fixed at construction: the model, the optimizer ``tx``, the indices of the frame
  parameters ``frame_ids`` (read from the model's abstract parameters) and the jitted
  programs.

  Attributes:
    arm, setting, hp, tokens, num_classes: what it was built for.
    model: the Flax module.
    tx: the arm's optimizer.
    frame_ids: leaf indices of W_Q, W_K in ``jax.tree.leaves(params)``.
  """

  def __init__(self, arm: Arm, setting: Setting, hp: dict, tokens: int, num_classes: int):
    self.arm, self.setting, self.hp = arm, setting, hp
    self.tokens, self.num_classes = tokens, num_classes
    progs = model_programs(setting, tokens, num_classes, arm.attention)
    self.model = progs.model
    self.tx = optim.make_optimizer(arm, hyper(setting, hp))
    abstract = jax.eval_shape(
      progs.init, jax.random.key(0), jax.ShapeDtypeStruct((1, tokens, setting.d), jnp.float32)
    )
    self.frame_ids: tuple[int, ...] = tuple(model_lib.frame_paths(abstract))
    self._model_init = progs.init
    self._predict = progs.predict
    self._isometry = model_lib.isometry_fn()
    self._tx_init = jax.jit(self.tx.init)
    self._epoch = jax.jit(self._epoch_fn(), donate_argnums=(0, 1))
    self._probe = attention.probe_fn(self.model)

  def _epoch_fn(self) -> Callable[..., tuple[Any, Any, EpochStats]]:
    """``epoch(params, opt_state, xs, ys, idx, w) -> (params, opt_state, EpochStats)``."""
    model, tx, frame_ids = self.model, self.tx, self.frame_ids
    lam = self.hp["penalty"]
    spec = stiefax.FrameSpec()

    def loss_fn(
      params: optax.Params, x: jax.Array, y: jax.Array, w: jax.Array
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, Any]]:
      logits, state = attention.apply_train(model, params, x)
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
      loss = jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)
      total = loss
      if lam is not None:
        total = total + lam * stiefax.flax.orthogonality_penalty(params, stiefax.layouts.qk_labels)
      correct = jnp.sum((jnp.argmax(logits, -1) == y) * w)
      return total, (loss, correct, state)

    def frame_norm(frames: jax.Array) -> jax.Array:  # mean over frames of ||X||_F
      return jnp.mean(jnp.sqrt(geometry.frame_sq_norm(frames)))

    def epoch(
      params: optax.Params,
      opt_state: optax.OptState,
      xs: jax.Array,
      ys: jax.Array,
      idx: jax.Array,
      w: jax.Array,
    ) -> tuple[Any, Any, EpochStats]:
      def step(
        carry: tuple[Any, Any], batch: tuple[jax.Array, jax.Array]
      ) -> tuple[tuple[Any, Any], EpochStats]:
        params, opt_state = carry
        b_idx, b_w = batch
        (_, (loss, correct, state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          params, xs[b_idx], ys[b_idx], b_w
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        new_params = attention.with_state(optax.apply_updates(params, updates), state)
        p_l, g_l, n_l = (jax.tree.leaves(t) for t in (params, grads, new_params))
        stats: list[jax.Array | float] = [jnp.zeros([], jnp.float32)] * 3
        if frame_ids:
          k = float(len(frame_ids))
          w_f = [spec.to_frames(p_l[i]) for i in frame_ids]
          g_f = [spec.to_frames(g_l[i]) for i in frame_ids]
          stats = [
            sum(frame_norm(g) for g in g_f) / k,
            sum(frame_norm(geometry.stiefel_tangent(w, g)) for w, g in zip(w_f, g_f)) / k,
            sum(frame_norm(spec.to_frames(n_l[i] - p_l[i])) for i in frame_ids) / k,
          ]
        return (new_params, opt_state), (loss * jnp.sum(b_w), correct, jnp.sum(b_w), *stats)

      (params, opt_state), out = jax.lax.scan(step, (params, opt_state), (idx, w))
      return params, opt_state, out

    return epoch

  def init(self, seed: int) -> tuple[Any, Any]:
    """``(params, opt_state)`` of ``seed`` (see :func:`init_model`)."""
    params = init_model(self.model, self.arm, seed, self.tokens, self.setting.d, self._model_init)
    return params, self._tx_init(params)

  def epoch(
    self,
    params: optax.Params,
    opt_state: optax.OptState,
    xs: jax.Array,
    ys: jax.Array,
    idx: jax.Array,
    w: jax.Array,
  ) -> tuple[Any, Any, EpochStats]:
    """One epoch: a scan over the batches ``idx`` ``(S, B)`` with weights ``w``.

    Returns the new ``(params, opt_state)`` (the arguments' buffers are donated) and
    per step: the weighted loss sum, correct count, weight sum, and the mean frame
    gradient, tangent-gradient and step norms.
    """
    return self._epoch(params, opt_state, xs, ys, idx, w)

  def probe(self, params: optax.Params, x: jax.Array | np.ndarray) -> dict[str, float]:
    """``{"max_logit", "entropy"}`` of the attention on the batch ``x``."""
    return {k: float(v) for k, v in self._probe(params, x).items()}

  def isometry(self, params: optax.Params) -> float:
    """``max|W^T W - I|`` over the query/key frames."""
    return float(self._isometry(params))

  def accuracy(
    self, params: optax.Params, x: np.ndarray, y: np.ndarray, chunk: int = 1000
  ) -> float:
    """Accuracy over ``(x, y)`` in fixed-size chunks (the last one padded)."""
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

  def batches(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """One epoch's batch indices ``(S, B)`` and weights (0 pads the last batch)."""
    s, b = self.setting.steps_per_epoch, self.setting.batch_size
    perm = rng.permutation(n)
    idx = np.zeros(s * b, np.int32)
    w = np.zeros(s * b, np.float32)
    idx[:n], w[:n] = perm, 1.0
    return idx.reshape(s, b), w.reshape(s, b)


_HISTORY = (
  "train_loss",
  "train_acc",
  "isometry",
  "frame_grad_norm",
  "frame_tangent_norm",
  "frame_step_norm",
  "epoch_time",
  "lr_adamw",
  "lr_riemannian",
  "max_logit",
  "attn_entropy",
)

#: Training images the attention probe reads (the first of the training set).
PROBE_BATCH = 256


def train(
  trainer: Trainer,
  data: data_lib.PatchData,
  seed: int,
  *,
  eval_split: str = "test",
  eval_every: int = 0,
  progress: bool = True,
  desc: str = "",
) -> dict:
  """Trains one (arm, seed) and returns ``{"metrics", "history", "wall_time"}``."""
  s = trainer.setting
  t_start = time.perf_counter()
  xs, ys = jnp.asarray(data.train_x), jnp.asarray(data.train_y)
  ex, ey = (data.test_x, data.test_y) if eval_split == "test" else (data.val_x, data.val_y)
  params, opt_state = trainer.init(seed)
  probe_x = jnp.asarray(data.train_x[:PROBE_BATCH])
  rng = np.random.default_rng([seed, 1])  # batch order: the seed's, shared across arms
  hist: dict[str, list] = {k: [] for k in _HISTORY}
  hist[f"{eval_split}_acc"] = []
  hist[f"{eval_split}_acc_epoch"] = []
  diverged = False
  bar = progress_bar(s.epochs, desc=desc, unit="ep", enabled=progress, leave=False)
  for ep in range(s.epochs):
    idx, w = trainer.batches(rng, data.train_x.shape[0])
    t0 = time.perf_counter()
    params, opt_state, out = trainer.epoch(
      params, opt_state, xs, ys, jnp.asarray(idx), jnp.asarray(w)
    )
    loss_sum, correct, count, g, tg, st = (
      np.asarray(o, np.float64) for o in jax.block_until_ready(out)
    )
    hist["epoch_time"].append(time.perf_counter() - t0)
    hist["train_loss"].append(float(loss_sum.sum() / count.sum()))
    hist["train_acc"].append(float(correct.sum() / count.sum()))
    hist["frame_grad_norm"].append(float(g.mean()))
    hist["frame_tangent_norm"].append(float(tg.mean()))
    hist["frame_step_norm"].append(float(st.mean()))
    hist["isometry"].append(trainer.isometry(params))
    lr_adamw, lr_frames = learning_rates(s, trainer.hp, (ep + 1) * s.steps_per_epoch - 1)
    hist["lr_adamw"].append(lr_adamw)
    hist["lr_riemannian"].append(lr_frames)
    attn = trainer.probe(params, probe_x)
    hist["max_logit"].append(attn["max_logit"])
    hist["attn_entropy"].append(attn["entropy"])
    bar.update(1)
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
  return {
    "metrics": _metrics(hist, eval_split, final_acc, diverged),
    "history": hist,
    "wall_time": time.perf_counter() - t_start,
  }


def _metrics(hist: dict, eval_split: str, final_acc: float, diverged: bool) -> dict:
  times = hist["epoch_time"]
  steady = times[1:] if len(times) > 1 else times
  late = max(1, len(hist["frame_step_norm"]) // 4)
  tang = float(np.mean(hist["frame_tangent_norm"][-late:]))
  step_per_grad: Optional[float] = None
  if tang > 0:
    step_per_grad = float(np.mean(hist["frame_step_norm"][-late:])) / tang
  metrics = {
    f"{eval_split}_acc": final_acc,
    "isometry": hist["isometry"][-1],
    "isometry_max": float(np.max(hist["isometry"])),
    "wall_per_epoch": float(np.median(steady)),
    "compile_time": float(max(0.0, times[0] - np.median(steady))) if len(times) > 1 else None,
    "train_loss": hist["train_loss"][-1],
    "train_acc": hist["train_acc"][-1],
    "late_step_per_grad": step_per_grad,
    "diverged": diverged,
    "max_logit": hist["max_logit"][-1],
    "max_logit_max": float(np.max(hist["max_logit"])),
    "attn_entropy": hist["attn_entropy"][-1],
  }
  if eval_split != "test":
    metrics["test_acc"] = None
  return metrics


class Programs(NamedTuple):
  """A model and its jitted ``init(key, x)`` and ``predict(params, x) -> labels``."""

  model: Any
  init: Any
  predict: Any


def model_programs(
  setting: Setting, tokens: int, num_classes: int, attention: str = "plain"
) -> Programs:
  """The model of this shape with its jitted init and predict, shared by the arms.

  ``attention``: the arm's attention variant (:mod:`stiefax.experiments.attention`).
  """
  return _programs(model_lib.make_model(setting, tokens, num_classes, attention))


@functools.lru_cache(maxsize=16)
def _programs(model: nn.Module) -> Programs:
  def predict(params: Any, x: Any) -> Any:
    logits: Any = model.apply(params, x)
    return jnp.argmax(logits, axis=-1)

  return Programs(model, jax.jit(model.init), jax.jit(predict))


def init_model(
  model: nn.Module, arm: Arm, seed: int, tokens: int, d: int, model_init: Optional[Any] = None
) -> Any:
  """Seeded init: non-frame parameters depend on the seed only; frames per the arm.

  Orthonormal frames (``arm.orthonormal``) are drawn from the seed too, identical
  across the arms that use them. ``model_init`` is ``model.init`` or a jitted copy.
  """
  key = jax.random.key(seed)
  k_init, k_frames = jax.random.split(key)
  params = (model_init or model.init)(k_init, jnp.zeros((1, tokens, d), jnp.float32))
  if arm.orthonormal:
    leaves, treedef = jax.tree.flatten(params)
    init = stiefax.flax.orthonormal_init()
    for j, i in enumerate(model_lib.frame_paths(params)):
      leaves[i] = init(jax.random.fold_in(k_frames, j), leaves[i].shape, leaves[i].dtype)
    params = jax.tree.unflatten(treedef, leaves)
  return params


class ModelConfig(NamedTuple):
  """A model of the benchmark: a :class:`Setting` with the data's token count and
  classes (the ``config`` of :mod:`stiefax.experiments.protocol`'s pieces)."""

  setting: Setting
  tokens: int
  num_classes: int


def programs(config: ModelConfig, arm: Arm) -> Programs:
  """The model of ``config`` with ``arm``'s attention, its jitted init and predict
  (:func:`model_programs`; the same object for the same model)."""
  return model_programs(config.setting, config.tokens, config.num_classes, arm.attention)


def init_params(config: ModelConfig, arm: Arm, seed: int) -> Any:
  """``arm``'s starting variables at ``seed`` (:func:`init_model`, with the jitted init
  that the trainers share)."""
  progs = programs(config, arm)
  return init_model(progs.model, arm, seed, config.tokens, config.setting.d, progs.init)
