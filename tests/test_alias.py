"""The aliases against the float64 reference, the propositions, and optax's harness."""

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
from tests.kernels import random_grads
from tests.kernels import run
from tests.kernels import to_ref


@pytest.mark.parametrize(
  "kwargs",
  [
    dict(),
    dict(moment="elementwise", learning_rate=0.03),
    dict(projector="grassmann"),
    dict(projector="canonical", moment="elementwise", learning_rate=1e-3, max_norm=None),
    dict(eps=1e-3, b2=0.98, max_norm=0.3),
  ],
  ids=["B2", "elementwise", "grassmann", "B2m-can", "grok-eps"],
)
def test_trajectory_matches_float64_reference(x64, rng, kwargs):
  w0 = kernel(rng)
  grads = random_grads(rng, 40, w0.shape)
  iterates = run(stiefax.riemannian_adam(**{"learning_rate": 1.0, **kwargs}), w0, grads)
  reference = ref.RiemannianAdam(
    **{("lr" if k == "learning_rate" else k): v for k, v in kwargs.items()}
  )
  w = to_ref(w0)
  worst = 0.0
  for g, it in zip(grads, iterates):
    w = reference.step(w, to_ref(g))
    worst = max(worst, float(np.max(np.abs(to_ref(it) - w))))
  assert worst < 1e-8, worst
  # And the trajectory actually moved.
  assert float(np.max(np.abs(to_ref(iterates[-1]) - to_ref(w0)))) > 1e-2


def test_riemannian_sgd_matches_reference(x64, rng):
  w0 = kernel(rng)
  grads = random_grads(rng, 10, w0.shape)
  iterates = run(stiefax.riemannian_sgd(0.05), w0, grads)
  w = to_ref(w0)
  for g, _it in zip(grads, iterates):
    w = ref.riemannian_sgd(w, to_ref(g), lr=0.05)
  np.testing.assert_allclose(to_ref(iterates[-1]), w, atol=1e-10)


@pytest.mark.parametrize("c", [1e-3, 1e3])
def test_proposition_3_scale_free_at_eps_zero(x64, rng, c):
  w0 = kernel(rng)
  grads = random_grads(rng, 20, w0.shape)
  tx = stiefax.riemannian_adam(1.0, eps=0.0)
  base = run(tx, w0, grads)
  scaled = run(tx, w0, [c * g for g in grads])
  assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(base, scaled)) < 1e-8
  # Control: fixed-step SGD is degree one, so it does see the scale.
  sgd = stiefax.riemannian_sgd(0.02)
  gap = float(jnp.max(jnp.abs(run(sgd, w0, grads)[-1] - run(sgd, w0, [c * g for g in grads])[-1])))
  assert gap > 1e-3


def _rotate(q, x):
  """``Q^T W`` for every frame of a (d, H, r) kernel."""
  return jnp.einsum("ij,ihr->jhr", q, x)


@pytest.mark.parametrize("moment, equivariant", [("scalar", True), ("elementwise", False)])
def test_proposition_7_equivariance(x64, rng, moment, equivariant):
  w0 = kernel(rng)
  grads = random_grads(rng, 15, w0.shape, decades=1)
  q = jnp.asarray(np.linalg.qr(rng.standard_normal((D, D)))[0])
  tx = stiefax.riemannian_adam(0.05, moment=moment)
  base = run(tx, w0, grads)
  rotated = run(tx, _rotate(q, w0), [_rotate(q, g) for g in grads])
  violation = max(float(jnp.max(jnp.abs(_rotate(q, a) - b))) for a, b in zip(base, rotated))
  if equivariant:
    assert violation < 1e-10
  else:
    assert violation > 1e-4


def test_block_orthogonal_heads_stay_mutually_orthonormal(rng):
  frames = FrameSpec(col_axes=(-2, -1))
  w = stiefax.flax.orthonormal_init(frames)(jax.random.key(0), (D, H, R))
  iterates = run(stiefax.riemannian_adam(1.0, frames=frames), w, random_grads(rng, 50, w.shape))
  flat = iterates[-1].reshape(D, H * R)
  assert float(jnp.max(jnp.abs(flat.T @ flat - jnp.eye(H * R)))) < 2e-6
  # Heads moved and the cross-head blocks are zero.
  assert float(jnp.max(jnp.abs(iterates[-1] - w))) > 0.1
  # Control: per-head frames do not keep heads mutually orthogonal.
  per_head = run(stiefax.riemannian_adam(1.0), w, random_grads(rng, 50, w.shape))[-1].reshape(
    D, H * R
  )
  assert float(jnp.max(jnp.abs(per_head.T @ per_head - jnp.eye(H * R)))) > 1e-2


