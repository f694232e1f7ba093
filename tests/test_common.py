"""Every public optimizer and transform crossed with Optax's harness checks.

One table of factories (the aliases with each projector, moment, retraction and
``fused=False``, the whole-model ``stiefel_adamw``, ``hyperball_adam``,
``manifold_muon`` and every transform), each built on a small tree, crossed with:
jitted init/update with a stable state, ``optax.inject_hyperparams`` with the learning
rate traced, ``optax.MultiSteps``, updates inside ``lax.cond`` inside ``lax.scan``,
``optax.with_extra_args_support``, frames staying on their manifold, non-finite
gradients, and a float64 trajectory against :mod:`tests.reference` where it has one
(as optax's ``contrib/_common_test.py`` does for its optimizers).

Each case compiles a few small programs, shared by the checks; the whole file runs in
about 50 s on one loaded CPU core.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any
from typing import Callable
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from tests import reference as ref

D, H, R = 8, 2, 3  # the frame leaf: (d, heads, r)
FRAME = ("query", "kernel")  # where the frame leaf sits in every params tree
STEPS = 20
# The checks' programs compile at XLA's lowest backend optimization level: they are
# tiny, and their compile time, not their run time, is the cost of the suite.
JIT = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


@dataclasses.dataclass(frozen=True)
class Case:
  """One public factory with the kwargs it is built with and what it promises.

  Attributes:
    factory: the public factory (wrapped by ``optax.inject_hyperparams``).
    kwargs: its arguments; ``learning_rate`` among them when it takes one.
    params: ``"frames"`` (the frame leaf only), ``"model"`` (plus a Dense layer) or
      ``"sphere"`` (a non-orthonormal leaf plus a vector).
    manifold: ``"stiefel"`` or ``"sphere"`` when applying the updates keeps the
      frames on that manifold; ``None`` for a transform whose output is not a step
      (the checks then keep the params fixed).
    nonfinite: a non-finite gradient leaves the frames and their state unchanged.
    lr_leaves: the top-level keys whose update the learning rate scales.
    reference: ``fn(w, grads) -> list`` in float64 on ``(H, d, r)`` frames: the
      iterates (a manifold optimizer) or the outputs at fixed ``w`` (a transform).
    frame_state: the part of the state that belongs to the frames.
    static_args: arguments that ``optax.inject_hyperparams`` must keep static
      (integer iteration counts, as for ``optax.contrib.muon``'s ``ns_steps``).
  """

  factory: Callable[..., optax.GradientTransformation]
  kwargs: dict = dataclasses.field(default_factory=dict)
  params: str = "frames"
  manifold: Optional[str] = "stiefel"
  nonfinite: bool = True
  lr_leaves: tuple = ("query", "dense")
  reference: Optional[Callable[[np.ndarray, list], list]] = None
  frame_state: Callable[[Any], Any] = lambda state: state
  static_args: tuple = ()

  def make(self) -> optax.GradientTransformation:
    return self.factory(**self.kwargs)


def _adam_ref(**kw):
  def fn(w, grads):
    opt, out = ref.RiemannianAdam(**kw), []
    for g in grads:
      w = opt.step(w, g)
      out.append(w)
    return out

  return fn


def _sgd_ref(**kw):
  def fn(w, grads):
    out = []
    for g in grads:
      w = ref.riemannian_sgd(w, g, **kw)
      out.append(w)
    return out

  return fn


def _per_head_ref(step):
  """A stateless transform at fixed ``w``: ``step(W, g)`` per head and gradient."""
  return lambda w, grads: [np.stack([step(w[h], g[h]) for h in range(len(w))]) for g in grads]


def _cap(tau):
  def step(_, g):
    limit = tau * np.sqrt(g.shape[1])
    norm = np.linalg.norm(g)
    return g * min(1.0, limit / norm)

  return step


def _stiefel_state(state):
  return state.inner_states["stiefel"]


# Small dual and Newton-Schulz counts keep the Muon programs short to compile; the
# solver's accuracy at the defaults is tested in test_muon.py.
MUON = dict(iterations=3, ns_iterations=5)

CASES = {
  # Riemannian Adam: the fused default, the literal chain, the elementwise moment.
  "adam": Case(stiefax.riemannian_adam, dict(learning_rate=1.0), reference=_adam_ref()),
  "adam-chain": Case(
    stiefax.riemannian_adam, dict(learning_rate=1.0, fused=False), reference=_adam_ref()
  ),
  "adam-elementwise": Case(
    stiefax.riemannian_adam,
    dict(learning_rate=0.03, moment="elementwise", projector="grassmann"),
    reference=_adam_ref(lr=0.03, moment="elementwise", projector="grassmann"),
  ),
  # With each retraction.
  "adam-qr": Case(
    stiefax.riemannian_adam,
    dict(learning_rate=1.0, retraction="qr"),
    reference=_adam_ref(retraction="qr"),
  ),
  "adam-cayley-chain": Case(
    stiefax.riemannian_adam,
    dict(
      learning_rate=0.01, retraction="cayley", projector="canonical", max_norm=None, fused=False
    ),
    reference=_adam_ref(lr=0.01, retraction="cayley", projector="canonical", max_norm=None),
  ),
  # Riemannian SGD.
  "sgd": Case(stiefax.riemannian_sgd, dict(learning_rate=0.05), reference=_sgd_ref(lr=0.05)),
  "sgd-cayley": Case(
    stiefax.riemannian_sgd,
    dict(learning_rate=0.05, projector="stiefel", retraction="cayley"),
    reference=_sgd_ref(lr=0.05, projector="stiefel", retraction="cayley"),
  ),
  # Manifold Muon.
  "muon": Case(stiefax.manifold_muon, dict(learning_rate=0.05, **MUON), static_args=tuple(MUON)),
  # The whole-model optimizer: frames plus AdamW for the rest.
  "stiefel_adamw": Case(
    stiefax.stiefel_adamw,
    dict(learning_rate=1e-2, weight_decay=0.1),
    params="model",
    lr_leaves=("dense",),
    frame_state=_stiefel_state,
    reference=_adam_ref(),
  ),
  # Frames on spheres.
  "hyperball_adam": Case(
    stiefax.hyperball_adam, dict(learning_rate=1.0), params="sphere", manifold="sphere"
  ),
  # The transforms.
  "stiefel_project": Case(
    stiefax.stiefel_project,
    manifold=None,
    nonfinite=False,
    reference=_per_head_ref(ref.stiefel_project),
  ),
  "grassmann_project": Case(
    stiefax.grassmann_project,
    manifold=None,
    nonfinite=False,
    reference=_per_head_ref(ref.grassmann_project),
  ),
  "canonical_gradient": Case(
    stiefax.canonical_gradient,
    manifold=None,
    nonfinite=False,
    reference=_per_head_ref(ref.canonical_gradient),
  ),
  "scalar_moment": Case(stiefax.scalar_moment, manifold=None),
  "elementwise_moment": Case(stiefax.elementwise_moment, manifold=None),
  "step_norm_cap": Case(
    stiefax.step_norm_cap,
    dict(max_norm=0.1),
    manifold=None,
    nonfinite=False,
    reference=_per_head_ref(_cap(0.1)),
  ),
  "polar_retract": Case(
    stiefax.polar_retract, reference=_per_head_ref(lambda w, g: ref.polar(w + g) - w)
  ),
  "retract-qr": Case(
    stiefax.retract,
    dict(retraction="qr"),
    reference=_per_head_ref(lambda w, g: ref.qr_retract(w, g) - w),
  ),
  "retract-cayley": Case(
    stiefax.retract,
    dict(retraction="cayley"),
    reference=_per_head_ref(lambda w, g: ref.cayley_retract(w, g) - w),
  ),
  "sphere_project": Case(stiefax.sphere_project, params="sphere", manifold=None, nonfinite=False),
  "sphere_retract": Case(stiefax.sphere_retract, params="sphere", manifold="sphere"),
}
NAMES = sorted(CASES)
WITH_LR = [n for n in NAMES if "learning_rate" in CASES[n].kwargs]
ON_MANIFOLD = [n for n in NAMES if CASES[n].manifold is not None]
NONFINITE = [n for n in NAMES if CASES[n].nonfinite]
WITH_REFERENCE = [n for n in NAMES if CASES[n].reference is not None]


def test_the_table_covers_every_public_factory():
  public = {
    name
    for name in stiefax.__all__
    if callable(getattr(stiefax, name))
    and not isinstance(getattr(stiefax, name), type)
    and name[0].islower()
  }
  covered = {case.factory.__name__ for case in CASES.values()}
  assert public <= covered, sorted(public - covered)


# ----------------------------------------------------------------------------
# Trees and gradients.
# ----------------------------------------------------------------------------


def _frames(seed: int) -> np.ndarray:
  """A ``(d, H, r)`` kernel of Haar-random orthonormal frames, float64."""
  w = ref.random_frames(np.random.default_rng(seed), (H, D, R))
  return np.transpose(w, (1, 0, 2))


def make_params(kind: str, dtype=jnp.float32, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed + 100)
  if kind == "sphere":  # any leaf works on the sphere: not orthonormal, and a vector
    return {
      "query": {"kernel": jnp.asarray(1.5 * rng.standard_normal((D, H, R)), dtype)},
      "dense": {"bias": jnp.asarray(rng.standard_normal(4), dtype)},
    }
  params = {"query": {"kernel": jnp.asarray(_frames(seed), dtype)}}
  if kind == "model":
    params["dense"] = {
      "kernel": jnp.asarray(rng.standard_normal((4, 4)), dtype),
      "bias": jnp.asarray(rng.standard_normal(4), dtype),
    }
  return params


def make_grads(params, key, scale=1.0):
  """Gaussian gradients, one key per leaf, with a random overall scale."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(key, len(leaves) + 1)
  s = scale * jnp.exp(jax.random.normal(keys[-1], ()))
  return treedef.unflatten(
    [(s * jax.random.normal(k, x.shape)).astype(x.dtype) for k, x in zip(keys, leaves)]
  )


def frame_leaf(tree):
  return tree[FRAME[0]][FRAME[1]]


def _max_diff(a, b) -> float:
  pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b))
  return max((float(jnp.max(jnp.abs(x - y))) for x, y in pairs), default=0.0)


