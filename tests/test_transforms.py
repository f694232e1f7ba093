"""Every transform crossed with a shared list of properties, plus float64 references."""

import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax import FrameSpec
from tests import reference as ref
from tests.kernels import D
from tests.kernels import H
from tests.kernels import R
from tests.kernels import kernel
from tests.kernels import to_ref

# name -> factory(frames) of every transform that reads the current point.
NEEDS_PARAMS = {
  "stiefel_project": lambda f: stiefax.stiefel_project(frames=f),
  "grassmann_project": lambda f: stiefax.grassmann_project(frames=f),
  "canonical_gradient": lambda f: stiefax.canonical_gradient(frames=f),
  "scalar_moment": lambda f: stiefax.scalar_moment(frames=f),
  "elementwise_moment": lambda f: stiefax.elementwise_moment(frames=f),
  "polar_retract": lambda f: stiefax.polar_retract(frames=f),
  "retract": lambda f: stiefax.retract("qr", frames=f),
  "manifold_muon": lambda f: stiefax.manifold_muon(0.1, frames=f),
}
ALL = dict(NEEDS_PARAMS, step_norm_cap=lambda f: stiefax.step_norm_cap(0.1, frames=f))
TANGENT_OUTPUT = [
  "stiefel_project",
  "grassmann_project",
  "canonical_gradient",
  "scalar_moment",
  "elementwise_moment",
]


@pytest.mark.parametrize("name", sorted(NEEDS_PARAMS))
def test_update_without_params_is_a_clear_error(rng, name):
  tx = NEEDS_PARAMS[name](FrameSpec())
  w = kernel(rng, dtype=np.float32)
  with pytest.raises(ValueError, match=rf"stiefax.{name} needs the current point W"):
    tx.update(w, tx.init(w))


@pytest.mark.parametrize("name", sorted(ALL))
def test_jit_shapes_dtypes_and_frames_callable(rng, name):
  w = {"q": kernel(rng, dtype=np.float32), "stack": jnp.stack([kernel(rng, dtype=np.float32)] * 2)}
  frames = lambda path, x: FrameSpec(row_axis=1) if x.ndim == 4 else FrameSpec()
  tx = ALL[name](frames)
  g = jax.tree.map(lambda x: 0.1 * jnp.ones_like(x), w)
  state = tx.init(w)
  out, new_state = jax.jit(tx.update)(g, state, w)
  for o, x in zip(jax.tree.leaves(out), jax.tree.leaves(w)):
    assert o.shape == x.shape and o.dtype == x.dtype
    assert bool(jnp.all(jnp.isfinite(o)))
  chex_shapes = jax.tree.map(lambda a: (a.shape, a.dtype), state)
  assert jax.tree.map(lambda a: (a.shape, a.dtype), new_state) == chex_shapes


@pytest.mark.parametrize("name", TANGENT_OUTPUT)
def test_outputs_are_tangent_float64(x64, rng, name):
  w = kernel(rng)
  tx = NEEDS_PARAMS[name](FrameSpec())
  state = tx.init(w)
  for _ in range(3):
    g = jnp.asarray(rng.standard_normal(w.shape) * 10.0 ** rng.uniform(-2, 2))
    out, state = tx.update(g, state, w)
    err = stiefax.diagnostics.tangency_error(w, out) / jnp.max(jnp.abs(out))
    assert float(err) < 1e-12
    # The tangent vectors also move with the point: take a retracted step.
    retract = stiefax.polar_retract()
    w = optax.apply_updates(w, retract.update(0.1 * out, retract.init(w), w)[0])


def test_scalar_moment_matches_reference_float64(x64, rng):
  w = kernel(rng)
  tx = stiefax.scalar_moment(0.8, 0.95, 1e-6)
  state = tx.init(w)
  m = np.zeros((H, D, R))
  v = np.zeros(H)
  for t in range(1, 6):
    g = np.stack([ref.stiefel_project(to_ref(w)[h], rng.standard_normal((D, R))) for h in range(H)])
    out, state = tx.update(jnp.asarray(np.transpose(g, (1, 0, 2))), state, w)
    m = 0.8 * m + 0.2 * g
    v = 0.95 * v + 0.05 * np.sum(g**2, axis=(1, 2))
    expected = (m / (1 - 0.8**t)) / (np.sqrt(v / (1 - 0.95**t)) + 1e-6)[:, None, None]
    np.testing.assert_allclose(to_ref(out), expected, rtol=1e-10, atol=1e-13)
  assert state.nu.shape == (H,)  # one scalar per frame, not a d x r buffer
  np.testing.assert_allclose(state.nu, v, rtol=1e-12)


