"""The sphere (hyperball) transforms: each frame kept on its own sphere."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax import sphere

D, H, R = 6, 2, 3  # (d_model, heads, head_dim)


def frame_norms(w):
  return jnp.sqrt(jnp.sum(w * w, axis=(0, 2)))


@pytest.mark.parametrize(
  "name", ["sphere_project", "sphere_retract", "sphere_moment", "sphere_adam"]
)
def test_sphere_update_without_params_is_a_clear_error(name):
  tx = {
    "sphere_project": stiefax.sphere.sphere_project,
    "sphere_retract": stiefax.sphere.sphere_retract,
    "sphere_moment": sphere.sphere_moment,
    "sphere_adam": lambda: stiefax.sphere.sphere_adam(1.0),
  }[name]()
  w = jnp.ones((4, 2, 3))
  first = "sphere_project" if name == "sphere_adam" else name  # the chain's first step
  with pytest.raises(ValueError, match=rf"stiefax.{first} needs the current point W"):
    tx.update(w, tx.init(w))


def test_sphere_adam_refuses_a_frame_of_norm_0_at_init_naming_its_leaf():
  """Head 1 of ``q`` is zero: with radius=None its sphere has radius 0, and with
  relative=True its step is scaled by its norm, 0; either way it would stay at 0
  whatever the gradient, so it is refused unless a radius is given with
  relative=False, which puts it on that sphere at the first step."""
  w = jnp.ones((D, H, R)).at[:, 1, :].set(0.0)
  params = {"attn": {"q": w}, "bias": jnp.ones((D,))}
  with pytest.raises(
    ValueError, match=r"stiefax.sphere.sphere_adam: a frame of \['attn'\]\['q'\] has norm 0"
  ) as e:
    sphere.sphere_adam(0.1).init(params)
  assert "\n" not in str(e.value) and "(its sphere keeps radius 0)" in str(e.value)
  with pytest.raises(ValueError, match=r"a frame of \['bias'\] has norm 0"):
    sphere.sphere_adam(0.1).init({"bias": jnp.zeros((D,))})  # a vector is one frame
  with pytest.raises(ValueError, match="its step is relative to its norm"):
    sphere.sphere_adam(0.1, radius=2.0).init(params)
  jax.jit(sphere.sphere_adam(0.1).init)(params)  # traced: nothing known to refuse
  tx = sphere.sphere_adam(0.1, radius=2.0, relative=False)
  g = jax.tree.map(jnp.ones_like, params)
  new = optax.apply_updates(params, tx.update(g, tx.init(params), params)[0])
  np.testing.assert_allclose(frame_norms(new["attn"]["q"]), [2.0, 2.0], rtol=1e-5)


def test_hyperball_keeps_each_frame_norm_over_many_steps(x64, rng):
  w0 = jnp.asarray(rng.standard_normal((D, H, R))) * jnp.array([1.0, 7.0])[None, :, None]
  vec = jnp.asarray(rng.standard_normal((5,)))
  params = {"w": w0, "v": vec}
  loss = lambda p: jnp.sum(jnp.sin(p["w"])) + jnp.sum(jnp.cos(3 * p["v"]))
  tx = stiefax.sphere.sphere_adam(0.3, max_norm=None)
  state = tx.init(params)
  p = params
  step = jax.jit(lambda p, s: tx.update(jax.grad(loss)(p), s, p))
  for _ in range(60):
    u, state = step(p, state)
    p = optax.apply_updates(p, u)
  assert float(jnp.max(jnp.abs(frame_norms(p["w"]) - frame_norms(w0)))) < 1e-12
  assert abs(float(jnp.linalg.norm(p["v"]) - jnp.linalg.norm(vec))) < 1e-12
  assert float(jnp.max(jnp.abs(p["w"] - w0))) > 0.1  # it moved
  # Control: the same steps without the retraction leave the sphere.
  drift = optax.chain(
    *[stiefax.sphere.sphere_project(), sphere.sphere_moment(), optax.scale_by_learning_rate(0.3)]
  )
  s, q = drift.init(params), params
  for _ in range(10):
    u, s = drift.update(jax.grad(loss)(q), s, q)
    q = optax.apply_updates(q, u)
  assert float(jnp.max(jnp.abs(frame_norms(q["w"]) - frame_norms(w0)))) > 1e-3


def test_sphere_retract_radius_none_vs_given(x64, rng):
  w = jnp.asarray(rng.standard_normal((D, H, R))) * jnp.array([1.0, 3.0])[None, :, None]
  g = 0.2 * jnp.asarray(rng.standard_normal(w.shape))
  keep = stiefax.sphere.sphere_retract()
  fixed = stiefax.sphere.sphere_retract(radius=2.5)
  w_keep = optax.apply_updates(w, keep.update(g, keep.init(w), w)[0])
  w_fixed = optax.apply_updates(w, fixed.update(g, fixed.init(w), w)[0])
  np.testing.assert_allclose(frame_norms(w_keep), frame_norms(w), rtol=1e-14)
  np.testing.assert_allclose(frame_norms(w_fixed), [2.5, 2.5], rtol=1e-14)
  assert abs(float(frame_norms(w)[1]) - 2.5) > 0.1  # so the two differ
  # Both land on the ray of W + G.
  for out in (w_keep, w_fixed):
    cos = jnp.sum(out * (w + g), axis=(0, 2)) / (frame_norms(out) * frame_norms(w + g))
    np.testing.assert_allclose(cos, [1.0, 1.0], atol=1e-14)
  # A zero step keeps the point exactly (radius None); a wide frame (r > d) is fine.
  u, _ = keep.update(jnp.zeros_like(w), keep.init(w), w)
  assert float(jnp.max(jnp.abs(u))) == 0.0
  wide = jnp.asarray(rng.standard_normal((2, 9)))
  u, _ = keep.update(0.1 * jnp.ones_like(wide), keep.init(wide), wide)
  np.testing.assert_allclose(jnp.linalg.norm(wide + u), jnp.linalg.norm(wide), rtol=1e-14)


def reference_hyperball_step(w, g, lr, b1, b2, eps, tau, radius):
  """One first step of sphere_adam for one frame, in float64 NumPy."""
  w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
  r = w.shape[1]
  xi = g - np.sum(g * w) / np.sum(w * w) * w
  m = (1 - b1) * xi
  m = m - np.sum(m * w) / np.sum(w * w) * w
  v = (1 - b2) * np.sum(xi * xi)
  step = -lr * (m / (1 - b1)) / (np.sqrt(v / (1 - b2)) + eps)
  norm = np.linalg.norm(step)
  if norm > tau * np.sqrt(r):
    step = step * tau * np.sqrt(r) / norm
  step = step * np.linalg.norm(w) / np.sqrt(r)
  a = w + step
  rho = np.linalg.norm(w) if radius is None else radius
  return rho * a / np.linalg.norm(a)


@pytest.mark.parametrize("radius", [None, 1.5])
def test_hyperball_step_matches_float64_reference(x64, rng, radius):
  w = jnp.asarray(rng.standard_normal((D, H, R)))
  g = jnp.asarray(rng.standard_normal(w.shape))
  tx = stiefax.sphere.sphere_adam(1.0, eps=1e-3, max_norm=0.2, radius=radius)
  new = optax.apply_updates(w, tx.update(g, tx.init(w), w)[0])
  for h in range(H):
    expected = reference_hyperball_step(w[:, h, :], g[:, h, :], 1.0, 0.9, 0.999, 1e-3, 0.2, radius)
    np.testing.assert_allclose(np.asarray(new[:, h, :]), expected, atol=1e-14)
    assert np.max(np.abs(expected - np.asarray(w[:, h, :]))) > 1e-2


def test_sphere_project_is_tangent_and_kills_decay(x64, rng):
  w = jnp.asarray(rng.standard_normal((D, H, R)))
  g = jnp.asarray(rng.standard_normal(w.shape))
  tx = stiefax.sphere.sphere_project()
  out, _ = tx.update(g, tx.init(w), w)
  assert float(jnp.max(jnp.abs(jnp.sum(out * w, axis=(0, 2))))) < 1e-13
  assert float(jnp.max(jnp.abs(jnp.sum(g * w, axis=(0, 2))))) > 1e-2  # g itself is not
  decay, _ = tx.update(0.3 * w, tx.init(w), w)
  assert float(jnp.max(jnp.abs(decay))) < 1e-15
