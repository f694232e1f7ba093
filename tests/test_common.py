"""Every public optimizer and transform crossed with Optax's harness checks.

One table of factories (the aliases with each projector, moment, retraction and
``fused=False``, the whole-model ``stiefel_adamw``, ``sphere_adam``,
``manifold_muon`` and every transform), each built on a small tree, crossed with:
jitted init/update with a stable state, ``optax.inject_hyperparams`` with the learning
rate traced, ``optax.MultiSteps``, updates inside ``lax.cond`` inside ``lax.scan``,
``optax.with_extra_args_support``, frames staying on their manifold, non-finite
gradients, and a float64 trajectory against :mod:`tests.reference` where it has one
(as optax's ``contrib/_common_test.py`` does for its optimizers). ``init`` and
``update`` of every case also run with and without ``jax.jit`` (``chex.variants``,
as optax's own transform tests do), and the checks assert with ``chex``.

Each case compiles a few small programs, shared by the checks; the whole file runs in
about a minute on one loaded CPU core.
"""

from __future__ import annotations

from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from tests.cases import CASES
from tests.cases import FRAME
from tests.cases import NAMES
from tests.cases import NONFINITE
from tests.cases import ON_MANIFOLD
from tests.cases import STEPS
from tests.cases import WITH_LR
from tests.cases import WITH_REFERENCE
from tests.cases import accumulated
from tests.cases import apply_step
from tests.cases import frame_leaf
from tests.cases import is_zero
from tests.cases import make_grads
from tests.cases import make_params
from tests.cases import plain
from tests.cases import stepped
from tests.cases import transform
from tests.cases import tree_mean
from tests.cases import wrapped


def test_the_table_covers_every_public_factory():
  """The factories of the top level and of :mod:`stiefax.sphere` (``sphere_moment`` is
  a piece of ``sphere_adam``, checked in ``tests/test_sphere.py``; ``hyperball_adam``
  is its deprecated name; the constant-norm wrappers ``hyperball``, ``adamh`` and
  ``muonh`` hold whole matrices and refuse vectors, and ``tests/test_hyperball.py``
  crosses them with the same wrappers and checks)."""
  public = {
    name
    for module in (stiefax, stiefax.sphere)
    for name in module.__all__
    if callable(getattr(module, name))
    and not isinstance(getattr(module, name), type)
    and name[0].islower()
  } - {"sphere_moment", "hyperball_adam", "hyperball", "adamh", "muonh"}
  covered = {case.factory.__name__ for case in CASES.values()}
  assert public <= covered, sorted(public - covered)


# ----------------------------------------------------------------------------
# The checks.
# ----------------------------------------------------------------------------


