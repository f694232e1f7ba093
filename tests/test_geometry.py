import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stiefax import _matrix
from stiefax import geometry
from tests import reference as ref

METHODS = ["newton_schulz", "eigh", "svd", "qdwh", "auto"]


def _tangent_step(rng, w, norm):
  xi = np.stack(
    [ref.stiefel_project(w[h], rng.standard_normal(w.shape[1:])) for h in range(len(w))]
  )
  return xi * (norm / np.linalg.norm(xi, axis=(-2, -1), keepdims=True))


@pytest.mark.parametrize(
  "fn, ref_fn",
  [
    (geometry.stiefel_tangent, ref.stiefel_project),
    (geometry.grassmann_horizontal, ref.grassmann_project),
    (geometry.canonical_tangent, ref.canonical_gradient),
  ],
)
def test_projections_match_reference_and_are_tangent(x64, rng, fn, ref_fn):
  w = ref.random_frames(rng, (3, 12, 4))
  g = 10.0 ** rng.uniform(-3, 3) * rng.standard_normal(w.shape)
  out = np.asarray(fn(jnp.asarray(w), jnp.asarray(g)))
  expected = np.stack([ref_fn(w[h], g[h]) for h in range(3)])
  np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12 * np.abs(g).max())
  skew = np.swapaxes(w, -1, -2) @ out
  assert np.max(np.abs(skew + np.swapaxes(skew, -1, -2))) <= 1e-12 * max(1, np.abs(g).max())


def test_projection_kernels(x64, rng):
  w = ref.random_frames(rng, (2, 10, 3))
  s = rng.standard_normal((2, 3, 3))
  normal = w @ (s + np.swapaxes(s, -1, -2))
  # The normal space {W S} is the kernel of the Stiefel projection (Proposition 8).
  assert np.max(np.abs(geometry.stiefel_tangent(w, normal))) < 1e-13
  assert np.max(np.abs(geometry.stiefel_tangent(w, 0.7 * w))) < 1e-13
  # The Grassmann projection also removes the gauge block W Omega.
  omega = s - np.swapaxes(s, -1, -2)
  assert np.max(np.abs(geometry.grassmann_horizontal(w, w @ omega))) < 1e-13
  assert np.max(np.abs(geometry.stiefel_tangent(w, w @ omega) - w @ omega)) < 1e-13


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", [(8, 32, 4), (2, 24, 12), (1, 6, 6)])
def test_polar_agrees_with_svd_float32(rng, method, shape):
  w = ref.random_frames(rng, shape)
  r = shape[-1]
  for norm in (0.1 * np.sqrt(r), 3.0):  # capped and uncapped tangent steps
    a = w + _tangent_step(rng, w, norm)
    expected = np.stack([ref.polar(x) for x in a])
    out = jax.jit(lambda x: geometry.polar(x, method))(jnp.asarray(a, jnp.float32))
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, expected, atol=2e-6)
    assert float(jnp.max(geometry.isometry_residual(out))) < 3e-6


@pytest.mark.parametrize("method", METHODS)
def test_polar_float64_exact(x64, rng, method):
  w = ref.random_frames(rng, (3, 16, 5))
  a = w + _tangent_step(rng, w, 0.5)
  expected = np.stack([ref.polar(x) for x in a])
  np.testing.assert_allclose(geometry.polar(jnp.asarray(a), method), expected, atol=1e-12)


@pytest.mark.parametrize("dtype, decades, atol", [("float32", 1, 2e-5), ("float64", 2, 1e-10)])
def test_polar_newton_schulz_any_full_rank_input(x64, rng, dtype, decades, atol):
  # Not a tangent step: singular values spread over `decades` decades. Gram-space
  # methods lose accuracy like eps * cond(A)^2, which is why they are for retraction.
  u = ref.random_frames(rng, (2, 20, 6))
  v = ref.random_frames(rng, (2, 6, 6))
  s = np.logspace(-decades / 2, decades / 2, 6)
  a = (u * s) @ np.swapaxes(v, -1, -2)
  out = geometry.polar(jnp.asarray(a, dtype), "newton_schulz")
  np.testing.assert_allclose(out, u @ np.swapaxes(v, -1, -2), atol=atol)


def test_polar_bfloat16_computed_in_float32(rng):
  w = ref.random_frames(rng, (2, 32, 8))
  a = jnp.asarray(w + _tangent_step(rng, w, 0.2), jnp.bfloat16)
  out = geometry.polar(a)
  assert out.dtype == jnp.bfloat16
  assert float(jnp.max(geometry.isometry_residual(out.astype(jnp.float32)))) < 2e-2


def test_unknown_polar_method():
  with pytest.raises(ValueError, match="valid methods are"):
    geometry.polar(jnp.eye(3), "cayley")


@pytest.mark.parametrize("r", [1, 4, 16, 32, 64])
def test_fixed_newton_schulz_count_is_exact_for_capped_steps(rng, r):
  d, tau = 2 * r + 8, 0.1
  w = ref.random_frames(rng, (3, d, r))
  limit = tau * np.sqrt(r)
  # Worst case: a rank-1 tangent step of full cap length (one singular value at the
  # top of the Proposition 6 interval), and full-rank steps at the cap.
  u = rng.standard_normal((3, d, 1))
  u -= w @ (np.swapaxes(w, -1, -2) @ u)
  v = rng.standard_normal((3, 1, r))
  rank1 = u @ v
  rank1 *= limit / np.linalg.norm(rank1, axis=(-2, -1), keepdims=True)
  for step in (rank1, _tangent_step(rng, w, limit)):
    a = w + step
    out = geometry.polar(jnp.asarray(a, jnp.float32), "newton_schulz", step_bound=tau)
    np.testing.assert_allclose(out, np.stack([ref.polar(x) for x in a]), atol=2e-6)
    assert float(jnp.max(geometry.isometry_residual(out))) < 3e-6
  # Control: one iteration fewer is not exact in the worst case.
  k = geometry.newton_schulz_iterations(tau, r)
  short = _matrix.polar_newton_schulz(jnp.asarray(w + rank1, jnp.float32), k - 1)
  if r >= 4:
    assert float(jnp.max(geometry.isometry_residual(short))) > 1e-6


def test_newton_schulz_iteration_counts():
  assert geometry.newton_schulz_iterations(0.1, 16) == 3
  assert geometry.newton_schulz_iterations(0.1, 32) == 4
  assert geometry.newton_schulz_iterations(0.1, 64) == 4
  assert geometry.newton_schulz_iterations(0.1, 64, jnp.float64) == 5
  assert geometry.newton_schulz_iterations(1.0, 64) > 8


@pytest.mark.parametrize(
  "old, new",
  [
    ("stiefel_project", "stiefel_tangent"),
    ("grassmann_project", "grassmann_horizontal"),
    ("canonical_gradient", "canonical_tangent"),
  ],
)
def test_the_0_1_names_of_the_projections_are_gone(old, new):
  assert not hasattr(geometry, old)
  assert old not in geometry.__all__ and new in geometry.__all__
