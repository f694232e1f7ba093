"""``riemannian_adam(1.0, fused=True)`` (the default) against the literal chain of transforms.

The fused update shares the ``W^T [g | m]`` products between the projection and the
moment transport and applies the cap as a per-frame scalar; it must give the chain's
iterates *and* the chain's state (the same tree, the same skip counters) in float64, for
every projector, with and without the cap, under schedules and non-finite input.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import tree_utils as otu
import pytest

import stiefax
from stiefax import FrameSpec
from tests.kernels import kernel
from tests.kernels import random_grads
from tests.kernels import trajectory as _trajectory


def _max_diff(a, b):
  return max(
    float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


@pytest.mark.filterwarnings("ignore:stiefax.polar_retract")
@pytest.mark.parametrize("projector", ["stiefel", "grassmann", "canonical"])
@pytest.mark.parametrize(
  "kwargs",
  [
    dict(),
    dict(max_norm=None, learning_rate=1e-2),
    dict(eps=1e-3, b1=0.8, b2=0.95, max_norm=0.3),
    dict(learning_rate=optax.cosine_decay_schedule(0.5, 10), max_norm=0.05),
    dict(method="svd"),
  ],
  ids=["default", "no-cap", "grok-eps", "schedule", "svd"],
)
def test_fused_equals_chain_in_float64(x64, rng, projector, kwargs):
  w0 = kernel(rng)
  grads = random_grads(rng, 25, w0.shape)
  kwargs = {"learning_rate": 1.0, **kwargs}
  fused, f_state = _trajectory(stiefax.riemannian_adam(projector=projector, **kwargs), w0, grads)
  chain, c_state = _trajectory(
    stiefax.riemannian_adam(projector=projector, fused=False, **kwargs), w0, grads
  )
  assert jax.tree.structure(f_state) == jax.tree.structure(c_state)
  # Rounding differs (shared products, no intermediate casts); 25 steps of it stay
  # below 1e-11, where a wrong coefficient anywhere shows at 1e-3.
  assert _max_diff(fused, chain) < 1e-11
  assert _max_diff(f_state, c_state) < 1e-11
  # Control: the frames moved, so the agreement is not the trivial one.
  assert float(jnp.max(jnp.abs(fused[-1] - w0))) > 1e-2


def test_fused_is_the_chain_structure_and_chain_is_literal(rng):
  w = kernel(rng, dtype=np.float32)
  fused = stiefax.riemannian_adam(1.0)
  chain = stiefax.riemannian_adam(1.0, fused=False)
  assert jax.tree.structure(fused.init(w)) == jax.tree.structure(chain.init(w))
  # The elementwise moment always runs as the chain.
  a = stiefax.riemannian_adam(1.0, moment="elementwise")
  b = stiefax.riemannian_adam(1.0, moment="elementwise", fused=False)
  g = jnp.asarray(rng.standard_normal(w.shape), jnp.float32)
  ua, _ = a.update(g, a.init(w), w)
  ub, _ = b.update(g, b.init(w), w)
  np.testing.assert_array_equal(ua, ub)


@pytest.mark.parametrize(
  "frames, shape",
  [
    (FrameSpec(row_axis=1), (3, 12, 2, 4)),  # layer-stacked (L, d, H, r)
    (FrameSpec(col_axes=(-2, -1)), (12, 2, 3)),  # block-orthogonal heads
    (FrameSpec(row_axis=1), (2, 12, 4)),  # (H, d, r)
  ],
  ids=["stacked", "block", "heads-first"],
)
def test_fused_layouts_in_float64(x64, rng, frames, shape):
  w0 = stiefax.flax.orthonormal_init(frames)(jax.random.key(0), shape, jnp.float64)
  grads = random_grads(rng, 10, shape)
  fused, _ = _trajectory(stiefax.riemannian_adam(1.0, frames=frames), w0, grads)
  chain, _ = _trajectory(stiefax.riemannian_adam(1.0, frames=frames, fused=False), w0, grads)
  assert _max_diff(fused, chain) < 1e-12
  assert float(stiefax.diagnostics.isometry_error(fused[-1], frames=frames)) < 1e-12


def _skipped(state):
  return [np.asarray(x) for _, x in otu.tree_get_all_with_path(state, "skipped")]


def test_fused_non_finite_gradient_matches_chain(x64, rng):
  w = kernel(rng)
  good = jnp.asarray(rng.standard_normal(w.shape))
  bad = good.at[3, 1, 2].set(jnp.nan).at[0, 0, 0].set(jnp.inf)  # frames 1 and 0
  results = []
  for fused in (True, False):
    tx = stiefax.riemannian_adam(1.0, fused=fused)
    state = tx.init(w)
    u, state = tx.update(good, state, w)
    w1 = optax.apply_updates(w, u)
    u, state = tx.update(bad, state, w1)
    results.append((optax.apply_updates(w1, u), state))
  (wf, sf), (wc, sc) = results
  assert _max_diff(wf, wc) < 1e-12 and _max_diff(sf, sc) < 1e-12
  moment, retract = _skipped(sf)
  np.testing.assert_array_equal(moment, [1, 1, 0])  # heads 0 and 1 were hit
  np.testing.assert_array_equal(retract, [0, 0, 0])  # their zero steps are not failures
  assert bool(jnp.all(jnp.isfinite(wf)))


def test_fused_non_finite_learning_rate_is_skipped_by_the_retraction(rng):
  w = kernel(rng, dtype=np.float32)
  g = jnp.asarray(rng.standard_normal(w.shape), jnp.float32)
  for fused in (True, False):
    tx = optax.inject_hyperparams(stiefax.riemannian_adam)(learning_rate=1.0, fused=fused)
    state = tx.init(w)
    state.hyperparams["learning_rate"] = jnp.asarray(jnp.nan)
    u, state = tx.update(g, state, w)
    np.testing.assert_array_equal(optax.apply_updates(w, u), w)
    moment, retract = _skipped(state.inner_state)
    np.testing.assert_array_equal(moment, [0, 0, 0])
    np.testing.assert_array_equal(retract, [1, 1, 1])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_fused_low_precision_close_to_chain(rng, dtype):
  w0 = stiefax.flax.orthonormal_init()(jax.random.key(1), (32, 2, 8), dtype)
  grads = [g.astype(dtype) for g in random_grads(rng, 20, w0.shape, decades=1)]

  def final(tx):  # init under jit: a bf16 frame is orthonormal to bf16 rounding only
    state, w = jax.jit(tx.init)(w0), w0
    for g in grads:
      u, state = jax.jit(tx.update)(g, state, w)
      w = optax.apply_updates(w, u)
    return w

  fused = final(stiefax.riemannian_adam(1.0))
  chain = final(stiefax.riemannian_adam(1.0, fused=False))
  assert fused.dtype == dtype
  tol = 2e-2 if dtype == jnp.bfloat16 else 2e-5
  assert _max_diff(fused, chain) < tol
  assert float(stiefax.diagnostics.isometry_error(fused)) < tol


@pytest.mark.parametrize("lr", [1.0, optax.linear_schedule(1.0, 0.1, 5)], ids=["const", "sched"])
def test_fused_finds_its_states_by_type_not_position(rng, lr):
  w = kernel(rng, dtype=np.float32)
  g = jnp.asarray(rng.standard_normal(w.shape), jnp.float32)
  tx = stiefax.riemannian_adam(lr)
  state = tx.init(w)
  u, new = tx.update(g, state, w)
  # A reordered chain state is read and written by type: the same update and state.
  u_rev, new_rev = tx.update(g, tuple(reversed(state)), w)
  np.testing.assert_array_equal(u_rev, u)
  assert _max_diff(tuple(reversed(new_rev)), new) == 0.0
  assert int(new_rev[-2].count) == 1  # the moment state, at its reordered place
  # A state that is wrapped, duplicated or not a chain's is refused, naming the types.
  for bad in (optax.MaskedState(state), state + state, state[1]):
    with pytest.raises(ValueError, match=r"ScalarMomentState|chain"):
      tx.update(g, bad, w)


# ----------------------------------------------------------------------------
# Grouping: the frame leaves of one shape and dtype are updated in one batched pass.
# ----------------------------------------------------------------------------

# Two layers of query/key kernels (one group), a heads-first kernel of the same frames
# (the same group, another layout), wider frames (their own group) and a layer-stacked
# kernel (batch shape (L, H): its own group).
GROUPED_SHAPES = {
  "l0": {"query": (16, 2, 4), "key": (16, 2, 4)},
  "l1": {"query": (16, 2, 4), "key": (16, 2, 4)},
  "heads_first": (2, 16, 4),
  "wide": (16, 2, 8),
  "stacked": (2, 16, 2, 4),
}


# Small programs: their compile time, not their run time, is the test's cost.
JIT = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def _grouped_frames(path, _):
  name = jax.tree_util.keystr(path)
  return FrameSpec(row_axis=1) if ("stacked" in name or "heads_first" in name) else FrameSpec()


def _grouped_tree(dtype):
  flat, treedef = jax.tree_util.tree_flatten_with_path(
    GROUPED_SHAPES, is_leaf=lambda x: isinstance(x, tuple) and isinstance(x[0], int)
  )
  init_dtype = jnp.float64 if dtype == jnp.float64 else jnp.float32
  return treedef.unflatten(
    [
      stiefax.flax.orthonormal_init(_grouped_frames(path, None))(
        jax.random.key(i), shape, init_dtype
      ).astype(dtype)
      for i, (path, shape) in enumerate(flat)
    ]
  )


def _grouped_run(dtype, group_frames, steps=6):
  w = _grouped_tree(dtype)
  tx = stiefax.riemannian_adam(1.0, frames=_grouped_frames, group_frames=group_frames)
  state, update = jax.jit(tx.init)(w), JIT(tx.update)
  rng = np.random.default_rng(0)
  for t in range(steps):
    g = jax.tree.map(
      lambda x: jnp.asarray(rng.standard_normal(x.shape) * 10 ** rng.uniform(-1, 1), dtype), w
    )
    if t == 3:  # one frame of l1/key (head 1) and one of the stacked kernel (layer 1, head 0)
      g["l1"]["key"] = g["l1"]["key"].at[0, 1, 0].set(jnp.nan)
      g["stacked"] = g["stacked"].at[1, 0, 0, 0].set(jnp.inf)
    u, state = update(g, state, w)
    w = optax.apply_updates(w, u)
  return w, state


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32, jnp.bfloat16])
def test_grouped_update_equals_the_per_leaf_update(dtype):
  with jax.enable_x64(dtype == jnp.float64):
    grouped, g_state = _grouped_run(dtype, True)
    per_leaf, p_state = _grouped_run(dtype, False)
    start = _grouped_tree(dtype)
  assert jax.tree.structure(g_state) == jax.tree.structure(p_state)
  for a, b in zip(jax.tree.leaves((grouped, g_state)), jax.tree.leaves((per_leaf, p_state))):
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == jnp.int32:
      np.testing.assert_array_equal(a, b)
      continue
    # The same per-frame arithmetic on a larger batch: equal to the rounding of the
    # compute dtype (float32 for bfloat16 frames), a few units in the last place.
    eps = float(jnp.finfo(jnp.promote_types(a.dtype, jnp.float32)).eps)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    np.testing.assert_allclose(a64, b64, rtol=0, atol=4 * eps * max(1.0, np.max(np.abs(b64))))
  # The non-finite frames were skipped one by one, in their groups, and nothing else.
  moment = next(s for s in g_state if isinstance(s, stiefax.ScalarMomentState))
  counts = {
    jax.tree_util.keystr(p): np.asarray(x).tolist()
    for p, x in jax.tree_util.tree_flatten_with_path(moment.skipped)[0]
  }
  assert counts["['l1']['key']"] == [0, 1], counts
  assert counts["['stacked']"] == [[0, 0], [1, 0]], counts
  assert sum(np.sum(v) for v in counts.values()) == 2, counts
  # Checked in NumPy: out of the float64 context, jnp would round float64 arrays to float32.
  assert all(np.all(np.isfinite(np.asarray(x, np.float64))) for x in jax.tree.leaves(grouped))
  # Control: the frames moved.
  moved = jax.tree.map(
    lambda a, b: float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))),
    grouped,
    start,
  )
  assert min(jax.tree.leaves(moved)) > 1e-2


def _model(layers=2, d=16, h=2, r=4):
  """A Flax-named tree: per layer query, key, value kernels (d, H, r) and an MLP kernel."""
  init = stiefax.flax.orthonormal_init()
  keys = iter(jax.random.split(jax.random.key(0), 4 * layers))
  return {
    f"layer_{i}": {
      "attention": {n: {"kernel": init(next(keys), (d, h, r))} for n in ("query", "key", "value")},
      "mlp": {"kernel": 0.1 * jax.random.normal(next(keys), (d, 3 * d))},
    }
    for i in range(layers)
  }


def test_grouped_under_partition_multisteps_inject_and_donation(rng):
  def make(group_frames):
    stiefel = functools.partial(stiefax.riemannian_adam, group_frames=group_frames)
    inner = optax.inject_hyperparams(stiefax.stiefel_adamw, static_args=("stiefel",))(
      learning_rate=1e-2, peak_learning_rate=1e-2, stiefel=stiefel
    )
    return optax.MultiSteps(inner, every_k_schedule=2)

  def run(tx):
    params = _model()
    state = tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, state, grads):
      u, state = tx.update(grads, state, params)
      return optax.apply_updates(params, u), state

    g_rng = np.random.default_rng(1)
    for t in range(6):
      grads = jax.tree.map(lambda x: jnp.asarray(g_rng.standard_normal(x.shape), x.dtype), params)
      if t == 4:  # a learning rate lowered mid-run reaches the frames in proportion
        state.inner_opt_state.hyperparams["learning_rate"] = jnp.asarray(5e-3)
      params, state = step(params, state, grads)
    return params, state

  grouped, g_state = run(make(True))
  per_leaf, p_state = run(make(False))
  assert jax.tree.structure(g_state) == jax.tree.structure(p_state)
  assert _max_diff(grouped, per_leaf) < 1e-6
  assert _max_diff(g_state, p_state) < 1e-6
  start = _model()
  q = ("layer_1", "attention", "query", "kernel")

  def at(tree):
    for k in q:
      tree = tree[k]
    return tree

  assert float(jnp.max(jnp.abs(at(grouped) - at(start)))) > 1e-2  # the frames moved
  assert float(stiefax.diagnostics.isometry_error(at(grouped))) < 1e-5


def test_group_frames_takes_none_or_a_bool():
  with pytest.raises(ValueError, match=r"^stiefax.riemannian_adam: group_frames must be"):
    stiefax.riemannian_adam(1.0, group_frames="yes")
  # The literal chain and the elementwise moment run one transform per leaf anyway.
  for kw in (dict(fused=False), dict(moment="elementwise")):
    assert isinstance(
      stiefax.riemannian_adam(1.0, group_frames=True, **kw), optax.GradientTransformation
    )
