"""The decoder of ``stiefax lm``: a small modern LM with Gemma's parameter layout.

Bytes in (vocabulary 256), a tied embedding ``(256, d)`` (scaled by ``sqrt(d)`` on the
way in, its transpose the output layer, as Gemma), then ``depth`` pre-norm blocks

    x += Attention(RMSNorm(x));  x += GeGLU(RMSNorm(x))

and a final RMSNorm. RMSNorm is Gemma's: ``x / rms(x) * (1 + scale)``, scale at 0.
The MLP is Gemma's gated GELU, ``gating_einsum/w (2, d, f)`` and ``linear/w (f, d)``.
Attention is causal, with rotary position embeddings (RoPE, base 10 000, on q and k)
and grouped-query heads laid out as Gemma lays them out: ``q_einsum/w`` of shape
``(H, d, r)`` and one fused ``kv_einsum/w`` of shape ``(2, K, d, r)`` whose first slice
holds the keys and second the values (each key/value head serves ``H / K`` query
heads); the output is ``attn_vec_einsum/w (H, r, d)``. So every query head and every
key head is a frame in St(d, r) that :func:`stiefax.layouts.qk_labels` and
:func:`stiefax.layouts.qk_frames` find by name, and the value slice is not.

The attention variants of :mod:`stiefax.experiments.attention`:

  plain    logits ``q·k / sqrt(r)``.
  qknorm   each head's q and k go through a LayerNorm over their r features (no bias,
           learned scale ``(r,)``, ``query_ln`` and ``key_ln``) before RoPE.
  sigma    σReparam on W_Q (the ``(d, H r)`` matrix of ``q_einsum``) and W_K (the key
           slice of ``kv_einsum`` as ``(d, K r)``): ``(gamma / sigma(W)) W`` with learned
           scalars ``q_gamma``, ``k_gamma`` and the power-iteration vectors in the
           ``sigma_reparam`` collection.

Three options change how a head reads its frames (the arms of docs/lm.md, study 2):

  temperature  the logits are ``exp(t_h) q·k / sqrt(r)`` with a learned ``t_h`` per
               query head (``attn/temperature``, shape ``(H,)``, init 0).
  qk_input     ``gained`` (default): W_Q, W_K read the pre-attention norm's output
               ``x / rms(x) * (1 + s)``; ``fold``: they read ``x / rms(x)``, without the
               gain ``1 + s``, which still scales the values' input.
  frame_gain   each query/key head is ``U_h diag(g_h)`` with the frame ``U_h`` and a
               learned ``g_h`` in R^r (``attn/q_gain`` ``(H r,)`` and ``attn/k_gain``
               ``(K r,)``, init 1; vectors, so AdamW does not decay them).

With the ``intermediates`` collection mutable, each attention layer sows its largest
logit ``max |q·k| / sqrt(r)`` over unmasked pairs (after the temperature) and its mean
attention entropy, overall and per head. :func:`logit_bounds` gives each head's
largest possible logit from the parameters alone.
Kernels start from a variance-scaling normal of fan-in (so a head's columns have norm
about 1); parameters are float32.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from stiefax.experiments import attention as attention_lib

__all__ = ["ModelConfig", "DecoderLM", "rope", "logit_bounds"]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The decoder's shape."""

  d_model: int = 64
  depth: int = 2
  heads: int = 4
  kv_heads: int = 2
  head_dim: int = 16
  mlp_dim: int = 256
  seq: int = 128
  vocab: int = 256


def rope(x: jax.Array, base: float = 10_000.0) -> jax.Array:
  """Rotary embedding of ``x`` ``(B, T, N, r)`` (r even): pairs (i, i + r/2) rotated
  by ``t / base^(2i/r)`` at position ``t``."""
  t, r = x.shape[1], x.shape[-1]
  half = r // 2
  freq = base ** (-jnp.arange(half, dtype=x.dtype) * 2 / r)
  angle = jnp.arange(t, dtype=x.dtype)[:, None] * freq[None, :]  # (T, r/2)
  sin = jnp.sin(angle)[None, :, None, :].astype(x.dtype)
  cos = jnp.cos(angle)[None, :, None, :].astype(x.dtype)
  x1, x2 = x[..., :half], x[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


_RMS_EPS = 1e-6


class RMSNorm(nn.Module):
  """``x / rms(x) * (1 + scale)`` over the last axis (Gemma's), scale at 0.

  ``gain=False`` returns ``x / rms(x)`` (the same module, the same parameter, unused).
  """

  @nn.compact
  def __call__(self, x: jax.Array, gain: bool = True) -> jax.Array:
    scale = self.param("scale", nn.initializers.zeros_init(), (x.shape[-1],))
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    y = x * jax.lax.rsqrt(var + _RMS_EPS)
    if not gain:
      return y
    return y * (1.0 + scale).reshape((1,) * (x.ndim - 1) + (-1,))


def _fan_in_init(axis: int | tuple[int, ...]) -> nn.initializers.Initializer:
  return nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=axis, out_axis=-1)


