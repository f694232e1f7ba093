"""The scalar-moment Riemannian Adam in one pass per frame (``riemannian_adam(1.0, fused=True)``).

The chain ``projector -> scalar_moment -> scale_by_learning_rate -> step_norm_cap ->
retraction`` computed with shared products
(:func:`stiefax.geometry.project_and_transport`), the cap as a per-frame scalar on the
first moment, and no rounding to the parameter dtype between the transforms. Per frame
``W`` with gradient ``g`` (the paper's section 3.2)::

    xi  = Pi_W(g),   m = Pi_W(b1 m_prev + (1 - b1) xi)      # eq. (3) and its transport
    v   = b2 v_prev + (1 - b2) ||xi||_F^2                     # one scalar per frame
    eta = -lr m / ((1 - b1^t) (sqrt(v / (1 - b2^t)) + eps))
    eta = eta min(1, tau sqrt(r) / ||eta||_F)                 # the cap, Proposition 6
    W  <- polar(W + eta)                                      # Newton-Schulz after the cap

Every operation above acts on one frame at a time (batched matrix products, reductions
over each frame's own ``d x r`` entries), so a batch of frames can be any stack of
frames. The update therefore stacks every frame leaf of the same batch shape, ``d``,
``r`` and compute dtype (the query and key kernels of every layer of a model written
layer by layer) along a new leading axis, runs the formulas once per group, and splits
the result back into its leaves: the device runs one projection, one moment update,
one cap and one retraction per group instead of per leaf. Stacking along a new axis
keeps each leaf's own sharding (heads or rows stay on their devices), so grouping adds
no collective when the leaves of a group are sharded alike.

The state is the chain's own, leaf by leaf: the update finds the moment and retraction
states in it by type, and a schedule's step count as the one other entry that holds
arrays, so the tree users checkpoint is the one ``fused=False`` gives.
"""

from __future__ import annotations

import math
from typing import Any
from typing import NamedTuple
from typing import Optional

import jax
import jax.numpy as jnp
import optax

from stiefax import _checks
from stiefax import _geometry as geometry
from stiefax import _routing
from stiefax._frames import FrameSpec
from stiefax._matrix import compute_dtype
from stiefax._moments import ScalarMomentState
from stiefax._resolve import FramesLike
from stiefax._resolve import checked_frames
from stiefax._routing import expand
from stiefax._transforms import PolarRetractState

_WRONG_STATE = (
  "riemannian_adam: the optimizer state holds {n} {kind} entries where the fused update"
  " needs exactly one (found the state types {types}). Pass the state that this"
  " optimizer's init returned (the fused update finds its moment and retraction states"
  " by type), or build the optimizer with fused=False to run the literal chain."
)


def _index(states: tuple, cls: type) -> int:
  """The position of the one state of type ``cls`` in a chain's state."""
  found = [i for i, s in enumerate(states) if isinstance(s, cls)]
  if len(found) != 1:
    types = tuple(type(s).__name__ for s in states)
    raise ValueError(_WRONG_STATE.format(n=len(found), kind=cls.__name__, types=types))
  return found[0]


def group_by_default() -> bool:
  """Whether ``group_frames=None`` groups: on every backend but the CPU.

  On an accelerator a small update is bound by kernel launches, which grouping makes
  independent of the number of leaves. On the CPU a call costs no launch, and one
  leaf's frames stay in cache where a stacked group does not: grouped, the update of
  a 12-layer GPT-2-small tree took 1.5x the per-leaf time on a 2-core CPU
  (docs/performance.md), so the CPU updates one leaf at a time.
  """
  return jax.default_backend() != "cpu"


class _Leaf(NamedTuple):
  """One frame leaf of the update: its FrameSpec and its entry in each input tree."""

  spec: FrameSpec
  g: Any
  w: Any
  mu: Any
  nu: Any
  m_skipped: Any
  r_skipped: Any
  neg_lr: Any

  @property
  def compute_dtype(self) -> Any:
    """float32, or the widest of the update's, the parameter's and the moment's dtypes."""
    return jnp.promote_types(_routing.update_dtype(self.g, self.w), self.nu.dtype)


def _groups(leaves: list[_Leaf], group: bool) -> list[list[list[int]]]:
  """The leaves updated together, as lists of leaf indices by layout.

  A group holds the leaves of one frame batch shape, ``d``, ``r`` and compute dtype;
  within it, a layout the leaves of one FrameSpec, shape and dtypes (stacked as they
  are stored). In the order of their first leaf; one leaf per group when ``group`` is
  False.
  """
  if not group:
    return [[[i]] for i in range(len(leaves))]
  found: dict[tuple, dict[tuple, list[int]]] = {}
  for i, x in enumerate(leaves):
    key = (x.spec.frame_shape(x.w.shape), jnp.dtype(x.compute_dtype))
    layout = (x.spec, x.w.shape) + tuple(
      jnp.dtype(a.dtype) for a in (x.g, x.w, x.mu, x.nu, x.neg_lr)
    )
    found.setdefault(key, {}).setdefault(layout, []).append(i)
  return [list(layouts.values()) for layouts in found.values()]