@pytest.mark.parametrize("moment", ["scalar", "elementwise"])
def test_zero_gradient_with_eps_zero_is_a_zero_step(rng, moment):
  w = kernel(rng, dtype=np.float32)
  tx = stiefax.riemannian_adam(1.0, eps=0.0, moment=moment)
  state = tx.init(w)
  for _ in range(2):  # also on the very first step, where v_hat = 0
    out, state = tx.update(jnp.zeros_like(w), state, w)
    assert bool(jnp.all(out == 0))
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(state))


def test_step_norm_cap_per_frame(x64, rng):
  eta = jnp.asarray(rng.standard_normal((D, H, R)))
  eta = eta.at[:, 0, :].multiply(1e-3)  # frame 0 below the cap
  out, _ = stiefax.step_norm_cap(0.1).update(eta, optax.EmptyState())
  norms = np.linalg.norm(to_ref(out), axis=(1, 2))
  np.testing.assert_allclose(norms[1:], 0.1 * np.sqrt(R), rtol=1e-12)
  np.testing.assert_allclose(to_ref(out)[0], to_ref(eta)[0])
  # Direction is kept.
  np.testing.assert_allclose(
    to_ref(out)[1] / norms[1], to_ref(eta)[1] / np.linalg.norm(to_ref(eta)[1])
  )
  # Block frames: tau * sqrt(H * r) for the whole kernel.
  out, _ = stiefax.step_norm_cap(0.1, frames=FrameSpec(col_axes=(-2, -1))).update(
    eta, optax.EmptyState()
  )
  np.testing.assert_allclose(np.linalg.norm(out), 0.1 * np.sqrt(H * R), rtol=1e-12)


@pytest.mark.parametrize("method", ["newton_schulz", "eigh", "svd", "qdwh"])
def test_polar_retract_matches_reference_float64(x64, rng, method):
  w = kernel(rng)
  eta = jnp.asarray(rng.standard_normal(w.shape))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    tx = stiefax.polar_retract(method=method)
  out, _ = tx.update(eta, tx.init(w), w)
  new = optax.apply_updates(w, out)
  expected = np.stack([ref.polar(to_ref(w)[h] + to_ref(eta)[h]) for h in range(H)])
  np.testing.assert_allclose(to_ref(new), expected, atol=1e-12)


def test_polar_retract_keeps_zero_steps_exactly(rng):
  w = kernel(rng, dtype=np.float32)
  eta = jnp.zeros_like(w).at[:, 1, :].set(0.01)
  tx = stiefax.polar_retract()
  out, _ = tx.update(eta, tx.init(w), w)
  assert bool(jnp.all(out[:, 0, :] == 0)) and bool(jnp.all(out[:, 2, :] == 0))
  assert bool(jnp.any(out[:, 1, :] != 0))


def test_lapack_methods_warn_once_on_cpu():
  with pytest.warns(RuntimeWarning, match="deadlocked"):
    stiefax.polar_retract(method="svd")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    stiefax.polar_retract(method="auto")
    stiefax.polar_retract(method="newton_schulz")


def test_polar_retract_rejects_off_manifold_params(rng):
  w = {"attn": {"query": {"kernel": 1.5 * kernel(rng, dtype=np.float32)}}}
  with pytest.raises(ValueError, match=r"\['attn'\]\['query'\]\['kernel'\].*project_params"):
    stiefax.polar_retract().init(w)


def test_unknown_strings_list_the_valid_ones():
  with pytest.raises(ValueError, match="valid methods are"):
    stiefax.polar_retract(method="cayley")
  with pytest.raises(ValueError, match="valid projectors are"):
    stiefax.scalar_moment(projector="oblique")
  with pytest.raises(ValueError, match="valid projectors are"):
    stiefax.riemannian_adam(1.0, projector="oblique")
  with pytest.raises(ValueError, match="valid moments are"):
    stiefax.riemannian_adam(1.0, moment="adafactor")


