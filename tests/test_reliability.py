"""Reliability: non-finite gradients, precision, long runs, checkpoints, properties.

Long runs use a short budget by default; set ``STIEFAX_LONG_TESTS=1`` for the full
20 000-step drift test.
"""

import os
import warnings

from flax import linen as nn
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import tree_utils as otu
import orbax.checkpoint as ocp
import pytest

import stiefax
from tests.kernels import kernel

LONG = bool(os.environ.get("STIEFAX_LONG_TESTS"))
ALL_METHODS = ["auto", "newton_schulz", "eigh", "svd", "qdwh"]


def _skipped(state):
  found = otu.tree_get_all_with_path(state, "skipped")
  return sum(int(jnp.sum(leaf)) for _, x in found for leaf in jax.tree.leaves(x))


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf, -jnp.inf])
@pytest.mark.parametrize(
  "make",
  [
    lambda: stiefax.riemannian_adam(1.0),
    lambda: stiefax.riemannian_adam(0.03, moment="elementwise"),
    lambda: stiefax.riemannian_sgd(0.02),
  ],
  ids=["B2", "elementwise", "sgd"],
)
def test_non_finite_frame_keeps_point_and_moments(rng, bad, make):
  tx = make()
  w = kernel(rng, dtype=np.float32)
  state = tx.init(w)
  g = jnp.asarray(rng.standard_normal(w.shape), jnp.float32)
  _, state = tx.update(g, state, w)  # one clean step so the moments are non-zero
  g_bad = g.at[3, 1, 2].set(bad)  # one entry of head 1
  updates, new_state = jax.jit(tx.update)(g_bad, state, w)
  new_w = optax.apply_updates(w, updates)
  np.testing.assert_array_equal(new_w[:, 1, :], w[:, 1, :])  # frame 1 keeps its point
  assert float(jnp.max(jnp.abs(new_w[:, 0, :] - w[:, 0, :]))) > 0  # others move
  assert float(jnp.max(jnp.abs(new_w[:, 2, :] - w[:, 2, :]))) > 0
  for name in ("mu", "nu"):
    for (_, old), (_, new) in zip(
      otu.tree_get_all_with_path(state, name), otu.tree_get_all_with_path(new_state, name)
    ):
      head = (lambda x: x[:, 1]) if old.ndim == 3 else (lambda x: x[1])
      np.testing.assert_array_equal(head(new), head(old))
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(new_state))
  assert _skipped(new_state) == 1 and _skipped(state) == 0


def test_non_finite_inside_stiefel_adamw_and_apply_if_finite(rng):
  params = {
    "query": {"kernel": kernel(rng, dtype=np.float32)},
    "dense": {"kernel": jnp.ones((4, 4))},
  }
  grads = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), params)
  bad = {
    "query": {"kernel": grads["query"]["kernel"].at[0, 2, 0].set(jnp.nan)},
    "dense": grads["dense"],
  }
  tx = stiefax.stiefel_adamw(1e-2, weight_decay=0.1)
  u, state = tx.update(bad, tx.init(params), params)
  new = optax.apply_updates(params, u)
  np.testing.assert_array_equal(new["query"]["kernel"][:, 2], params["query"]["kernel"][:, 2])
  assert bool(jnp.all(jnp.isfinite(new["query"]["kernel"])))
  assert _skipped(state) == 1
  # Whole-step skipping composes on top: nothing moves, the error is counted.
  guarded = optax.apply_if_finite(
    stiefax.stiefel_adamw(1e-2, weight_decay=0.1), max_consecutive_errors=5
  )
  gstate = guarded.init(params)
  u, gstate = jax.jit(guarded.update)(bad, gstate, params)
  assert all(bool(jnp.all(x == 0)) for x in jax.tree.leaves(u))
  assert int(gstate.notfinite_count) == 1
  u, gstate = jax.jit(guarded.update)(grads, gstate, params)
  assert int(gstate.notfinite_count) == 0
  assert (
    float(
      stiefax.diagnostics.isometry_error(optax.apply_updates(params, u), stiefax.layouts.qk_labels)
    )
    < 1e-5
  )