@pytest.mark.parametrize(
  "polar, steps",
  [("auto", 200)]
  + [
    pytest.param(p, 2000, marks=pytest.mark.slow)  # the same path, ten times longer
    for p in ("auto", "newton_schulz", "eigh", "svd", "qdwh")
  ],
)
def test_isometry_after_float32_steps_in_scan(polar, steps):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    tx = stiefax.riemannian_adam(1.0, method=polar)
  w0 = stiefax.flax.orthonormal_init()(jax.random.key(0), (32, 4, 8))

  @jax.jit
  def train(w):
    def body(carry, key):
      w, state = carry
      g = jax.random.normal(key, w.shape) * jnp.exp(jax.random.normal(key, ()))
      u, state = tx.update(g, state, w)
      return (optax.apply_updates(w, u), state), None

    (w, _), _ = jax.lax.scan(body, (w, tx.init(w)), jax.random.split(jax.random.key(1), steps))
    return w

  w = train(w0)
  assert float(stiefax.diagnostics.isometry_error(w)) <= 2e-5
  assert float(jnp.max(jnp.abs(w - w0))) > 0.1


def test_schedules_and_inject_hyperparams(rng):
  w = kernel(rng, dtype=np.float32)
  grads = random_grads(rng, 5, w.shape)
  sched = optax.linear_schedule(0.0, 1.0, 4)
  with_schedule = run(stiefax.riemannian_adam(sched, max_norm=10.0), w, grads)
  # Step 0 has a zero learning rate: the frame does not move.
  np.testing.assert_array_equal(with_schedule[0], w)
  injected = optax.inject_hyperparams(stiefax.riemannian_adam)(
    learning_rate=sched, b1=0.9, b2=0.999, eps=1e-8, max_norm=10.0
  )
  got = run(injected, w, grads)
  np.testing.assert_allclose(got[-1], with_schedule[-1], atol=2e-5)
  # A traced hyperparameter changes without recompiling.
  state = injected.init(w)
  update = jax.jit(injected.update)
  _, state = update(grads[0], state, w)
  _, state = update(grads[1], state, w)
  compiled = update._cache_size()
  state.hyperparams["max_norm"] = jnp.full_like(state.hyperparams["max_norm"], 0.01)
  u, _ = update(grads[2], state, w)
  assert update._cache_size() == compiled
  assert float(jnp.linalg.norm(u[:, 0, :])) < 0.011 * np.sqrt(R)


def test_multisteps_accumulates_then_updates(rng):
  w = kernel(rng, dtype=np.float32)
  grads = random_grads(rng, 4, w.shape, decades=0)
  tx = optax.MultiSteps(stiefax.riemannian_adam(1.0), every_k_schedule=2)
  iterates = run(tx, w, grads)
  np.testing.assert_array_equal(iterates[0], w)
  once = run(stiefax.riemannian_adam(1.0), w, [(grads[0] + grads[1]) / 2])[0]
  np.testing.assert_allclose(iterates[1], once, atol=1e-6)
  assert float(stiefax.diagnostics.isometry_error(iterates[-1])) < 1e-5


def test_state_is_stable_under_cond(rng):
  w = kernel(rng, dtype=np.float32)
  tx = stiefax.riemannian_adam(1.0)
  state = tx.init(w)

  @jax.jit
  def maybe(pred, g, state):
    return jax.lax.cond(pred, lambda s: tx.update(g, s, w)[1], lambda s: s, state)

  out = maybe(True, jnp.ones_like(w), state)
  assert jax.tree.structure(out) == jax.tree.structure(state)


def test_extra_args_are_accepted():
  tx = optax.with_extra_args_support(stiefax.riemannian_adam(1.0))
  w = stiefax.flax.orthonormal_init()(jax.random.key(0), (8, 2, 4))
  u, _ = tx.update(jnp.ones_like(w), tx.init(w), w, value=jnp.asarray(1.0))
  assert u.shape == w.shape


# ----------------------------------------------------------------------------
# stiefel_adamw
# ----------------------------------------------------------------------------


def _tree(rng):
  return {
    "attn": {
      "query": {"kernel": kernel(rng, dtype=np.float32), "bias": jnp.ones((H, R))},
      "key": {"kernel": kernel(rng, dtype=np.float32), "bias": jnp.ones((H, R))},
      "value": {"kernel": jnp.ones((D, H, R)), "bias": jnp.ones((H, R))},
    },
    "dense": {"kernel": jnp.ones((D, D)), "bias": jnp.ones((D,))},
  }