def _reparam(module: nn.Module, name: str, w2d: jax.Array) -> jax.Array:
  """``gamma / sigma(w2d)`` of σReparam, advancing the stored vector in training."""
  u_var = module.variable(
    attention_lib.SIGMA_COLLECTION, name, lambda: attention_lib.top_vector(w2d)
  )
  gamma = module.param(
    f"{name}_gamma", lambda _: attention_lib.spectral_norm_step(w2d, u_var.value)[0]
  )
  sigma, u_new = attention_lib.spectral_norm_step(w2d, u_var.value)
  if module.is_mutable_collection(attention_lib.SIGMA_COLLECTION) and not module.is_initializing():
    u_var.value = u_new
  return gamma / sigma


class _Weight(nn.Module):
  """A single weight ``w`` (Gemma's ``Einsum`` modules hold their weight as ``w``)."""

  shape: tuple
  in_axis: int | tuple[int, ...] = -2

  @nn.compact
  def __call__(self) -> jax.Array:
    return self.param("w", _fan_in_init(self.in_axis), self.shape)


class Attention(nn.Module):
  """Causal grouped-query attention with RoPE, in Gemma's layout (module docstring).

  ``x`` feeds the values; ``x_qk`` (default ``x``) feeds the queries and keys.
  """

  config: ModelConfig
  attention: str = "plain"
  temperature: bool = False
  frame_gain: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, x_qk: jax.Array | None = None) -> jax.Array:
    c = self.config
    x_qk = x if x_qk is None else x_qk
    d, h, k, r = x.shape[-1], c.heads, c.kv_heads, c.head_dim
    wq = _Weight((h, d, r), in_axis=1, name="q_einsum")()
    wkv = _Weight((2, k, d, r), in_axis=2, name="kv_einsum")()
    wk = wkv[0]
    if self.attention == "sigma":
      wq = wq * _reparam(self, "q", jnp.transpose(wq, (1, 0, 2)).reshape(d, h * r))
      wk = wk * _reparam(self, "k", jnp.transpose(wk, (1, 0, 2)).reshape(d, k * r))
    q = jnp.einsum("btd,ndr->btnr", x_qk, wq)
    key = jnp.einsum("btd,ndr->btnr", x_qk, wk)
    v = jnp.einsum("btd,ndr->btnr", x, wkv[1])
    if self.frame_gain:  # W_h = U_h diag(g_h): q_h = g_h * (U_h^T x)
      q = q * self.param("q_gain", nn.initializers.ones_init(), (h * r,)).reshape(1, 1, h, r)
      key = key * self.param("k_gain", nn.initializers.ones_init(), (k * r,)).reshape(1, 1, k, r)
    if self.attention == "qknorm":
      q = nn.LayerNorm(use_bias=False, name="query_ln")(q)
      key = nn.LayerNorm(use_bias=False, name="key_ln")(key)
    q, key = rope(q), rope(key)
    key, v = jnp.repeat(key, h // k, axis=2), jnp.repeat(v, h // k, axis=2)
    t = x.shape[1]
    logits = jnp.einsum("btnr,bsnr->bnts", q, key) / math.sqrt(r)
    if self.temperature:
      temp = self.param("temperature", nn.initializers.zeros_init(), (h,))
      logits = logits * jnp.exp(temp).astype(logits.dtype)[None, :, None, None]
    causal = jnp.tril(jnp.ones((t, t), bool))[None, None]
    masked = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
    weights = jax.nn.softmax(masked, axis=-1)
    if self.is_mutable_collection("intermediates"):
      head_max = jnp.max(jnp.where(causal, jnp.abs(logits), 0.0), axis=(0, 2, 3))
      self.sow("intermediates", "max_logit", jnp.max(head_max))
      self.sow("intermediates", "head_max_logit", head_max)
      ent = -jnp.sum(jnp.where(causal, weights * jnp.log(jnp.maximum(weights, 1e-30)), 0.0), -1)
      self.sow("intermediates", "entropy", jnp.mean(ent))
      self.sow("intermediates", "head_entropy", jnp.mean(ent, axis=(0, 2)))
    out = jnp.einsum("bnts,bsnr->btnr", weights, v)
    wo = _Weight((h, r, d), in_axis=(0, 1), name="attn_vec_einsum")()
    return jnp.einsum("btnr,nrd->btd", out, wo)


class Block(nn.Module):
  """``x += Attention(RMSNorm(x)); x += GeGLU(RMSNorm(x))``."""

  config: ModelConfig
  attention: str = "plain"
  temperature: bool = False
  qk_input: str = "gained"
  frame_gain: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = self.config
    norm = RMSNorm(name="pre_attention_norm")
    y = norm(x)
    y_qk = norm(x, gain=False) if self.qk_input == "fold" else None
    attn = Attention(c, self.attention, self.temperature, self.frame_gain, name="attn")
    x = x + attn(y, y_qk)
    y = RMSNorm(name="pre_ffw_norm")(x)
    gate_up = _Weight((2, c.d_model, c.mlp_dim), in_axis=-2, name="gating_einsum")()
    gate, up = jnp.einsum("btd,cdf->cbtf", y, gate_up)
    w_out = _Weight((c.mlp_dim, c.d_model), in_axis=-2, name="linear")()
    return x + jnp.einsum("btf,fd->btd", nn.gelu(gate) * up, w_out)


class DecoderLM(nn.Module):
  """The decoder of the module docstring: ``tokens (B, T) -> logits (B, T, 256)``."""

  config: ModelConfig
  attention: str = "plain"
  temperature: bool = False
  qk_input: str = "gained"
  frame_gain: bool = False

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    c = self.config
    embed = self.param(
      "input_embedding", nn.initializers.normal(c.d_model**-0.5), (c.vocab, c.d_model)
    )
    x = embed[tokens] * math.sqrt(c.d_model)
    for i in range(c.depth):
      x = Block(
        c, self.attention, self.temperature, self.qk_input, self.frame_gain, name=f"layer_{i}"
      )(x)
    x = RMSNorm(name="final_norm")(x)
    return jnp.einsum("btd,vd->btv", x, embed)


def logit_bounds(params: Any, config: ModelConfig, qk_input: str = "gained") -> np.ndarray:
  """Each head's largest possible logit ``|l_h| <= B_h``, from the parameters alone.

  ``params`` is the decoder's ``"params"`` tree (plain attention: no QK-norm, no
  σReparam). The input of W_Q, W_K has norm at most ``sqrt(d) rho`` per token, with
  ``rho = 1`` for ``fold`` (``|x / sqrt(mean(x^2) + eps)| < sqrt(d)``) and
  ``rho = max_i |1 + s_i|`` for ``gained``; RoPE is a rotation; so with ``sigma(.)`` the
  largest singular value of a head's effective ``(d, r)`` map (``U_h diag(g_h)`` with a
  frame gain) and ``k(h)`` the key head that query head ``h`` reads::

      B_h = exp(t_h) * d * rho^2 * sigma(W_Q,h) * sigma(W_K,k(h)) / sqrt(r)

  For orthonormal frames without gains, ``sigma = 1`` and ``B_h = exp(t_h) d / sqrt(r)``
  (``fold``). Computed in float64 NumPy (the SVD stays out of compiled programs).

  Returns:
    An array ``(depth, heads)``.
  """
  c = config
  group = c.heads // c.kv_heads
  out = np.zeros((c.depth, c.heads))
  for i in range(c.depth):
    layer = params[f"layer_{i}"]
    attn = layer["attn"]
    wq = np.asarray(attn["q_einsum"]["w"], np.float64)  # (H, d, r)
    wk = np.asarray(attn["kv_einsum"]["w"], np.float64)[0]  # (K, d, r)
    if "q_gain" in attn:
      wq = wq * np.asarray(attn["q_gain"], np.float64).reshape(c.heads, 1, c.head_dim)
      wk = wk * np.asarray(attn["k_gain"], np.float64).reshape(c.kv_heads, 1, c.head_dim)
    sq = np.linalg.svd(wq, compute_uv=False)[:, 0]
    sk = np.linalg.svd(wk, compute_uv=False)[:, 0]
    if qk_input == "fold":
      rho = 1.0
    else:
      rho = float(np.max(np.abs(1.0 + np.asarray(layer["pre_attention_norm"]["scale"]))))
    temp = np.exp(np.asarray(attn.get("temperature", np.zeros(c.heads)), np.float64))
    out[i] = temp * c.d_model * rho**2 * sq * np.repeat(sk, group) / math.sqrt(c.head_dim)
  return out
