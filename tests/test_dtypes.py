"""Frame dtypes: 16-bit frames, mixed precision, and clear errors for the rest."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax

SHAPE = (32, 2, 8)  # (d_model, heads, head_dim)


def _tree(dtype, make):
  return {
    "attn": {
      "query": {"kernel": make(0, dtype)},
      "key": {"kernel": make(1, dtype)},
      "value": {"kernel": jnp.ones(SHAPE, dtype)},
    },
    "out": {"kernel": jnp.ones((SHAPE[0], SHAPE[0]), dtype), "bias": jnp.zeros(SHAPE[0], dtype)},
  }


def _orthonormal(i, dtype):
  return stiefax.flax.orthonormal_init()(jax.random.key(i), SHAPE, dtype)


def _gaussian(i, dtype):
  return jax.random.normal(jax.random.key(10 + i), SHAPE, dtype)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_16bit_frames_pass_eager_init(dtype):
  for params in (_tree(dtype, _orthonormal), stiefax.flax.project_params(_tree(dtype, _gaussian))):
    # The rounding is real (above the float32 tolerance for bfloat16) ...
    err = float(stiefax.diagnostics.isometry_error(params, stiefax.layouts.qk_labels))
    assert 0 < err < 4 * float(jnp.finfo(dtype).eps)
    stiefax.stiefel_adamw(1e-3, weight_decay=0.05).init(params)  # ... and init accepts it eagerly.
  # The float32 tolerance, asked for explicitly, rejects bfloat16 rounding.
  if dtype == jnp.bfloat16:
    strict = stiefax.stiefel_adamw(
      1e-3, weight_decay=0.05, stiefel=stiefax.riemannian_adam(1.0, init_tol=1e-3)
    )
    with pytest.raises(ValueError, match=r"\['attn'\]\['(query|key)'\]\['kernel'\].*bfloat16"):
      strict.init(_tree(dtype, _orthonormal))


def test_init_tolerance_scales_with_dtype_and_can_be_overridden():
  w = np.asarray(_orthonormal(0, jnp.float32))
  w = w * np.float32(1.002)  # max|W^T W - I| = 0.004
  with pytest.raises(ValueError, match=r"0\.004.* > 0\.001"):
    stiefax.riemannian_adam(1.0).init(jnp.asarray(w))
  stiefax.riemannian_adam(1.0, init_tol=1e-2).init(jnp.asarray(w))
  stiefax.riemannian_adam(1.0).init(jnp.asarray(w, jnp.bfloat16))  # bfloat16: 0.031
  with pytest.raises(ValueError, match=r"> 0\.031"):
    stiefax.riemannian_adam(1.0).init(jnp.asarray(w * 1.03, jnp.bfloat16))


def test_nnx_bfloat16_attention_with_orthonormal_init_builds_an_optimizer():
  model = nnx.MultiHeadAttention(
    num_heads=2,
    in_features=16,
    decode=False,
    rngs=nnx.Rngs(0),
    param_dtype=jnp.bfloat16,
    kernel_init=stiefax.flax.orthonormal_init(),
  )
  nnx.Optimizer(model, stiefax.stiefel_adamw(1e-3, weight_decay=0.05), wrt=nnx.Param)  # eager init


@pytest.mark.timeout(120)
def test_100_bfloat16_steps_keep_frames_at_bfloat16_rounding():
  params = _tree(jnp.bfloat16, _orthonormal)
  tx = stiefax.stiefel_adamw(1e-3, weight_decay=0.05)
  state = tx.init(params)

  @jax.jit
  def train(params, state):
    def body(carry, key):
      params, state = carry
      grads = jax.tree.map(lambda x: jax.random.normal(key, x.shape, x.dtype), params)
      updates, state = tx.update(grads, state, params)
      return (optax.apply_updates(params, updates), state), None

    return jax.lax.scan(body, (params, state), jax.random.split(jax.random.key(2), 100))[0]

  new, _ = train(params, state)
  q = new["attn"]["query"]["kernel"]
  assert q.dtype == jnp.bfloat16
  assert float(stiefax.diagnostics.isometry_error(new, stiefax.layouts.qk_labels)) <= 1e-2
  moved = jnp.max(jnp.abs(q.astype(jnp.float32) - params["attn"]["query"]["kernel"]))
  assert float(moved) > 0.1


@pytest.mark.parametrize("fused", [True, False])
def test_float32_frames_with_bfloat16_gradients_keep_float32_isometry(fused):
  w = _orthonormal(0, jnp.float32)
  tx = stiefax.riemannian_adam(1.0, fused=fused)
  state = tx.init(w)

  @jax.jit
  def train(w, state):
    def body(carry, key):
      w, state = carry
      u, state = tx.update(jax.random.normal(key, w.shape, jnp.bfloat16), state, w)
      return (optax.apply_updates(w, u), state), u.dtype == jnp.float32

    return jax.lax.scan(body, (w, state), jax.random.split(jax.random.key(3), 300))

  (new, _), _ = train(w, state)
  u, _ = tx.update(jnp.ones(w.shape, jnp.bfloat16), state, w)
  assert u.dtype == jnp.float32  # updates in the parameter's dtype
  assert float(stiefax.diagnostics.isometry_error(new)) <= 2e-6
  assert float(jnp.max(jnp.abs(new - w))) > 0.1


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.complex64, jnp.bool_])
def test_integer_and_complex_frames_raise_naming_path_and_dtype(dtype):
  params = {
    "attn": {
      "query": {"kernel": jnp.ones(SHAPE, dtype)},
      "key": {"kernel": _orthonormal(1, jnp.float32)},
    }
  }
  name = jnp.dtype(dtype).name
  where = r"\['attn'\]\['query'\]\['kernel'\]"
  with pytest.raises(ValueError, match=rf"{where}.*{name}"):
    stiefax.stiefel_adamw(1e-3).init(params)
  with pytest.raises(ValueError, match=rf"{where}.*{name}"):
    stiefax.flax.project_params(params)
  with pytest.raises(ValueError, match=rf"{where}.*{name}"):
    stiefax.diagnostics.isometry_error(params, stiefax.layouts.qk_labels)


def test_zero_size_and_shape_errors_name_the_path():
  where = r"\['blocks'\]\['0'\]\['query'\]\['kernel'\]"
  for shape in [(0, 2, 8), (32, 0, 8), (32, 2, 0)]:
    params = {"blocks": {"0": {"query": {"kernel": jnp.ones(shape)}}}}
    with pytest.raises(ValueError, match=rf"{where}.*zero-size"):
      stiefax.riemannian_adam(1.0).init(params)
  wide = {"blocks": {"0": {"query": {"kernel": jnp.ones((4, 2, 8))}}}}
  with pytest.raises(ValueError, match=rf"{where}.*r <= d"):
    stiefax.riemannian_adam(1.0).init(wide)
  with pytest.raises(ValueError, match=rf"{where}.*does not exist"):
    stiefax.riemannian_adam(1.0, frames=stiefax.FrameSpec(row_axis=5)).init(wide)
