"""The grokking model: the paper's encoder (Flax linen) and each arm's starting point."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from stiefax.experiments import attention as attention_lib
from stiefax.experiments.grok.config import GrokConfig

__all__ = ["make_model"]


def make_model(config: GrokConfig, attention: str = "plain") -> nn.Module:
  """The paper's encoder for ``config``, as a Flax linen module.

  ``attention``: the arm's attention variant (``plain``, ``qknorm`` or ``sigma``;
  :mod:`stiefax.experiments.attention`); ``plain`` is Flax's
  ``MultiHeadDotProductAttention``.
  """
  return _make_model(config, attention)


@functools.cache
def _make_model(config: GrokConfig, attention: str) -> nn.Module:
  class Block(nn.Module):
    """Pre-LN encoder block: x + MHA(LN(x)), then x + FFN(LN(x)); no mask."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
      h = nn.LayerNorm(name="ln_attn")(x)
      h = attention_lib.attention_module(
        attention,
        num_heads=config.num_heads,
        qkv_features=config.num_heads * config.head_dim,
        out_features=config.d_model,
        name="attn",
      )(h)
      x = x + h
      h = nn.LayerNorm(name="ln_ffn")(x)
      h = nn.Dense(config.ffn_mult * config.d_model, name="ffn_in")(h)
      h = nn.Dense(config.d_model, name="ffn_out")(nn.relu(h))
      return x + h

  class GrokTransformer(nn.Module):
    """(a, b, =) -> logits over c; readout concat(3 x d) -> hidden -> ReLU -> p."""

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
      x = nn.Embed(config.modulus + 1, config.d_model, name="token_embed")(tokens)
      pos = nn.Embed(tokens.shape[-1], config.d_model, name="pos_embed")(
        jnp.arange(tokens.shape[-1])
      )
      x = x + pos[None]
      for i in range(config.num_layers):
        x = Block(name=f"block_{i}")(x)
      x = nn.LayerNorm(name="ln_final")(x)
      x = x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))
      x = nn.relu(nn.Dense(config.readout_hidden, name="readout_hidden")(x))
      return nn.Dense(config.modulus, name="readout_out")(x)

  return GrokTransformer()