@pytest.mark.parametrize("dtype, bound", [(jnp.bfloat16, 1e-2), (jnp.float16, 1.5e-3)])
def test_low_precision_keeps_dtype_and_orthonormality(dtype, bound):
  w0 = stiefax.flax.orthonormal_init()(jax.random.key(0), (64, 4, 16), dtype)
  tx = stiefax.riemannian_adam(1.0)
  steps = 1000

  @jax.jit
  def train(w):
    def body(carry, key):
      w, s = carry
      u, s = tx.update(jax.random.normal(key, w.shape, dtype), s, w)
      assert u.dtype == dtype
      return (optax.apply_updates(w, u), s), stiefax.diagnostics.isometry_error(w)

    return jax.lax.scan(body, (w, tx.init(w)), jax.random.split(jax.random.key(1), steps))

  (w, state), iso = train(w0)
  assert w.dtype == dtype
  # As orthonormal as the storage allows: within a small factor of a freshly rounded frame.
  storage = float(stiefax.diagnostics.isometry_error(w0))
  assert float(iso.max()) <= max(bound, 3 * storage)
  assert float(stiefax.diagnostics.isometry_error(w)) <= max(bound, 3 * storage)
  assert float(jnp.max(jnp.abs(w.astype(jnp.float32) - w0.astype(jnp.float32)))) > 0.1
  assert all(bool(jnp.all(jnp.isfinite(x.astype(jnp.float32)))) for x in jax.tree.leaves(state))


def test_float64_params_stay_float64(x64, rng):
  w = kernel(rng)
  tx = stiefax.riemannian_adam(1.0)
  u, _state = tx.update(jnp.ones_like(w), tx.init(w), w)
  assert u.dtype == jnp.float64
  assert float(stiefax.diagnostics.isometry_error(optax.apply_updates(w, u))) < 1e-13


@pytest.mark.parametrize(
  "r",
  [16] + [pytest.param(r, marks=pytest.mark.slow) for r in (32, 64)],  # larger frames
)
@pytest.mark.parametrize("method", ALL_METHODS if LONG else ["auto", "eigh"])
def test_no_drift_over_long_float32_runs(r, method):
  steps = 20_000 if LONG else 300
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    tx = stiefax.riemannian_adam(1.0, method=method)
  w0 = stiefax.flax.orthonormal_init()(jax.random.key(r), (128, 2, r))

  @jax.jit
  def train(w):
    def body(carry, key):
      w, s = carry
      g = jax.random.normal(key, w.shape) * jnp.exp(2 * jax.random.normal(key, ()))
      u, s = tx.update(g, s, w)
      return (optax.apply_updates(w, u), s), None

    (w, _), _ = jax.lax.scan(body, (w, tx.init(w)), jax.random.split(jax.random.key(0), steps))
    return w

  w = train(w0)
  assert float(stiefax.diagnostics.isometry_error(w)) <= 2e-5
  assert float(jnp.max(jnp.abs(w - w0))) > 0.1


class _Tiny(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = x + nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)(nn.LayerNorm()(x))
    return nn.Dense(2)(h.mean(1))