def _step(case: Case, params, updates):
  """The next params: updates applied by an optimizer, kept fixed for a transform."""
  return optax.apply_updates(params, updates) if case.manifold is not None else params


@functools.cache
def transform(name: str) -> optax.GradientTransformation:
  return CASES[name].make()


@functools.cache
def _compiled_update(name: str):
  return JIT(transform(name).update)


def plain(name: str, grads, state, params):
  """One update of the case's own transform (one jitted program per case and dtype)."""
  return _compiled_update(name)(grads, state, params)


@functools.cache
def stepped(name: str):
  """``STEPS`` updates, each inside ``lax.cond`` inside a jitted ``lax.scan``.

  ``init`` runs under ``jit`` too. The predicates are arguments, so both branches of
  the cond run in the same program, called ``STEPS / 2`` times. Returns (initial
  params, final params, the state of an eager init, the final state, how many steps
  took the update branch).
  """
  case = CASES[name]
  tx = transform(name)
  params = make_params(case.params)

  @JIT
  def steps(params, state, grads, preds):
    def body(carry, xs):
      grads, pred = xs

      def take(operand):
        params, state = operand
        updates, state = tx.update(grads, state, params)
        return _step(case, params, updates), state

      return jax.lax.cond(pred, take, lambda operand: operand, carry), None

    return jax.lax.scan(body, (params, state), (grads, preds))[0]

  preds = np.random.default_rng(0).random(STEPS) < 0.7
  preds[:2] = True, False
  out, state = params, JIT(tx.init)(params)
  for i in range(0, STEPS, 2):
    grads = [make_grads(out, jax.random.key(100 + i + j), 0.1) for j in range(2)]
    out, state = steps(out, state, jax.tree.map(lambda *g: jnp.stack(g), *grads), preds[i : i + 2])
  assert steps._cache_size() == 1
  return params, out, tx.init(params), state, int(np.sum(preds))