_STACKED = ("w", "g", "mu", "nu")


def _cat(parts: list[jax.Array]) -> jax.Array:
  return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


class _Layout:
  """The leaves of one layout in a group, stacked along a new leading axis."""

  def __init__(self, leaves: list[_Leaf], members: list[int], cd: Any):
    self.members = members
    group = [leaves[i] for i in members]
    self.spec, self.shape = group[0].spec, group[0].w.shape
    self.dtypes = {f: getattr(group[0], f).dtype for f in ("g", "w", "mu", "nu")}
    stack = {f: jnp.stack([getattr(x, f) for x in group]) for f in _Leaf._fields[1:]}
    to_frames = jax.vmap(self.spec.to_frames)
    self.w, self.g, self.mu = (to_frames(stack[f]).astype(cd) for f in ("w", "g", "mu"))
    self.nu = stack["nu"].astype(cd)
    self.neg_lr = stack["neg_lr"].astype(cd)
    self.m_skipped, self.r_skipped = stack["m_skipped"], stack["r_skipped"]

  def results(
    self, delta: jax.Array, m: jax.Array, v: jax.Array, finite: jax.Array, eta_finite: jax.Array
  ) -> list[tuple[jax.Array, ...]]:
    """Each leaf's update, moment, second moment and counters from its part of the group."""
    from_frames = jax.vmap(lambda f: self.spec.from_frames(f, self.shape))
    stacked = (
      from_frames(delta).astype(self.dtypes["w"]),
      from_frames(m).astype(self.dtypes["mu"]),
      v.astype(self.dtypes["nu"]),
      self.m_skipped + (~finite).astype(jnp.int32),
      self.r_skipped + (~eta_finite).astype(jnp.int32),
    )
    return [tuple(a[j] for a in stacked) for j in range(len(self.members))]