def test_orbax_checkpoint_resumes_bit_identically(tmp_path):
  model = _Tiny()
  x = jax.random.normal(jax.random.key(0), (16, 4, 8))
  y = (x[:, 0, 0] > 0).astype(jnp.int32)
  params = stiefax.flax.project_params(model.init(jax.random.key(1), x))
  tx = stiefax.stiefel_adamw(
    1e-2, weight_decay=0.05, stiefel=stiefax.riemannian_adam(optax.cosine_decay_schedule(1.0, 20))
  )

  @jax.jit
  def step(params, state):
    g = jax.grad(
      lambda p: optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
    )(params)
    u, state = tx.update(g, state, params)
    return optax.apply_updates(params, u), state

  p, s = params, tx.init(params)
  for _ in range(5):
    p, s = step(p, s)
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "ckpt", {"params": p, "opt_state": s})
  ckpt.wait_until_finished()
  for _ in range(5):  # the uninterrupted run
    p, s = step(p, s)

  target = {"params": params, "opt_state": tx.init(params)}
  restored = ckpt.restore(tmp_path / "ckpt", jax.tree.map(ocp.utils.to_shape_dtype_struct, target))
  assert jax.tree.structure(restored["opt_state"]) == jax.tree.structure(s)
  rp, rs = restored["params"], restored["opt_state"]
  for _ in range(5):
    rp, rs = step(rp, rs)
  for a, b in zip(jax.tree.leaves((p, s)), jax.tree.leaves((rp, rs))):
    np.testing.assert_array_equal(a, b)


_SHAPES_SCALES_DTYPES = dict(
  d=st.integers(2, 10),
  r_frac=st.floats(0.1, 1.0),
  batch=st.lists(st.integers(1, 3), min_size=0, max_size=2),
  log_scale=st.floats(-8, 8),
  dtype=st.sampled_from(["float32", "float64"]),
  moment=st.sampled_from(["scalar", "elementwise"]),
)


@hypothesis.settings(max_examples=4, deadline=None, derandomize=True)
@hypothesis.given(**_SHAPES_SCALES_DTYPES)
def test_properties_over_shapes_scales_and_dtypes(d, r_frac, batch, log_scale, dtype, moment):
  _check_properties(d, r_frac, batch, log_scale, dtype, moment)


@pytest.mark.slow  # the same check over three times as many drawn shapes
@hypothesis.settings(max_examples=12, deadline=None, derandomize=True)
@hypothesis.given(**_SHAPES_SCALES_DTYPES)
def test_properties_over_more_shapes_scales_and_dtypes(d, r_frac, batch, log_scale, dtype, moment):
  _check_properties(d, r_frac, batch, log_scale, dtype, moment)


def _check_properties(d, r_frac, batch, log_scale, dtype, moment):
  r = max(1, round(r_frac * d))
  shape = (d, *batch, r)  # rows first, batch axes in the middle
  with jax.enable_x64(dtype == "float64"):
    tx = stiefax.riemannian_adam(1.0, moment=moment)
    w = jnp.asarray(ref_frames(shape), dtype)

    @jax.jit
    def three_steps(w):
      state = tx.init(w)
      skew, finite = [], []
      for i in range(3):
        g = (10.0**log_scale) * jax.random.normal(jax.random.key(i), shape, dtype)
        xi, _ = stiefax.stiefel_project().update(g, optax.EmptyState(), w)
        skew.append(
          stiefax.diagnostics.tangency_error(w, xi) / jnp.maximum(1, jnp.max(jnp.abs(xi)))
        )
        u, state = tx.update(g, state, w)
        w = optax.apply_updates(w, u)
        finite.append(
          jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves((w, state))]))
        )
      return w, jnp.max(jnp.stack(skew)), jnp.all(jnp.stack(finite))

    w, skew, finite = three_steps(w)
    tol = 1e-12 if dtype == "float64" else 2e-5
    assert w.dtype == jnp.dtype(dtype)
    assert bool(finite)
    assert float(skew) <= tol
    assert float(stiefax.diagnostics.isometry_error(w)) <= 5 * tol


def ref_frames(shape):
  """Orthonormal frames in the (d, *batch, r) layout, drawn in float64 NumPy."""
  d, r = shape[0], shape[-1]
  batch = shape[1:-1]
  a = np.random.default_rng(d * 31 + r).standard_normal((*batch, d, r))
  q, rr = np.linalg.qr(a)
  q = q * np.sign(np.diagonal(rr, axis1=-2, axis2=-1))[..., None, :]
  return np.moveaxis(q, -2, 0)