@functools.cache
def wrapped(name: str):
  """``optax.MultiSteps`` (every 2) over ``optax.inject_hyperparams`` of the factory
  (when it takes a learning rate); its jitted update passes extra arguments, which
  MultiSteps hands to the inner update through ``optax.with_extra_args_support``."""
  case = CASES[name]
  if "learning_rate" in case.kwargs:
    inner = optax.inject_hyperparams(case.factory, static_args=case.static_args)(**case.kwargs)
  else:
    inner = case.make()
  multi = optax.MultiSteps(inner, every_k_schedule=2)
  update = JIT(lambda g, s, p, v: multi.update(g, s, p, value=v, step=7))
  return multi, lambda g, s, p: update(g, s, p, jnp.asarray(1.0)), update


@functools.cache
def accumulated(name: str):
  """Two MultiSteps updates from init; returns (params, g1, g2, u1, u2, state)."""
  case = CASES[name]
  multi, update, _ = wrapped(name)
  params = make_params(case.params)
  g1, g2 = make_grads(params, jax.random.key(1)), make_grads(params, jax.random.key(2))
  state = multi.init(params)
  u1, state = update(g1, state, params)
  u2, state = update(g2, state, params)
  return params, g1, g2, u1, u2, state


def _signature(tree):
  return jax.tree.structure(tree), [(x.shape, x.dtype) for x in jax.tree.leaves(tree)]


