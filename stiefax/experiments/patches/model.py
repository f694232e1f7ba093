"""The image-patch model: a pre-LN encoder over whitened patch tokens, and its init.

The whitened tokens are the embeddings (the whitening *is* the embedding), plus a
learned positional embedding ``(P, d)`` (normal, std 0.02); ``depth`` pre-LN blocks
``x += MHA(LN(x)); x += MLP(LN(x))`` (Flax ``MultiHeadDotProductAttention`` with H
heads of width r, so W_Q, W_K are ``(d, H, r)`` kernels = H frames in St(d, r); MLP
d -> 4d -> d with GELU); final LayerNorm, mean pooling over tokens, classifier.
Xavier-uniform kernels.
"""

from __future__ import annotations

import functools
from typing import Any
from typing import NamedTuple
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

import stiefax
from stiefax.experiments.arms import Arm
from stiefax.experiments.attention import attention_module
from stiefax.experiments.patches.config import Setting

__all__ = ["Programs", "make_model", "programs", "init_params", "frame_paths", "isometry_fn"]


class Programs(NamedTuple):
  """A model and its jitted ``init(key, x)`` and ``predict(params, x) -> labels``."""

  model: Any
  init: Any
  predict: Any


def make_model(setting: Setting, tokens: int, num_classes: int, attention: str = "plain"):
  """The pre-LN encoder of the module docstring, as a Flax linen module."""
  return programs(setting, tokens, num_classes, attention).model


def programs(setting: Setting, tokens: int, num_classes: int, attention: str = "plain") -> Programs:
  """The model of this shape with its jitted init and predict, shared by the arms.

  ``attention``: the arm's attention variant (:mod:`stiefax.experiments.attention`).
  """
  return _programs(
    setting.depth,
    setting.d,
    setting.heads,
    setting.head_dim,
    setting.mlp_ratio,
    tokens,
    num_classes,
    attention,
  )


@functools.lru_cache(maxsize=16)
def _programs(
  depth: int,
  d: int,
  heads: int,
  head_dim: int,
  mlp_ratio: int,
  tokens: int,
  num_classes: int,
  attention: str = "plain",
) -> Programs:
  xavier = nn.initializers.xavier_uniform()

  class PatchEncoder(nn.Module):
    """Pre-LN transformer encoder over whitened patch tokens ``(B, P, d)``."""

    @nn.compact
    def __call__(self, x):
      pos = self.param("pos_embedding", nn.initializers.normal(0.02), (tokens, d))
      h = x + pos[None]
      for i in range(depth):
        y = nn.LayerNorm(name=f"ln_attn_{i}")(h)
        y = attention_module(
          attention,
          num_heads=heads,
          qkv_features=heads * head_dim,
          out_features=d,
          kernel_init=xavier,
          deterministic=True,
          name=f"attn_{i}",
        )(y)
        h = h + y
        y = nn.LayerNorm(name=f"ln_mlp_{i}")(h)
        y = nn.Dense(mlp_ratio * d, kernel_init=xavier, name=f"mlp_in_{i}")(y)
        y = nn.Dense(d, kernel_init=xavier, name=f"mlp_out_{i}")(nn.gelu(y))
        h = h + y
      h = nn.LayerNorm(name="ln_final")(h)
      return nn.Dense(num_classes, kernel_init=xavier, name="classifier")(jnp.mean(h, axis=1))

  model = PatchEncoder()

  def predict(params: Any, x: Any) -> Any:
    logits: Any = model.apply(params, x)
    return jnp.argmax(logits, axis=-1)

  return Programs(model, jax.jit(model.init), jax.jit(predict))


@functools.lru_cache(maxsize=1)
def isometry_fn():
  """Jitted ``params -> max|W^T W - I|`` over the query/key frames."""
  return jax.jit(lambda p: stiefax.diagnostics.isometry_error(p, stiefax.layouts.qk_labels))


def frame_paths(params) -> list[int]:
  """Indices (in ``jax.tree.leaves`` order) of the query/key frame parameters.

  ``params`` may be abstract (``jax.eval_shape``): only names and shapes are read.
  """
  labels = jax.tree.leaves(stiefax.layouts.qk_labels(params))
  return [i for i, lab in enumerate(labels) if lab == "stiefel"]


def init_params(
  model, arm: Arm, seed: int, tokens: int, d: int, model_init: Optional[Any] = None
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
    for j, i in enumerate(frame_paths(params)):
      leaves[i] = init(jax.random.fold_in(k_frames, j), leaves[i].shape, leaves[i].dtype)
    params = jax.tree.unflatten(treedef, leaves)
  return params