def test_r_greater_than_d_names_the_shape_at_init():
  with pytest.raises(ValueError, match=r"\(4, 2, 8\)"):
    stiefax.riemannian_adam(1.0).init(jnp.zeros((4, 2, 8)))


def tangent(rng, w, scale=0.5):
  wf = to_ref(w)
  g = rng.standard_normal(wf.shape)
  return np.stack([ref.stiefel_project(wf[h], g[h]) for h in range(len(wf))]) * scale


# The retractions besides the paper's polar one.
OTHER_RETRACTIONS = [name for name in stiefax.RETRACTIONS if name != "polar"]


def _curve(name, w, xi):
  """``t -> R_W(t xi)`` for the row ``name`` of the retraction table."""
  row = stiefax.geometry.retraction_by_name(name)
  return lambda t: row.retract(
    w, t * xi, method="auto", step_bound=None, sq_norm=stiefax.geometry.frame_sq_norm(t * xi)
  )


def test_qr_and_cayley_match_float64_references(x64, rng):
  w = kernel(rng)
  wf, xi = to_ref(w), tangent(rng, w)
  eta = jnp.asarray(np.transpose(xi, (1, 0, 2)))
  for name in ("qr", "cayley"):
    tx = stiefax.retract(retraction=name)
    new = to_ref(optax.apply_updates(w, tx.update(eta, tx.init(w), w)[0]))
    for h in range(H):
      if name == "qr":
        q, r = np.linalg.qr(wf[h] + xi[h])
        expected = q * np.sign(np.diag(r))
      else:  # the dense Cayley transform of Omega = P xi W^T - W xi^T P
        p = np.eye(D) - 0.5 * wf[h] @ wf[h].T
        om = p @ xi[h] @ wf[h].T - wf[h] @ xi[h].T @ p
        expected = np.linalg.solve(np.eye(D) - om / 2, (np.eye(D) + om / 2) @ wf[h])
      np.testing.assert_allclose(new[h], expected, atol=1e-12)


def test_retractions_agree_with_polar_to_first_order(x64, rng):
  w = kernel(rng)
  wf, xi = jnp.asarray(to_ref(w)), jnp.asarray(tangent(rng, w))
  fns = {name: _curve(name, wf, xi) for name in stiefax.geometry.RETRACTION_TABLE}
  for name, fn in fns.items():
    at0, deriv = jax.jvp(fn, (jnp.zeros([]),), (jnp.ones([]),))
    assert float(jnp.max(jnp.abs(at0 - wf))) < 1e-13, name
    assert float(jnp.max(jnp.abs(deriv - xi))) < 1e-12, name
  # The difference to polar is O(t^2): halving t quarters it (QR, Cayley are first order).
  for name in OTHER_RETRACTIONS:
    e = [float(jnp.max(jnp.abs(fns[name](t) - fns["polar"](t)))) for t in (1e-2, 5e-3)]
    assert 3.5 < e[0] / e[1] < 4.5, (name, e)


@pytest.mark.parametrize("retraction", OTHER_RETRACTIONS)
def test_retraction_choice_in_the_aliases_and_jitted_loops(rng, retraction):
  w = kernel(rng, dtype=np.float32)
  a = rng.standard_normal((D, D))
  a = jnp.asarray(a + a.T, jnp.float32)
  for tx in (
    stiefax.riemannian_adam(1.0, retraction=retraction),
    stiefax.riemannian_sgd(0.05, retraction=retraction),
  ):

    @jax.jit
    def run(w0, tx=tx):
      def body(carry, _):
        w, state = carry
        u, state = tx.update(-2 * jnp.einsum("de,ehr->dhr", a, w), state, w)
        return (optax.apply_updates(w, u), state), None

      return jax.lax.scan(body, (w0, tx.init(w0)), None, length=50)[0][0]

    out = run(w)
    assert float(stiefax.diagnostics.isometry_error(out)) < 2e-6
    assert float(jnp.max(jnp.abs(out - w))) > 1e-2