class InitAndUpdateTest(chex.TestCase):
  """``init`` and two updates of every case, jitted and not (``chex.variants``)."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters((name, name) for name in NAMES)
  def test_init_and_update(self, name):
    case = CASES[name]
    tx = transform(name)
    params = make_params(case.params)
    init, update = self.variant(tx.init), self.variant(tx.update)
    state0 = init(params)
    # The state of an eager init, in structure, shapes, dtypes and values.
    chex.assert_trees_all_close(state0, tx.init(params), strict=True)
    state = state0
    for i in range(2):
      grads = make_grads(params, jax.random.key(i))
      updates, new_state = update(grads, state, params)
      # The same step as the shared compiled program (a different program: rounding).
      expected, expected_state = plain(name, grads, state, params)
      chex.assert_trees_all_close(updates, expected, atol=1e-5, rtol=1e-5)
      chex.assert_trees_all_close(new_state, expected_state, atol=1e-5, rtol=1e-5)
      chex.assert_trees_all_equal_shapes_and_dtypes(updates, params)
      chex.assert_trees_all_equal_shapes_and_dtypes(new_state, state0)
      chex.assert_tree_all_finite((updates, new_state))
      assert not is_zero(updates)
      params, state = apply_step(case, params, updates), new_state


@pytest.mark.parametrize("name", NAMES)
def test_jit_init_and_update_inside_cond(name):
  params, out, state0, state, taken = stepped(name)
  assert 0 < taken < STEPS  # both branches of the cond ran
  # The state keeps its structure, shapes and dtypes (those of an eager init).
  chex.assert_trees_all_equal_shapes_and_dtypes(state, state0)
  chex.assert_trees_all_equal_shapes_and_dtypes(out, params)
  chex.assert_tree_all_finite((out, state))
  moments = [(p, x) for p, x in _paths(state) if not _counter(p)]
  if moments:  # the state moved (beyond counters)
    old = dict(_paths(state0))
    assert any(bool(jnp.any(x != old[p])) for p, x in moments)


@pytest.mark.parametrize("name", ON_MANIFOLD)
def test_frames_stay_on_the_manifold(name):
  case = CASES[name]
  params, out, *_ = stepped(name)
  w0, w = frame_leaf(params), frame_leaf(out)
  assert float(jnp.max(jnp.abs(w - w0))) > 1e-2  # the frames moved
  if case.manifold == "stiefel":
    assert float(stiefax.diagnostics.isometry_error(w)) <= 1e-5
  else:  # each frame keeps its norm (a vector is one frame)
    for a, b, axes in ((w0, w, (0, 2)), (params["dense"]["bias"], out["dense"]["bias"], 0)):
      norm = lambda x, axes=axes: jnp.sqrt(jnp.sum(x**2, axis=axes))
      chex.assert_trees_all_close(norm(b), norm(a), rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_multisteps_accumulates_then_applies_the_mean(name):
  case = CASES[name]
  params, g1, g2, u1, u2, state = accumulated(name)
  chex.assert_trees_all_equal(u1, jax.tree.map(jnp.zeros_like, u1))
  expected, inner = plain(name, tree_mean(g1, g2), transform(name).init(params), params)
  chex.assert_trees_all_close(u2, expected, atol=1e-5, rtol=0)
  assert not is_zero(u2)
  inner_state = state.inner_opt_state
  if "learning_rate" in case.kwargs:
    inner_state = inner_state.inner_state
  chex.assert_trees_all_equal_shapes_and_dtypes(inner_state, inner)


@pytest.mark.parametrize("name", WITH_LR)
def test_inject_hyperparams_traces_the_learning_rate(name):
  case = CASES[name]
  multi, update, compiled = wrapped(name)
  params = make_params(case.params)
  grads = [make_grads(params, jax.random.key(i)) for i in range(4)]
  state = multi.init(params)
  for g in grads[:2]:
    u, state = update(g, state, params)
  hyper = state.inner_opt_state.hyperparams
  chex.assert_trees_all_close(hyper["learning_rate"], case.kwargs["learning_rate"], rtol=1e-6)
  # A new rate is a new value of the same program: zero freezes what it scales.
  size = compiled._cache_size()
  hyper["learning_rate"] = jnp.zeros_like(hyper["learning_rate"])
  for g in grads[2:]:
    u0, state = update(g, state, params)
  assert compiled._cache_size() == size
  for key in case.lr_leaves:
    if key in u0:
      chex.assert_trees_all_equal(u0[key], jax.tree.map(jnp.zeros_like, u0[key]))
      assert not is_zero(u[key]), key


@pytest.mark.parametrize("name", NAMES)
def test_extra_args_are_accepted(name):
  tx = transform(name)
  assert isinstance(optax.with_extra_args_support(tx), optax.GradientTransformationExtraArgs)
  # The MultiSteps program passes value= and step= down to the update.
  params, g1, g2, _, u2, _ = accumulated(name)
  expected, _ = plain(name, tree_mean(g1, g2), tx.init(params), params)
  chex.assert_trees_all_close(u2, expected, atol=1e-5, rtol=0)


def _counter(path: str) -> bool:
  return "count" in path or "skipped" in path


def _paths(tree) -> list:
  return [(jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _skipped(state) -> int:
  return sum(int(jnp.sum(x)) for p, x in _paths(state) if "skipped" in p)


@pytest.mark.parametrize("name", NONFINITE)
def test_non_finite_gradient_leaves_frames_and_state_unchanged(name):
  case = CASES[name]
  tx = transform(name)
  params = make_params(case.params)
  state0 = tx.init(params)
  updates, state = plain(name, make_grads(params, jax.random.key(1)), state0, params)
  params = apply_step(case, params, updates)
  moments = [(p, x) for p, x in _paths(case.frame_state(state)) if not _counter(p)]
  # Control: a finite gradient moves the frames' state (when it has more than counters).
  before = dict((p, x) for p, x in _paths(case.frame_state(state0)) if not _counter(p))
  assert not moments or any(bool(jnp.any(x != before[p])) for p, x in moments)
  grads = make_grads(params, jax.random.key(2))
  bad = jax.tree.map(lambda g: g.at[0].set(jnp.nan), grads)
  if case.params == "model":  # only the frames get the bad gradient; AdamW takes the rest
    bad = dict(grads, **{FRAME[0]: bad[FRAME[0]]})
  bad[FRAME[0]][FRAME[1]] = bad[FRAME[0]][FRAME[1]].at[1, 1, 1].set(jnp.inf)
  updates, new_state = plain(name, bad, state, params)
  new = optax.apply_updates(params, updates)
  chex.assert_trees_all_equal(frame_leaf(new), frame_leaf(params))
  if case.params == "sphere":
    chex.assert_trees_all_equal(new["dense"]["bias"], params["dense"]["bias"])
  after = dict(_paths(case.frame_state(new_state)))
  chex.assert_trees_all_equal({p: after[p] for p, _ in moments}, dict(moments))
  chex.assert_tree_all_finite(new_state)
  if any("skipped" in p for p, _ in _paths(state)):
    assert _skipped(new_state) > _skipped(state) == 0


def _to_frames(w):
  return np.transpose(np.asarray(w, np.float64), (1, 0, 2))


@pytest.mark.parametrize("name", WITH_REFERENCE)
def test_float64_trajectory_matches_the_reference(x64, name):
  case = CASES[name]
  tx = transform(name)
  optimizer = "learning_rate" in case.kwargs
  params = make_params(case.params, jnp.float64, seed=1)
  w0 = _to_frames(frame_leaf(params))
  state = tx.init(params)
  grads, outs = [], []
  for i in range(4):
    g = make_grads(params, jax.random.key(10 + i))
    u, state = plain(name, g, state, params)
    if optimizer:  # the iterates; a transform's outputs at a fixed point
      params = optax.apply_updates(params, u)
    grads.append(_to_frames(frame_leaf(g)))
    outs.append(_to_frames(frame_leaf(params if optimizer else u)))
  assert frame_leaf(params).dtype == jnp.float64
  expected = case.reference(w0, grads)
  chex.assert_trees_all_close(outs, list(expected), atol=1e-10, rtol=0)
  assert float(np.max(np.abs(outs[-1] - (w0 if optimizer else 0)))) > 1e-3  # it moved