def fused_scalar_adam(
  chain: optax.GradientTransformation,
  lr_tx: optax.GradientTransformation,
  *,
  scheduled: bool,
  b1: Any,
  b2: Any,
  eps: Any,
  max_norm: Any,
  projector: str,
  method: str,
  step_bound: Any,
  retraction: str,
  frames: FramesLike,
  group_frames: Optional[bool] = None,
) -> optax.GradientTransformation:
  """``chain`` (the scalar-moment :func:`stiefax.riemannian_adam`) in one pass per frame.

  ``lr_tx`` is the chain's ``scale_by_learning_rate`` and ``scheduled`` whether its
  rate is a schedule (whose state, a step count, is then in the chain's state); the
  other arguments are those the chain was built with. ``group_frames`` updates the
  frame leaves of one batch shape, ``d``, ``r`` and compute dtype in one batched pass
  (stacked along a new axis); ``False`` updates each leaf on its own, and ``None``
  groups unless the default backend is the CPU (read when the update is traced; see
  :func:`group_by_default`). ``init`` is the chain's; ``update`` gives the chain's
  update and state to rounding, grouped or not.
  """

  def update_fn(
    updates: optax.Updates, state: optax.OptState, params: Optional[optax.Params] = None
  ) -> tuple[optax.Updates, optax.OptState]:
    _checks.require_params("riemannian_adam", params, updates)
    # Traced b1, b2, eps out of range skip the frame-step in the moment (counted there);
    # a traced tau out of range makes the step NaN, skipped by the retraction (as the
    # chain's step_norm_cap does).
    moment_ok = _checks.hyperparams_ok(b1=b1, b2=b2, eps=eps)
    cap_ok = _checks.hyperparams_ok(max_norm=max_norm)
    if not isinstance(state, tuple) or isinstance(state, (ScalarMomentState, PolarRetractState)):
      raise ValueError(_WRONG_STATE.format(n=0, kind="chain", types=(type(state).__name__,)))
    states = list(state)
    i_moment = _index(state, ScalarMomentState)
    i_retract = _index(state, PolarRetractState)
    moment_state, retract_state = states[i_moment], states[i_retract]
    count = optax.safe_increment(moment_state.count)
    # The learning rate (or schedule) acts through its own transform and state. A
    # schedule's state is the one entry besides the moment's and the retraction's that
    # holds arrays (the projection, the cap and a constant rate keep none).
    held = [
      i for i, s in enumerate(states) if i not in (i_moment, i_retract) and jax.tree.leaves(s)
    ]
    if scheduled and len(held) != 1:
      types = tuple(type(s).__name__ for s in states)
      raise ValueError(_WRONG_STATE.format(n=len(held), kind="learning-rate", types=types))
    ones = jax.tree.map(lambda w: jnp.ones([], compute_dtype(w.dtype)), params)
    lr_state = states[held[0]] if scheduled else optax.EmptyState()
    neg_lr, lr_state = lr_tx.update(ones, lr_state)
    if scheduled:
      states[held[0]] = lr_state

    def step(
      wf: jax.Array,
      gf: jax.Array,
      m_prev: jax.Array,
      nu: jax.Array,
      neg_lr: jax.Array,
      concat: bool,
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
      """One update of a batch of frames ``(..., d, r)`` in the compute dtype."""
      xi, m = geometry.project_and_transport(wf, gf, m_prev, b1, projector, concat=concat)
      sq_norm = geometry.frame_sq_norm(xi)
      finite = jnp.isfinite(sq_norm)
      if moment_ok is not None:
        finite = finite & moment_ok
      m = jnp.where(expand(finite), m, m_prev)  # a skipped frame keeps m
      v = b2 * nu + (1 - b2) * jnp.where(finite, sq_norm, 0)
      coef = jnp.where(finite, geometry.adam_coefficient(v, count, b1, b2, eps), 0)
      coef = coef * neg_lr  # eta = coef * m, before the cap
      m_sq = geometry.frame_sq_norm(m)
      if max_norm is not None:
        norm = jnp.abs(coef) * jnp.sqrt(m_sq)
        limit = jnp.asarray(max_norm, coef.dtype) * math.sqrt(wf.shape[-1])
        coef = coef * _checks.nan_unless(cap_ok, _routing.cap_factor(norm, limit))
      delta, eta_finite = geometry.retraction_step(
        wf,
        expand(coef) * m,
        retraction=retraction,
        method=method,
        step_bound=step_bound,
        sq_norm=coef * coef * m_sq,
      )
      return delta, m, jnp.where(finite, v, nu), finite, eta_finite

    flat, treedef = jax.tree_util.tree_flatten_with_path(updates)
    trees = (
      params,
      moment_state.mu,
      moment_state.nu,
      moment_state.skipped,
      retract_state.skipped,
      neg_lr,
    )
    leaves = [
      _Leaf(checked_frames(frames, path, w), g, w, *rest)
      for (path, g), w, *rest in zip(flat, *(treedef.flatten_up_to(t) for t in trees))  # type: ignore[attr-defined]  # PyTreeDef is opaque to mypy
    ]
    results: list[Any] = [None] * len(leaves)
    grouped = group_by_default() if group_frames is None else bool(group_frames)
    for group in _groups(leaves, grouped):
      cd = leaves[group[0][0]].compute_dtype
      if len(group) == 1 and len(group[0]) == 1:
        # One leaf: its own layout (the products read W through its transpose).
        (i,) = group[0]
        x = leaves[i]
        delta, m, v, finite, eta_finite = step(
          x.spec.to_frames(x.w).astype(cd),
          x.spec.to_frames(x.g).astype(cd),
          x.spec.to_frames(x.mu).astype(cd),
          x.nu.astype(cd),
          x.neg_lr.astype(cd),
          x.spec.is_contiguous(x.w.ndim),
        )
        results[i] = (
          x.spec.from_frames(delta, x.g.shape).astype(x.w.dtype),
          x.spec.from_frames(m, x.w.shape).astype(x.mu.dtype),
          v.astype(x.nu.dtype),
          x.m_skipped + (~finite).astype(jnp.int32),
          x.r_skipped + (~eta_finite).astype(jnp.int32),
        )
        continue
      # Each layout's leaves are stacked as they are stored, viewed as frames in one
      # transpose, and the layouts concatenated along the stacking axis.
      layouts = [_Layout(leaves, idx, cd) for idx in group]
      n_batch = len(leaves[group[0][0]].nu.shape)
      wf, gf, m_prev, nu = (_cat([getattr(lay, f) for lay in layouts]) for f in _STACKED)
      lr = _cat([lay.neg_lr for lay in layouts]).reshape((-1,) + (1,) * n_batch)
      # One layout: its products read W through the transpose, as a single leaf's do.
      x = leaves[group[0][0]]
      concat = len(layouts) > 1 or x.spec.is_contiguous(x.w.ndim)
      outs = step(wf, gf, m_prev, nu, lr, concat)
      start = 0
      for lay in layouts:
        part = [o[start : start + len(lay.members)] for o in outs]
        start += len(lay.members)
        for i, res in zip(lay.members, lay.results(*part)):
          results[i] = res
    out, mu, nu, m_skipped, r_skipped = (
      treedef.unflatten([r[k] for r in results])  # type: ignore[attr-defined]  # PyTreeDef is opaque to mypy
      for k in range(5)
    )
    states[i_moment] = moment_state._replace(count=count, mu=mu, nu=nu, skipped=m_skipped)
    states[i_retract] = retract_state._replace(skipped=r_skipped)
    return out, tuple(states)

  return optax.GradientTransformation(chain.init, update_fn)
