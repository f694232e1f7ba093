"""The attention of the experiment models: plain, QK-norm or σReparam, and its probe.

An arm's ``attention`` (:class:`stiefax.experiments.arms.Arm`) picks how the query/key
maps enter the attention logits ``q·k / sqrt(r)`` of every head (width ``r``):

  plain    Flax ``MultiHeadDotProductAttention``: ``q = W_Q^T x + b``.
  qknorm   the same module with ``normalize_qk=True``: each head's ``q`` and ``k`` go
           through a LayerNorm over their ``r`` features, without bias, with a learnable
           scale of shape ``(r,)`` (one per projection, shared by the heads). This is
           the QK-layernorm of ViT-22B (Dehghani et al. 2023) and of Wortsman et al.
           2023 ("Small-scale proxies for large-scale Transformer training
           instabilities"), exactly as a Flax user gets it.
  sigma    σReparam (Zhai et al. 2023, "Stabilizing Transformer Training by Preventing
           Attention Entropy Collapse") on W_Q and W_K: the layer uses
           ``W_hat = (gamma / sigma(W)) W``, with ``W`` the ``(d, H r)`` kernel, ``gamma`` a
           learned scalar initialised to ``sigma(W_0)`` (so ``W_hat = W`` at init), and
           ``sigma`` one power-iteration step per training forward pass from the stored
           right vector ``u`` (``v = W u / |W u|``, ``u' = W^T v / |W^T v|``,
           ``sigma = v^T W u'``, no gradient through ``u, v``), as the reference code
           does. ``u`` is a non-trained state in the ``sigma_reparam`` variable
           collection; a training step advances it (:func:`apply_train`), evaluation
           reads it without storing.

Values and the output projection are the same ``DenseGeneral`` layers in every variant,
and the parameter names (``query``, ``key``, ``value``, ``out``) are the same, so an
arm's non-frame init depends on the seed only.

:func:`probe` measures what the variants are meant to control, on a fixed batch: the
largest attention logit ``max |q·k| / sqrt(r)`` and the mean attention entropy
``-sum_j p_ij log p_ij`` over layers, examples, heads and queries.
"""

from __future__ import annotations

import functools
import math
from typing import Any
from typing import Callable
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

__all__ = [
  "ATTENTION",
  "SIGMA_COLLECTION",
  "SigmaReparamDense",
  "SigmaReparamAttention",
  "attention_module",
  "has_state",
  "apply_train",
  "with_state",
  "freeze_state",
  "probe",
  "probe_fn",
  "spectral_norm_step",
  "top_vector",
]

#: The attention variants an arm can ask for.
ATTENTION = ("plain", "qknorm", "sigma")

#: The variable collection of σReparam's power-iteration vectors (never trained).
SIGMA_COLLECTION = "sigma_reparam"

_INIT_POWER_STEPS = 100


def _normalize(x: jax.Array) -> jax.Array:
  return x / jnp.maximum(jnp.linalg.norm(x), jnp.finfo(x.dtype).tiny)