def test_fused_adam_with_each_retraction_matches_the_chain(x64, rng):
  w = kernel(rng)
  for retraction in stiefax.RETRACTIONS:
    fused = stiefax.riemannian_adam(1.0, retraction=retraction)
    chain = stiefax.riemannian_adam(1.0, retraction=retraction, fused=False)
    s1, s2 = fused.init(w), chain.init(w)
    for _ in range(3):
      g = jnp.asarray(rng.standard_normal(w.shape))
      u1, s1 = fused.update(g, s1, w)
      u2, s2 = chain.update(g, s2, w)
      np.testing.assert_allclose(u1, u2, atol=1e-11)
    if retraction != "polar":
      assert float(jnp.max(jnp.abs(u1 - stiefax.riemannian_adam(1.0).update(g, s1, w)[0]))) > 0


def test_unknown_retraction_is_a_clear_error():
  for make in (
    lambda: stiefax.retract(retraction="exp"),
    lambda: stiefax.riemannian_adam(1.0, retraction="exp"),
    lambda: stiefax.riemannian_sgd(0.02, retraction="exp"),
    lambda: stiefax.manifold_muon(0.02, retraction="exp"),
    lambda: stiefax.geometry.retraction_step(jnp.eye(3), jnp.eye(3), retraction="exp"),
  ):
    with pytest.raises(ValueError, match="Unknown retraction 'exp'; valid retractions are"):
      make()


_FORMULA_CALLS: list[int] = []


def _polar_by_formula(w, eta, **_):
  """``polar(W + eta)`` for a tangent ``eta`` as ``(W + eta) (I + eta^T eta)^{-1/2}``:
  ``(W + eta)^T (W + eta) = I + eta^T eta`` when ``W^T eta`` is skew (Proposition 6(i)),
  computed from an eigendecomposition, another formula than any row's."""
  _FORMULA_CALLS.append(1)
  gram = jnp.swapaxes(eta, -1, -2) @ eta
  lam, v = jnp.linalg.eigh(stiefax.geometry.eye_like(gram) + gram)
  return (w + eta) @ ((v * jax.lax.rsqrt(lam)[..., None, :]) @ jnp.swapaxes(v, -1, -2))


def _descend(tx, w, a, steps=3):
  """``steps`` jitted updates of ``tx`` on ``l(W) = -tr(W^T A W)`` per head, from ``w``."""
  state, update = tx.init(w), jax.jit(tx.update)
  for _ in range(steps):
    u, state = update(-2 * jnp.einsum("de,dhr->ehr", a, w), state, w)
    w = optax.apply_updates(w, u)
  return w


def _one_step(retraction, w, a):
  """One :func:`stiefax.geometry.retraction_step` of the frames ``(H, D, R)`` of ``w``."""
  wf = jnp.swapaxes(w, 0, 1)
  eta = stiefax.geometry.stiefel_tangent(wf, 0.2 * a @ wf)
  delta, _ = stiefax.geometry.retraction_step(wf, eta, retraction=retraction)
  return jnp.swapaxes(wf + delta, 0, 1)


# Every public function that takes retraction=, as it runs: (retraction, w, a) -> frames.
RETRACTION_USERS = {
  "retract": lambda r, w, a: _descend(
    optax.chain(stiefax.stiefel_project(), optax.scale(0.1), stiefax.retract(r)), w, a
  ),
  "riemannian_adam": lambda r, w, a: _descend(stiefax.riemannian_adam(0.5, retraction=r), w, a),
  "riemannian_sgd": lambda r, w, a: _descend(stiefax.riemannian_sgd(0.05, retraction=r), w, a),
  "manifold_muon": lambda r, w, a: _descend(
    stiefax.manifold_muon(0.1, retraction=r, iterations=2, ns_iterations=6), w, a
  ),
  "retraction_step": _one_step,
}


def _takes_retraction() -> set[str]:
  modules = [stiefax] + [getattr(stiefax, m) for m in stiefax.__all__]
  return {
    name
    for module in modules
    if inspect.ismodule(module)
    for name in getattr(module, "__all__", ())
    if inspect.isfunction(fn := getattr(module, name))
    and "retraction" in inspect.signature(fn).parameters
  }


def test_every_function_that_takes_a_retraction_is_crossed_with_a_new_row():
  assert _takes_retraction() == set(RETRACTION_USERS)