def _zero(tree) -> bool:
  return all(bool(jnp.all(x == 0)) for x in jax.tree.leaves(tree))


def _finite(tree) -> bool:
  return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


def _mean(a, b):
  return jax.tree.map(lambda x, y: (x + y) / 2, a, b)


# ----------------------------------------------------------------------------
# The checks.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_jit_init_and_update_inside_cond(name):
  params, out, state0, state, taken = stepped(name)
  assert 0 < taken < STEPS  # both branches of the cond ran
  # The state keeps its structure, shapes and dtypes (those of an eager init).
  assert _signature(state) == _signature(state0)
  assert _signature(out) == _signature(params)
  assert _finite((out, state))
  moments = [(p, x) for p, x in _paths(state) if not _counter(p)]
  if moments:  # the state moved (beyond counters)
    old = dict(_paths(state0))
    assert any(bool(jnp.any(x != old[p])) for p, x in moments)
  # And one eager step agrees on the signature of the updates.
  updates, _ = plain(name, make_grads(params, jax.random.key(1)), state0, params)
  assert _signature(updates) == _signature(params)
  assert not _zero(updates)


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
      np.testing.assert_allclose(
        jnp.sqrt(jnp.sum(b**2, axis=axes)), jnp.sqrt(jnp.sum(a**2, axis=axes)), rtol=1e-5
      )


@pytest.mark.parametrize("name", NAMES)
def test_multisteps_accumulates_then_applies_the_mean(name):
  case = CASES[name]
  params, g1, g2, u1, u2, state = accumulated(name)
  assert _zero(u1)
  expected, inner = plain(name, _mean(g1, g2), transform(name).init(params), params)
  assert _max_diff(u2, expected) < 1e-5
  assert not _zero(u2)
  inner_state = state.inner_opt_state
  if "learning_rate" in case.kwargs:
    inner_state = inner_state.inner_state
  assert _signature(inner_state) == _signature(inner)


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
  np.testing.assert_allclose(hyper["learning_rate"], case.kwargs["learning_rate"], rtol=1e-6)
  # A new rate is a new value of the same program: zero freezes what it scales.
  size = compiled._cache_size()
  hyper["learning_rate"] = jnp.zeros_like(hyper["learning_rate"])
  for g in grads[2:]:
    u0, state = update(g, state, params)
  assert compiled._cache_size() == size
  for key in case.lr_leaves:
    if key in u0:
      assert _zero(u0[key]) and not _zero(u[key]), key


@pytest.mark.parametrize("name", NAMES)
def test_extra_args_are_accepted(name):
  tx = transform(name)
  assert isinstance(optax.with_extra_args_support(tx), optax.GradientTransformationExtraArgs)
  # The MultiSteps program passes value= and step= down to the update.
  params, g1, g2, _, u2, _ = accumulated(name)
  expected, _ = plain(name, _mean(g1, g2), tx.init(params), params)
  assert _max_diff(u2, expected) < 1e-5


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
  params = _step(case, params, updates)
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
  np.testing.assert_array_equal(frame_leaf(new), frame_leaf(params))
  if case.params == "sphere":
    np.testing.assert_array_equal(new["dense"]["bias"], params["dense"]["bias"])
  after = dict(_paths(case.frame_state(new_state)))
  for path, x in moments:
    np.testing.assert_array_equal(after[path], x, err_msg=path)
  assert _finite(new_state)
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
  worst = max(float(np.max(np.abs(a - b))) for a, b in zip(outs, expected))
  assert worst < 1e-10, worst
  assert float(np.max(np.abs(outs[-1] - (w0 if optimizer else 0)))) > 1e-3  # it moved
