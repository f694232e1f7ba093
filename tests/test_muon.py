"""Manifold Muon: the spectral-norm step on St(d, r), against float64 and scipy references."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax import certificates
from stiefax import muon
from tests import reference as ref


def frames_and_grads(rng, shape):
  w = ref.random_frames(rng, shape)
  return w, rng.standard_normal(w.shape)


@pytest.mark.parametrize("d, r, seed", [(6, 2, 0), (8, 3, 1), (12, 4, 2)])
def test_direction_attains_the_independent_scipy_optimum(x64, d, r, seed):
  rng = np.random.default_rng(seed)
  w, g = frames_and_grads(rng, (d, r))
  a_ref, out = certificates.scipy_spectral_step(w, g)
  assert out.success, out.message
  # The reference is feasible: tangent, spectral norm 1 (to its own tolerance).
  assert np.max(np.abs(w.T @ a_ref + a_ref.T @ w)) < 1e-9
  ref_obj = np.sum(g * a_ref) / max(1.0, np.linalg.norm(a_ref, 2))
  sol = muon.spectral_tangent_direction(jnp.asarray(w), jnp.asarray(g), iterations=40)
  a = np.asarray(sol.direction)
  obj = np.sum(g * a)
  assert abs(obj - ref_obj) <= 1e-6 * abs(ref_obj), (obj, ref_obj)
  assert float(sol.gap) < 1e-8
  # Control: the projected gradient scaled into the ball is feasible but not optimal.
  xi = g - w @ ref.sym(w.T @ g)
  assert ref_obj - np.sum(g * xi) / np.linalg.norm(xi, 2) > 1e-3 * ref_obj


@pytest.mark.parametrize("shape", [(3, 16, 4), (2, 9, 3)])
def test_direction_is_tangent_with_spectral_norm_at_most_one(x64, rng, shape):
  for scale in (1e-4, 1.0, 1e4):
    w, g = frames_and_grads(rng, shape)
    for iterations in (1, 10):
      sol = muon.spectral_tangent_direction(
        jnp.asarray(w), jnp.asarray(scale * g), iterations=iterations
      )
      a = np.asarray(sol.direction)
      tangency = np.swapaxes(w, -1, -2) @ a
      assert np.max(np.abs(tangency + np.swapaxes(tangency, -1, -2))) < 1e-12
      assert np.max(np.linalg.norm(a, 2, axis=(-2, -1))) <= 1 + 1e-12
      assert np.all(np.asarray(sol.gap) > -1e-12)


def test_gap_and_residual_shrink_with_iterations(x64, rng):
  w, g = frames_and_grads(rng, (4, 32, 8))
  gaps = [
    float(
      jnp.max(muon.spectral_tangent_direction(jnp.asarray(w), jnp.asarray(g), iterations=k).gap)
    )
    for k in (2, 10, 40)
  ]
  assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-10 < gaps[0]


def test_square_frames_are_solved_by_the_initial_multiplier(x64, rng):
  # d = r: Bernstein's start -sym(W^T G)/2 is already optimal, A = W msign(skew(W^T G)).
  w, g = frames_and_grads(rng, (4, 4))  # even r: skew(W^T G) is invertible
  sol = muon.spectral_tangent_direction(jnp.asarray(w), jnp.asarray(g), iterations=1)
  s = ref.sym(w.T @ g)
  u, _, vt = np.linalg.svd(w.T @ g - s)
  np.testing.assert_allclose(np.asarray(sol.direction), w @ (u @ vt), atol=1e-8)
  assert abs(float(sol.gap)) < 1e-12


def test_update_step_is_tangent_with_spectral_norm_at_most_lr(x64, rng):
  lr = 0.1
  w = jnp.asarray(np.transpose(ref.random_frames(rng, (3, 16, 4)), (1, 0, 2)))
  tx = stiefax.manifold_muon(lr)
  state = tx.init(w)
  for _ in range(3):
    g = jnp.asarray(rng.standard_normal(w.shape))
    u, state = tx.update(g, state, w)
    new = optax.apply_updates(w, u)
    # The polar retraction is undone exactly: the tangent step eta with polar(W+eta) = new.
    eta = certificates._lift(certificates._frames(w), certificates._frames(new))
    wf = certificates._frames(w)
    tangency = np.swapaxes(wf, -1, -2) @ eta
    assert np.max(np.abs(tangency + np.swapaxes(tangency, -1, -2))) < 1e-12
    assert np.max(np.linalg.norm(eta, 2, axis=(-2, -1))) <= lr * (1 + 1e-5)
    assert np.max(np.linalg.norm(eta, 2, axis=(-2, -1))) >= lr * (1 - 1e-5)
    w = new
  assert state.gap.shape == (3,) and state.multiplier.shape == (3, 4, 4)
  assert float(jnp.max(state.residual)) < 1e-3


@pytest.mark.parametrize(
  "retraction, bound, steps",
  [("polar", 2e-6, 200)]
  + [
    pytest.param(r, b, 2000, marks=pytest.mark.slow)  # the same path, ten times longer
    for r, b in (("polar", 2e-6), ("qr", 2e-6), ("cayley", 2e-5))
  ],
)
def test_float32_isometry_over_many_steps(retraction, bound, steps):
  # Polar and QR orthonormalize the point they return; the Cayley transform only
  # rotates it, so its float32 rounding accumulates (about 2e-9 per step here).
  rng = np.random.default_rng(0)
  w0 = jnp.asarray(np.transpose(ref.random_frames(rng, (2, 8, 3)), (1, 0, 2)), jnp.float32)
  a = rng.standard_normal((8, 8))
  a = jnp.asarray(a + a.T, jnp.float32)
  tx = stiefax.manifold_muon(0.05, retraction=retraction)

  @jax.jit
  def run(w, key):
    def body(carry, k):
      w, state = carry
      g = -2 * jnp.einsum("de,ehr->dhr", a, w) + jax.random.normal(k, w.shape)
      u, state = tx.update(g, state, w)
      w = optax.apply_updates(w, u)
      return (w, state), stiefax.diagnostics.isometry_error(w)

    (w, state), errs = jax.lax.scan(body, (w, tx.init(w)), jax.random.split(key, steps))
    return w, state, errs

  w, state, errs = run(w0, jax.random.key(1))
  assert w.dtype == jnp.float32
  assert float(jnp.max(errs)) <= bound, float(jnp.max(errs))
  assert float(jnp.max(jnp.abs(w - w0))) > 0.1  # the frames moved
  assert int(state.count) == steps and int(jnp.sum(state.skipped)) == 0


def test_non_finite_gradient_keeps_params_and_state(rng):
  w = jnp.asarray(np.transpose(ref.random_frames(rng, (2, 10, 3)), (1, 0, 2)), jnp.float32)
  tx = stiefax.manifold_muon(0.1)
  state = tx.init(w)
  g = jnp.asarray(rng.standard_normal(w.shape), jnp.float32)
  _, state = tx.update(g, state, w)
  bad = g.at[0, 1, 0].set(jnp.nan)  # head 1 only
  u, new_state = jax.jit(tx.update)(bad, state, w)
  assert bool(jnp.all(jnp.isfinite(u)))
  assert float(jnp.max(jnp.abs(u[:, 1]))) == 0.0 and float(jnp.max(jnp.abs(u[:, 0]))) > 0
  np.testing.assert_array_equal(new_state.mu[:, 1], state.mu[:, 1])
  np.testing.assert_array_equal(new_state.multiplier[1], state.multiplier[1])
  np.testing.assert_array_equal(new_state.gap[1], state.gap[1])
  assert new_state.skipped.tolist() == [0, 1]
  inf = jnp.full_like(g, jnp.inf)
  u, s2 = tx.update(inf, new_state, w)
  assert float(jnp.max(jnp.abs(u))) == 0.0 and s2.skipped.tolist() == [1, 2]


def test_composes_with_stiefel_adamw_and_schedules():
  import flax.linen as nn  # pylint: disable=g-import-not-at-top

  model = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)
  x = jnp.ones((1, 3, 8))
  params = stiefax.flax.project_params(model.init(jax.random.key(0), x), stiefax.layouts.qk_labels)
  schedule = optax.linear_schedule(0.1, 0.0, 10)
  tx = stiefax.stiefel_adamw(1e-3, stiefel=stiefax.manifold_muon(schedule))
  state = tx.init(params)
  step = jax.jit(
    lambda p, s: tx.update(
      jax.grad(lambda q: jnp.sum(model.apply(q, x * jnp.arange(8.0)[None, None]) ** 2))(p), s, p
    )
  )
  for _ in range(3):
    updates, state = step(params, state)
    params = optax.apply_updates(params, updates)
  assert float(stiefax.diagnostics.isometry_error(params, stiefax.layouts.qk_labels)) < 1e-5


def test_bad_arguments_are_clear_errors(rng):
  with pytest.raises(ValueError, match="Unknown retraction 'exp'"):
    stiefax.manifold_muon(0.1, retraction="exp")
  with pytest.raises(ValueError, match="iterations must be an int >= 1"):
    stiefax.manifold_muon(0.1, iterations=0)
  w = jnp.asarray(np.transpose(ref.random_frames(rng, (2, 10, 3)), (1, 0, 2)))
  tx = stiefax.manifold_muon(0.1)
  with pytest.raises(ValueError, match=r"stiefax\.manifold_muon needs the current point W"):
    tx.update(w, tx.init(w))
  with pytest.raises(ValueError, match=r"not on the\s+Stiefel manifold"):
    tx.init(2 * w)


def test_state_can_be_donated(rng):
  # Every state leaf is its own buffer: a jitted step may donate the state.
  w = jnp.asarray(np.transpose(ref.random_frames(rng, (2, 10, 3)), (1, 0, 2)), jnp.float32)
  tx = stiefax.manifold_muon(0.1)
  g = jnp.ones_like(w)
  _, state = jax.jit(tx.update, donate_argnums=1)(g, tx.init(w), w)
  assert int(state.count) == 1
