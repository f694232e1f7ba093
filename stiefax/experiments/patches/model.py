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
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

import stiefax
from stiefax.experiments.attention import attention_module
from stiefax.experiments.patches.config import Setting

__all__ = ["make_model", "encoder", "frame_paths", "isometry_fn"]


def make_model(
  setting: Setting, tokens: int, num_classes: int, attention: str = "plain"
) -> nn.Module:
  """The pre-LN encoder of the module docstring, as a Flax linen module.

  ``attention``: the arm's attention variant (:mod:`stiefax.experiments.attention`).
  """
  return encoder(
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
def encoder(
  depth: int,
  d: int,
  heads: int,
  head_dim: int,
  mlp_ratio: int,
  tokens: int,
  num_classes: int,
  attention: str = "plain",
) -> nn.Module:
  """The encoder of this shape (one instance per shape and attention variant)."""
  xavier = nn.initializers.xavier_uniform()

  class PatchEncoder(nn.Module):
    """Pre-LN transformer encoder over whitened patch tokens ``(B, P, d)``."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
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

  return PatchEncoder()


@functools.lru_cache(maxsize=1)
def isometry_fn() -> Callable[[Any], jax.Array]:
  """Jitted ``params -> max|W^T W - I|`` over the query/key frames."""
  return jax.jit(lambda p: stiefax.diagnostics.isometry_error(p, stiefax.layouts.qk_labels))


def frame_paths(params: Any) -> list[int]:
  """Indices (in ``jax.tree.leaves`` order) of the query/key frame parameters.

  ``params`` may be abstract (``jax.eval_shape``): only names and shapes are read.
  """
  labels = jax.tree.leaves(stiefax.layouts.qk_labels(params))
  return [i for i, lab in enumerate(labels) if lab == "stiefel"]