@pytest.mark.parametrize("name", sorted(RETRACTION_USERS))
def test_a_new_retraction_is_one_row_of_the_table(x64, rng, monkeypatch, name):
  """A retraction registered in the table, and nowhere else, runs through every function
  that takes ``retraction=`` (checked by name, jitted, in the fused and chained Adam).
  Being polar by another formula, it gives the polar trajectory."""
  monkeypatch.setitem(
    stiefax.geometry.RETRACTION_TABLE,
    "polar_formula",
    stiefax.geometry.Retraction(_polar_by_formula, takes_method=False),
  )
  w = kernel(rng)
  a = rng.standard_normal((D, D))
  a = jnp.asarray(a + a.T)
  calls = len(_FORMULA_CALLS)
  new = RETRACTION_USERS[name]("polar_formula", w, a)
  assert len(_FORMULA_CALLS) > calls  # the row's function ran
  np.testing.assert_allclose(new, RETRACTION_USERS[name]("polar", w, a), atol=1e-10)
  assert float(jnp.max(jnp.abs(new - RETRACTION_USERS[name]("qr", w, a)))) > 1e-6
  assert float(stiefax.diagnostics.isometry_error(new)) < 1e-12


def test_a_retraction_outside_the_table_is_refused():
  assert "polar_formula" not in stiefax.geometry.RETRACTION_TABLE
  with pytest.raises(ValueError, match="Unknown retraction 'polar_formula'"):
    stiefax.retract("polar_formula")


POSITIONAL_FRAMES = {
  "stiefel_project": lambda f: stiefax.stiefel_project(f),
  "grassmann_project": lambda f: stiefax.grassmann_project(f),
  "canonical_gradient": lambda f: stiefax.canonical_gradient(f),
  "scalar_moment": lambda f: stiefax.scalar_moment(0.9, 0.999, 1e-8, f),
  "elementwise_moment": lambda f: stiefax.elementwise_moment(0.9, 0.999, 1e-8, f),
  "step_norm_cap": lambda f: stiefax.step_norm_cap(0.1, f),
  "polar_retract": lambda f: stiefax.polar_retract(f, "newton_schulz"),
  "retract": lambda f: stiefax.retract(f, "qr"),
  "sphere_project": lambda f: stiefax.sphere.sphere_project(f),
  "sphere_retract": lambda f: stiefax.sphere.sphere_retract(None, f),
  "sphere_moment": lambda f: stiefax.sphere.sphere_moment(0.9, 0.999, 1e-8, f),
}
KEYWORD_FRAMES = {
  "stiefel_project": lambda f: stiefax.stiefel_project(frames=f),
  "grassmann_project": lambda f: stiefax.grassmann_project(frames=f),
  "canonical_gradient": lambda f: stiefax.canonical_gradient(frames=f),
  "scalar_moment": lambda f: stiefax.scalar_moment(0.9, 0.999, 1e-8, frames=f),
  "elementwise_moment": lambda f: stiefax.elementwise_moment(0.9, 0.999, 1e-8, frames=f),
  "step_norm_cap": lambda f: stiefax.step_norm_cap(0.1, frames=f),
  "polar_retract": lambda f: stiefax.polar_retract("newton_schulz", frames=f),
  "retract": lambda f: stiefax.retract("qr", frames=f),
  "sphere_project": lambda f: stiefax.sphere.sphere_project(frames=f),
  "sphere_retract": lambda f: stiefax.sphere.sphere_retract(None, frames=f),
  "sphere_moment": lambda f: stiefax.sphere.sphere_moment(0.9, 0.999, 1e-8, frames=f),
}


@pytest.mark.parametrize("name", sorted(POSITIONAL_FRAMES))
def test_frames_is_keyword_only(rng, name):
  """The 0.1 positional spelling is gone: ``frames`` is keyword-only."""
  w = jnp.swapaxes(kernel(rng, dtype=np.float32), 0, 1)  # (heads, d, r): row_axis=1
  spec = FrameSpec(row_axis=1)
  g = jnp.asarray(rng.standard_normal(w.shape), jnp.float32)
  with pytest.raises((TypeError, ValueError)):  # too many arguments, or a spec as a name
    POSITIONAL_FRAMES[name](spec)
  new = KEYWORD_FRAMES[name](spec)
  u_new, _ = new.update(g, new.init(w), w)
  assert float(jnp.max(jnp.abs(u_new))) > 0
