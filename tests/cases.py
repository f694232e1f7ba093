"""The common suite's table: every public optimizer and transform, and the helpers
that build, step and wrap them.

:mod:`tests.test_common` crosses each case with Optax's harness checks, and
:mod:`tests.golden` freezes each case's float64 trajectory.
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
    # The frames' rate follows the injected one (peak_learning_rate: the rule's peak).
    dict(learning_rate=1e-2, weight_decay=0.1, peak_learning_rate=1e-2),
    params="model",
    lr_leaves=("query", "dense"),
    frame_state=_stiefel_state,
    reference=_adam_ref(),
  ),
  # Frames on spheres.
  "hyperball_adam": Case(
    stiefax.sphere.sphere_adam, dict(learning_rate=1.0), params="sphere", manifold="sphere"
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
  "sphere_project": Case(
    stiefax.sphere.sphere_project, params="sphere", manifold=None, nonfinite=False
  ),
  "sphere_retract": Case(stiefax.sphere.sphere_retract, params="sphere", manifold="sphere"),
}
NAMES = sorted(CASES)
WITH_LR = [n for n in NAMES if "learning_rate" in CASES[n].kwargs]
ON_MANIFOLD = [n for n in NAMES if CASES[n].manifold is not None]
NONFINITE = [n for n in NAMES if CASES[n].nonfinite]
WITH_REFERENCE = [n for n in NAMES if CASES[n].reference is not None]


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


def apply_step(case: Case, params, updates):
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
        return apply_step(case, params, updates), state

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


def is_zero(tree) -> bool:
  return all(bool(jnp.all(x == 0)) for x in jax.tree.leaves(tree))


def tree_mean(a, b):
  return jax.tree.map(lambda x, y: (x + y) / 2, a, b)
