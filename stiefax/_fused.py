"""The scalar-moment Riemannian Adam in one pass per frame (``riemannian_adam(1.0, fused=True)``).

The chain ``projector -> scalar_moment -> scale_by_learning_rate -> step_norm_cap ->
retraction`` computed leaf by leaf with shared products
(:func:`stiefax.geometry.project_and_transport`), the cap as a per-frame scalar on the
first moment, and no rounding to the parameter dtype between the transforms. The state
is the chain's own: the update finds the moment and retraction states in it by type,
and a schedule's step count as the one other entry that holds arrays, so the tree
users checkpoint is the one ``fused=False`` gives.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from stiefax import _routing
from stiefax import geometry
from stiefax._routing import expand
from stiefax.frames import FramesLike
from stiefax.layouts import checked_frames
from stiefax.transforms import PolarRetractState
from stiefax.transforms import ScalarMomentState

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
) -> optax.GradientTransformation:
  """``chain`` (the scalar-moment :func:`stiefax.riemannian_adam`) in one pass per frame.

  ``lr_tx`` is the chain's ``scale_by_learning_rate`` and ``scheduled`` whether its
  rate is a schedule (whose state, a step count, is then in the chain's state); the
  other arguments are those the chain was built with. ``init`` is the chain's;
  ``update`` gives the chain's update and state to rounding.
  """

  def update_fn(updates, state, params=None):
    _routing.require_params("riemannian_adam", params, updates)
    # Traced b1, b2, eps out of range skip the frame-step in the moment (counted there);
    # a traced tau out of range makes the step NaN, skipped by the retraction (as the
    # chain's step_norm_cap does).
    moment_ok = _routing.hyperparams_ok(b1=b1, b2=b2, eps=eps)
    cap_ok = _routing.hyperparams_ok(max_norm=max_norm)
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
    ones = jax.tree.map(lambda w: jnp.ones([], geometry.compute_dtype(w.dtype)), params)
    lr_state = states[held[0]] if scheduled else optax.EmptyState()
    neg_lr, lr_state = lr_tx.update(ones, lr_state)
    if scheduled:
      states[held[0]] = lr_state

    def leaf(path, g, w, mu, nu, m_skipped, r_skipped, neg_lr):
      spec = checked_frames(frames, path, w)
      cd = jnp.promote_types(_routing.update_dtype(g, w), nu.dtype)
      wf = spec.to_frames(w).astype(cd)
      m_prev = spec.to_frames(mu).astype(cd)
      xi, m = geometry.project_and_transport(
        wf,
        spec.to_frames(g).astype(cd),
        m_prev,
        b1,
        projector,
        concat=spec.is_contiguous(w.ndim),
      )
      sq_norm = geometry.frame_sq_norm(xi)
      finite = jnp.isfinite(sq_norm)
      if moment_ok is not None:
        finite = finite & moment_ok
      m = jnp.where(expand(finite), m, m_prev)  # a skipped frame keeps m
      v = b2 * nu.astype(cd) + (1 - b2) * jnp.where(finite, sq_norm, 0)
      coef = jnp.where(finite, geometry.adam_coefficient(v, count, b1, b2, eps), 0)
      coef = coef * neg_lr.astype(cd)  # eta = coef * m, before the cap
      m_sq = geometry.frame_sq_norm(m)
      if max_norm is not None:
        norm = jnp.abs(coef) * jnp.sqrt(m_sq)
        limit = jnp.asarray(max_norm, cd) * math.sqrt(wf.shape[-1])
        coef = coef * _routing.nan_unless(cap_ok, _routing.cap_factor(norm, limit))
      delta, eta_finite = geometry.retraction_step(
        wf,
        expand(coef) * m,
        retraction=retraction,
        method=method,
        step_bound=step_bound,
        sq_norm=coef * coef * m_sq,
      )
      return (
        spec.from_frames(delta, g.shape).astype(w.dtype),
        spec.from_frames(m, w.shape).astype(mu.dtype),
        jnp.where(finite, v, nu).astype(nu.dtype),
        m_skipped + (~finite).astype(jnp.int32),
        r_skipped + (~eta_finite).astype(jnp.int32),
      )

    out, mu, nu, m_skipped, r_skipped = _routing.per_leaf(
      leaf,
      5,
      updates,
      params,
      moment_state.mu,
      moment_state.nu,
      moment_state.skipped,
      retract_state.skipped,
      neg_lr,
    )
    states[i_moment] = moment_state._replace(count=count, mu=mu, nu=nu, skipped=m_skipped)
    states[i_retract] = retract_state._replace(skipped=r_skipped)
    return out, tuple(states)

  return optax.GradientTransformation(chain.init, update_fn)