def spectral_norm_step(w2d: jax.Array, u: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One power-iteration step on the ``(d_in, d_out)`` kernel ``w2d`` from ``u`` in R^d_in.

  Returns ``(sigma, u')``: ``v = normalize(w2d^T u)``, ``u' = normalize(w2d v)``,
  ``sigma = u'^T w2d v``. ``u, v`` carry no gradient; ``sigma`` does, through ``w2d``
  (the estimate Zhai et al. differentiate).
  """
  u = jax.lax.stop_gradient(u)
  w_ = jax.lax.stop_gradient(w2d)
  v = _normalize(w_.T @ u)
  u_new = _normalize(w_ @ v)
  return u_new @ w2d @ v, u_new


def top_vector(w2d: jax.Array) -> jax.Array:
  """The top right singular vector (in R^d_in) by power iteration: no LAPACK call."""
  u0 = _normalize(jnp.ones(w2d.shape[:1], w2d.dtype))
  return jax.lax.fori_loop(0, _INIT_POWER_STEPS, lambda _, u: spectral_norm_step(w2d, u)[1], u0)


class SigmaReparamDense(nn.Module):
  """``x -> x W_hat + b`` over the last axis, ``W_hat = (gamma / sigma(W)) W`` (σReparam).

  ``W`` has shape ``(d, *features)`` and is normalised as the ``(d, prod(features))``
  matrix; ``gamma`` is a learned scalar initialised to the kernel's spectral norm.
  """

  features: tuple[int, ...]
  kernel_init: Callable = nn.linear.default_kernel_init
  use_bias: bool = True

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d = x.shape[-1]
    # As Flax's DenseGeneral: the init sees the (d, prod(features)) matrix.
    kernel = self.param(
      "kernel",
      lambda key: self.kernel_init(key, (d, math.prod(self.features)), jnp.float32).reshape(
        d, *self.features
      ),
    )
    w2d = kernel.reshape(d, -1)
    u_var = self.variable(SIGMA_COLLECTION, "u", lambda: top_vector(w2d))
    gamma = self.param("gamma", lambda _: spectral_norm_step(w2d, u_var.value)[0])
    sigma, u_new = spectral_norm_step(w2d, u_var.value)
    if self.is_mutable_collection(SIGMA_COLLECTION) and not self.is_initializing():
      u_var.value = u_new
    y = _contract(x, kernel)
    y = y * (gamma / sigma).astype(y.dtype)
    if self.use_bias:
      bias = self.param("bias", nn.initializers.zeros_init(), self.features, jnp.float32)
      y = y + bias.reshape((1,) * (y.ndim - bias.ndim) + bias.shape)
    return y


def _contract(x: jax.Array, kernel: jax.Array) -> jax.Array:
  return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


class SigmaReparamAttention(nn.Module):
  """Flax ``MultiHeadDotProductAttention`` with σReparam on the query and key kernels.

  Same parameter names, shapes and inits as the Flax module (bias zeros), plus
  ``query/gamma``, ``key/gamma`` and the ``sigma_reparam`` state.
  """

  num_heads: int
  qkv_features: int
  out_features: int
  kernel_init: Callable = nn.linear.default_kernel_init
  deterministic: bool = True

  @nn.compact
  def __call__(self, x: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    h = self.num_heads
    r = self.qkv_features // h
    q = SigmaReparamDense((h, r), self.kernel_init, name="query")(x)
    k = SigmaReparamDense((h, r), self.kernel_init, name="key")(x)
    v = nn.DenseGeneral((h, r), kernel_init=self.kernel_init, name="value")(x)
    y = nn.dot_product_attention(q, k, v, mask=mask)
    return nn.DenseGeneral(
      self.out_features, axis=(-2, -1), kernel_init=self.kernel_init, name="out"
    )(y)


def attention_module(attention: str, **kwargs: Any) -> nn.Module:
  """The attention layer of variant ``attention`` (:data:`ATTENTION`).

  ``kwargs`` are those of Flax ``MultiHeadDotProductAttention`` (``num_heads``,
  ``qkv_features``, ``out_features``, ``kernel_init``, ``deterministic``, ``name``).
  """
  if attention == "plain":
    return nn.MultiHeadDotProductAttention(**kwargs)
  if attention == "qknorm":
    return nn.MultiHeadDotProductAttention(normalize_qk=True, **kwargs)
  if attention == "sigma":
    return SigmaReparamAttention(**kwargs)
  raise ValueError(f"attention={attention!r}; choose from {', '.join(ATTENTION)}")


def has_state(variables: Any) -> bool:
  """Whether ``variables`` holds non-trained state that a training step advances."""
  return isinstance(variables, dict) and SIGMA_COLLECTION in variables


def apply_train(model: nn.Module, variables: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
  """``(output, state)``: a training forward pass and the state it leaves.

  ``state`` is the ``sigma_reparam`` collection after one power-iteration step, or
  ``None`` for a model without state (then the call is exactly ``model.apply``).
  """
  if not has_state(variables):
    return model.apply(variables, *args, **kwargs), None
  out, new = model.apply(variables, *args, mutable=[SIGMA_COLLECTION], **kwargs)
  return out, jax.lax.stop_gradient(new[SIGMA_COLLECTION])


def with_state(variables: Any, state: Any) -> Any:
  """``variables`` with its state collection replaced by ``state`` (``None``: unchanged)."""
  if state is None:
    return variables
  return {**variables, SIGMA_COLLECTION: state}


def freeze_state(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """``tx`` on the trained variables, ``optax.set_to_zero`` on the state collection."""

  def labels(variables: Any) -> dict[str, str]:
    return {k: ("state" if k == SIGMA_COLLECTION else "train") for k in variables}

  return optax.partition({"train": tx, "state": optax.set_to_zero()}, labels)


_QK_NAMES = ("query", "key", "query_ln", "key_ln")


def _captured(tree: Any, prefix: tuple = ()) -> dict:
  """``{path: output}`` of every captured ``query``/``key``(``_ln``) module call."""
  found = {}
  if isinstance(tree, dict):
    for k, v in tree.items():
      if k == "__call__":
        found[prefix] = v[0]
      else:
        found.update(_captured(v, (*prefix, k)))
  return found


def probe(
  model: nn.Module,
  variables: Any,
  *args: Any,
  causal: bool = False,
  **kwargs: Any,
) -> dict[str, jax.Array]:
  """``{"max_logit", "entropy"}`` of every attention layer of ``model`` on one batch.

  Reads each layer's queries and keys as they enter the logits (after the QK-norm
  where there is one), by Flax's ``capture_intermediates``; ``causal`` masks keys after
  the query. Works under ``jit``.
  """
  _, inter = model.apply(
    variables,
    *args,
    capture_intermediates=lambda mdl, _: mdl.name in _QK_NAMES,
    mutable=["intermediates"],
    **kwargs,
  )
  out = _captured(inter["intermediates"])
  layers = sorted({p[:-1] for p in out if p[-1] in ("query", "key")})
  max_logit = jnp.zeros([], jnp.float32)
  entropies = []
  for layer in layers:
    q = out.get(layer + ("query_ln",), out[layer + ("query",)])
    k = out.get(layer + ("key_ln",), out[layer + ("key",)])
    logits = jnp.einsum("...qhr,...khr->...hqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    logits = logits.astype(jnp.float32)
    if causal:
      n = logits.shape[-1]
      allowed = jnp.tril(jnp.ones((n, n), bool))
      max_logit = jnp.maximum(max_logit, jnp.max(jnp.where(allowed, jnp.abs(logits), 0.0)))
      logits = jnp.where(allowed, logits, -jnp.inf)
    else:
      max_logit = jnp.maximum(max_logit, jnp.max(jnp.abs(logits)))
    logp = jax.nn.log_softmax(logits, axis=-1)
    p = jnp.exp(logp)
    entropies.append(jnp.mean(-jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)))
  entropy = jnp.mean(jnp.stack(entropies)) if entropies else jnp.zeros([], jnp.float32)
  return {"max_logit": max_logit, "entropy": entropy}


@functools.lru_cache(maxsize=32)
def probe_fn(model: nn.Module, causal: bool = False) -> Callable[..., dict[str, jax.Array]]:
  """Jitted ``(variables, x) -> probe(model, variables, x)``."""
  return jax.jit(lambda v, x: probe(model, v, x, causal=causal))