def test_proposition_8_weight_decay_never_touches_frames(rng):
  params = _tree(rng)
  zero = jax.tree.map(jnp.zeros_like, params)
  tx = stiefax.stiefel_adamw(0.1, weight_decay=1.0)
  u, _ = tx.update(zero, tx.init(params), params)
  # Frames: no decay at all (a zero gradient is a zero step).
  assert bool(jnp.all(u["attn"]["query"]["kernel"] == 0))
  assert bool(jnp.all(u["attn"]["key"]["kernel"] == 0))
  # Matrices decay, vectors do not.
  np.testing.assert_allclose(u["dense"]["kernel"], -0.1 * params["dense"]["kernel"], rtol=1e-6)
  np.testing.assert_allclose(u["attn"]["value"]["kernel"], -0.1, rtol=1e-6)
  assert bool(jnp.all(u["dense"]["bias"] == 0))
  # The algebra behind it: the decay gradient is normal, Pi_W(lambda W) = 0.
  w = params["attn"]["query"]["kernel"]
  xi, _ = stiefax.stiefel_project().update(0.7 * w, optax.EmptyState(), w)
  assert float(jnp.max(jnp.abs(xi))) < 1e-6


def test_stiefel_adamw_routes_frames_and_the_rest(rng):
  params = _tree(rng)
  grads = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), params)
  tx = stiefax.stiefel_adamw(1e-2, weight_decay=0.0)
  u, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  adam = optax.adam(1e-2)
  euclid = {k: v for k, v in params.items()}
  ua, _ = adam.update(grads, adam.init(euclid), euclid)
  np.testing.assert_allclose(u["dense"]["kernel"], ua["dense"]["kernel"], rtol=1e-5)
  np.testing.assert_allclose(u["attn"]["value"]["kernel"], ua["attn"]["value"]["kernel"], rtol=1e-5)
  rad = stiefax.riemannian_adam(1.0)
  q = params["attn"]["query"]["kernel"]
  uq, _ = rad.update(grads["attn"]["query"]["kernel"], rad.init(q), q)
  np.testing.assert_allclose(u["attn"]["query"]["kernel"], uq, rtol=1e-5, atol=1e-7)


def test_stiefel_adamw_label_errors(rng):
  params = _tree(rng)
  bad = jax.tree.map(lambda _: "adamw", params)
  bad["attn"]["query"]["kernel"] = "stiefle"
  with pytest.raises(ValueError, match=r"'stiefle'.*\['adamw', 'stiefel'\]"):
    stiefax.stiefel_adamw(1e-3, labels=bad).init(params)
  with pytest.raises(ValueError, match="label tree has 1 leaves but the params have 8"):
    stiefax.stiefel_adamw(1e-3, labels={"a": "adamw"}).init(params)


def test_optax_multi_transform_alias_also_works(rng):
  params = _tree(rng)
  labels = stiefax.layouts.qk_labels(params)
  tx = optax.multi_transform(
    {"stiefel": stiefax.riemannian_adam(1.0), "adamw": optax.adamw(1e-3)}, labels
  )
  grads = jax.tree.map(jnp.ones_like, params)
  u, _ = tx.update(grads, tx.init(params), params)
  new = optax.apply_updates(params, u)
  assert float(stiefax.diagnostics.isometry_error(new, labels)) < 1e-5


def test_stiefel_adamw_refuses_to_select_no_frame(rng):
  tree = {
    "layers_0": {"attn": {"wq": {"kernel": jnp.ones((D, D))}, "wk": {"kernel": jnp.ones((D, D))}}},
    "mlp": {"kernel": jnp.ones((D, D))},
  }
  # Default labels: the attention-like kernels are named, with how to select them.
  with pytest.raises(ValueError, match=r"layers_0/attn/wk/kernel.*modules=\('wk', 'wq'\)"):
    stiefax.stiefel_adamw(1e-3).init(tree)
  # A label tree with no frame at all, attention or not, is refused too.
  all_adamw = lambda p: jax.tree.map(lambda _: "adamw", p)
  with pytest.raises(ValueError, match=r"no parameter is labelled 'stiefel'.*layers_0/attn/wq"):
    stiefax.stiefel_adamw(1e-3, labels=all_adamw).init(tree)
  with pytest.raises(ValueError, match=r"no parameter is labelled 'stiefel'.*no attention-like"):
    stiefax.stiefel_adamw(1e-3, labels=all_adamw).init({"mlp": tree["mlp"]})
  # Control: selected by name, the same tree trains.
  picked = lambda p: stiefax.layouts.qk_labels(p, modules=("wq", "wk"))
  snapped = stiefax.flax.project_params(tree, picked)
  stiefax.stiefel_adamw(1e-3, labels=picked).init(snapped)


def test_stiefel_adamw_label_tree_without_the_params_level(rng):
  variables = {"params": _tree(rng)}
  labels = stiefax.layouts.qk_labels(variables["params"])
  with pytest.raises(ValueError, match="top 'params' level that the labels lack"):
    stiefax.stiefel_adamw(1e-3, labels=labels).init(variables)
  with pytest.raises(ValueError, match="top 'params' level that the params lack"):
    stiefax.stiefel_adamw(1e-3, labels={"params": labels}).init(variables["params"])
  stiefax.stiefel_adamw(1e-3, labels={"params": labels}).init(variables)
