"""``stiefax.flax.QKNorm`` and ``NnxQKNorm``: the QK-norm of the A2-qknorm arm, public."""

from flax import nnx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stiefax
from stiefax.experiments.lm import config as lm_config
from stiefax.experiments.lm.model import Attention


def _qk(dtype=jnp.float32):
  q = 3.0 * jax.random.normal(jax.random.key(0), (2, 7, 4, 8), dtype) + 1.0
  k = jax.random.normal(jax.random.key(1), (2, 7, 2, 8), dtype) - 2.0
  return q, k


def test_the_formula_in_float64(x64):
  q, k = _qk(jnp.float64)
  norm = stiefax.flax.QKNorm()
  v = norm.init(jax.random.key(0), q, k)
  gq = np.linspace(0.5, 2.0, 8)
  v = {"params": {"query_ln": {"scale": jnp.asarray(gq)}, "key_ln": {"scale": jnp.asarray(-gq)}}}
  qn, kn = norm.apply(v, q, k)
  for x, y, g in ((q, qn, gq), (k, kn, -gq)):
    x = np.asarray(x)
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6) * g
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def test_linen_and_nnx_match_each_other_and_the_arm():
  q, k = _qk()
  linen = stiefax.flax.QKNorm()
  v = linen.init(jax.random.key(0), q, k)
  s = jnp.linspace(0.5, 1.5, 8)
  v = {"params": {"query_ln": {"scale": s}, "key_ln": {"scale": 2 * s}}}
  a = linen.apply(v, q, k)
  mod = stiefax.flax.NnxQKNorm(8, rngs=nnx.Rngs(0))
  mod.query_ln.scale[...] = s
  mod.key_ln.scale[...] = 2 * s
  b = mod(q, k)
  arm_q = nn.LayerNorm(use_bias=False).apply({"params": {"scale": s}}, q)  # A2-qknorm's norm
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(a[0], arm_q, rtol=1e-6, atol=1e-6)
  # The LM arm's parameters have the block's names and shapes.
  c = lm_config.PRESETS["quick"].model
  attn = Attention(c, "qknorm")
  params = jax.eval_shape(attn.init, jax.random.key(0), jnp.zeros((1, 4, c.d_model)))["params"]
  mine = linen.init(jax.random.key(0), *_qk())["params"]
  assert {k: v["scale"].shape[0] for k, v in params.items() if k.endswith("_ln")} == {
    k: c.head_dim for k in mine
  }


def test_low_precision_keeps_its_dtype():
  q, k = _qk(jnp.bfloat16)
  norm = stiefax.flax.QKNorm(dtype=jnp.bfloat16)
  v = norm.init(jax.random.key(0), q, k)
  assert v["params"]["query_ln"]["scale"].dtype == jnp.float32
  qn, kn = norm.apply(v, q, k)
  assert qn.dtype == kn.dtype == jnp.bfloat16
  assert stiefax.flax.NnxQKNorm(8, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))(q, k)[0].dtype == q.dtype
  np.testing.assert_allclose(np.asarray(jnp.std(qn.astype(jnp.float32), -1)), 1.0, atol=2e-2)


def test_different_head_sizes_are_a_one_line_error():
  q, k = _qk()
  with pytest.raises(ValueError, match=r"QKNorm: q and k must share the head size"):
    stiefax.flax.QKNorm().init(jax.random.key(0), q, k[..., :4])
  with pytest.raises(ValueError, match=r"QKNorm: q and k must share the head size"):
    stiefax.flax.NnxQKNorm(8, rngs=nnx.Rngs(0))(q, k[..., :4])


def test_the_how_to_block_trains_frames_and_scales_apart():
  """The QK module of docs/howto/your-model.md: its frames are found by name and stay
  orthonormal under stiefel_adamw, and the norm's scales move as AdamW parameters."""
  import optax

  class QK(nn.Module):
    @nn.compact
    def __call__(self, x):
      init = stiefax.flax.orthonormal_init()
      q = nn.DenseGeneral((4, 8), use_bias=False, kernel_init=init, name="query")(x)
      key = nn.DenseGeneral((2, 8), use_bias=False, kernel_init=init, name="key")(x)
      return stiefax.flax.QKNorm()(q, key)

  x = jax.random.normal(jax.random.key(0), (3, 5, 32))
  model = QK()
  params = model.init(jax.random.key(1), x)
  labels = stiefax.layouts.qk_labels(params)["params"]
  assert labels["query"]["kernel"] == labels["key"]["kernel"] == "stiefel"
  assert labels["QKNorm_0"]["query_ln"]["scale"] != "stiefel"
  tx = stiefax.stiefel_adamw(1e-2)
  state = tx.init(params)

  def loss(p):
    q, k = model.apply(p, x)
    return jnp.sum(jnp.einsum("bthr,bshr->bhts", q[:, :, :2], k) ** 2)

  @jax.jit
  def step(params, state):
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, updates), state

  for _ in range(3):
    params, state = step(params, state)
  assert stiefax.diagnostics.isometry_error(params) < 1e-5
  assert not np.allclose(params["params"]["QKNorm_0"]["query_ln"]["scale"], 1.0)
