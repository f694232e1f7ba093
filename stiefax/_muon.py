"""Manifold Muon (the implementation behind :mod:`stiefax.muon` and :func:`stiefax.manifold_muon`)."""

from __future__ import annotations

from typing import Any
from typing import NamedTuple
from typing import Optional

import chex
import jax
import jax.numpy as jnp
import optax

from stiefax import _checks
from stiefax import _geometry as geometry
from stiefax import _routing
from stiefax import _transforms
from stiefax._matrix import compute_dtype
from stiefax._matrix import inverse_sqrt
from stiefax._resolve import FramesLike
from stiefax._resolve import checked_frames

#: Default dual iterations per update (warm-started from the previous multiplier).
DUAL_ITERATIONS = 10

#: Default Newton-Schulz iterations of each ``(Y^T Y)^{-1/2}``.
NS_ITERATIONS = 12


class SpectralStep(NamedTuple):
  """The solution of the spectral-norm subproblem for a batch of frames.

  Attributes:
    direction: ``A``, tangent, ``||A||_2 <= 1``, ``(..., d, r)``.
    multiplier: the final dual variable ``Lambda`` for ``G / ||G||_F``, ``(..., r, r)``.
    residual: ``||sym(W^T A)||_F`` before the final projection (per frame).
    gap: the relative duality gap ``(||Y||_* - tr(G^T A)) / ||Y||_*`` (per frame).
  """

  direction: jax.Array
  multiplier: jax.Array
  residual: jax.Array
  gap: jax.Array


def spectral_tangent_direction(
  w: jax.Array,
  g: jax.Array,
  multiplier: Optional[jax.Array] = None,
  *,
  iterations: int = DUAL_ITERATIONS,
  ns_iterations: int = NS_ITERATIONS,
  step_size: float = 0.5,
) -> SpectralStep:
  """Solves (P) of the module docstring for each frame by preconditioned dual ascent.

  ``max tr(G^T A)`` subject to ``||A||_2 <= 1`` and ``W^T A + A^T W = 0``. ``G`` is
  divided by its Frobenius norm first (the solution is invariant to the scale of
  ``G``), so ``multiplier`` is the multiplier of the normalized problem and can warm
  start the next call. Matrix products only; batched over the leading axes.

  Example:
    >>> import jax, jax.numpy as jnp, stiefax
    >>> from stiefax import geometry, muon
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (12, 4))
    >>> g = jax.random.normal(jax.random.key(1), (12, 4))
    >>> s = muon.spectral_tangent_direction(w, g, iterations=20)
    >>> bool(jnp.max(jnp.abs(w.T @ s.direction + s.direction.T @ w)) < 1e-5)
    True
    >>> bool(jnp.linalg.norm(s.direction, 2) <= 1 + 1e-5), bool(s.gap < 1e-5)
    (True, True)

  Args:
    w: frames ``(..., d, r)`` on the manifold.
    g: directions of the same shape (finite).
    multiplier: ``Lambda`` to start from, ``(..., r, r)`` (default: Bernstein's
      ``-sym(W^T G) / 2``, which is optimal when ``d = r``).
    iterations: dual iterations.
    ns_iterations: Newton-Schulz iterations per inverse square root.

  Returns:
    A :class:`SpectralStep`.
  """
  mT, sym = geometry.mT, geometry.sym
  norm = jnp.sqrt(geometry.frame_sq_norm(g))
  g = g / jnp.where(norm > 0, norm, 1)[..., None, None]
  m = mT(w) @ g
  c = mT(g) @ g - mT(m) @ m
  c = sym(c)
  b = m - sym(m) if multiplier is None else m + 2 * multiplier

  def evaluate(
    b: jax.Array,
  ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """The direction of ``b`` made feasible, its residual and its relative gap."""
    z, root = inverse_sqrt(mT(b) @ b + c, ns_iterations)
    tangency = sym(b @ z)  # sym(W^T A) for A = Y Z
    residual = jnp.sqrt(jnp.sum(jnp.square(tangency), axis=(-2, -1)))
    scale = 1 / (1 + residual)
    # tr(G^T A) = tr((M^T B + C) Z) and tr(G^T W sym(B Z)) = <M, sym(B Z)>, all r x r.
    primal = (
      jnp.trace((mT(m) @ b + c) @ z, axis1=-2, axis2=-1) - jnp.sum(m * tangency, axis=(-2, -1))
    ) * scale
    dual = jnp.trace(root, axis1=-2, axis2=-1)
    gap = (dual - primal) / jnp.where(dual > 0, dual, 1)
    return z, root, tangency, residual, scale, gap

  def step(
    _: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]
  ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    b, best, best_gap, best_dir, alpha = carry
    z, root, _, _, _, gap = evaluate(b)
    better = gap < best_gap
    # A step that raised the gap is retried from the best point at half the size.
    best = jnp.where(better[..., None, None], b, best)
    best_gap = jnp.where(better, gap, best_gap)
    best_dir = jnp.where(better[..., None, None], sym(root @ (b @ z + z @ mT(b))), best_dir)
    alpha = jnp.where(better, jnp.minimum(2 * alpha, step_size), 0.5 * alpha)
    return best - alpha[..., None, None] * best_dir, best, best_gap, best_dir, alpha

  inf = jnp.full(b.shape[:-2], jnp.inf, b.dtype)
  alpha = jnp.full(b.shape[:-2], step_size, b.dtype)
  carry = (b, b, inf, jnp.zeros_like(b), 2 * alpha)
  b, best, best_gap, _, _ = jax.lax.fori_loop(0, iterations, step, carry)
  z, _, tangency, residual, scale, gap = evaluate(b)
  b = jnp.where((gap < best_gap)[..., None, None], b, best)
  z, _, tangency, residual, scale, gap = evaluate(b)
  a = g @ z + w @ ((b - m) @ z)
  direction = (a - w @ tangency) * scale[..., None, None]
  return SpectralStep(direction, 0.5 * (b - m), residual, gap)


class ManifoldMuonState(NamedTuple):
  """State of :func:`manifold_muon`.

  Attributes:
    count: int32 scalar, the steps taken.
    mu: the momentum, a tree like the params, tangent at the current point.
    multiplier: the dual variable of each frame, ``(*batch, r, r)`` leaves (warm start).
    residual: per frame, the tangency residual of the last solve before projection.
    gap: per frame, the relative duality gap of the last solve.
    skipped: int32 per frame, steps skipped because the gradient was not finite.
  """

  count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as optax's states do
  mu: Any
  multiplier: Any
  residual: Any
  gap: Any
  skipped: Any


def manifold_muon(
  learning_rate: optax.ScalarOrSchedule,
  *,
  beta: chex.Numeric = 0.95,
  nesterov: bool = True,
  iterations: int = DUAL_ITERATIONS,
  ns_iterations: int = NS_ITERATIONS,
  retraction: str = "polar",
  frames: FramesLike = None,
) -> optax.GradientTransformation:
  """Manifold Muon on ``St(d, r)``: tangent momentum, spectral steepest step, retraction.

  Per frame ``W`` with Euclidean gradient ``g_t``::

      m_t = Pi_W(beta m_{t-1} + g_t)                 # momentum, transported
      G_t = Pi_W(beta m_t + g_t)  (nesterov)  or  m_t
      A_t = argmax {tr(G_t^T A) : ||A||_2 <= 1, W^T A + A^T W = 0}
      W  <- R_W(-lr * A_t)                           # a retraction, polar by default

  ``A_t`` comes from :func:`spectral_tangent_direction`: ``iterations`` steps of
  preconditioned dual ascent on Bernstein's dual, warm-started from the previous
  step's multiplier, each with an ``ns_iterations`` Newton-Schulz inverse square root
  of an ``r x r`` matrix (matrix products only, vmapped over heads by broadcasting).
  The step ``-lr A_t`` is exactly tangent and has spectral norm at most ``lr``; the
  state keeps each frame's final tangency residual (before the projection that makes
  it exact) and its relative duality gap for diagnostics. Since ``||A_t||_F <=
  sqrt(r)``, the step obeys the cap ``||eta||_F <= lr sqrt(r)`` and a static rate fixes
  the polar retraction's Newton-Schulz count (Proposition 6).

  A frame whose gradient holds a NaN or an Inf keeps its point, momentum and
  multiplier, and is counted in ``skipped``. Weight decay is never formed (it is
  normal, Proposition 8). Compose with AdamW for the other parameters through
  ``stiefax.stiefel_adamw(lr, stiefel=stiefax.manifold_muon, stiefel_learning_rate=0.05)``,
  which runs it at ``0.05 * lr(t) / peak_learning_rate`` for a schedule ``lr``.

  Example:
    >>> import jax, optax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (16, 2, 4))
    >>> tx = stiefax.manifold_muon(0.05)
    >>> state = tx.init(w)
    >>> g = jax.random.normal(jax.random.key(1), w.shape)
    >>> updates, state = tx.update(g, state, w)
    >>> w = optax.apply_updates(w, updates)
    >>> bool(stiefax.diagnostics.isometry_error(w) < 1e-5), state.gap.shape
    (True, (2,))

  Args:
    learning_rate: the spectral-norm step ``lr`` (a float or an Optax schedule).
    beta: momentum decay.
    nesterov: use the Nesterov direction ``beta m_t + g_t`` (as ``optax.contrib.muon``).
    iterations: dual iterations per update.
    ns_iterations: Newton-Schulz iterations per inverse square root.
    retraction: one of :data:`stiefax.RETRACTIONS` (see :func:`stiefax.retract`).
    frames: how each leaf is viewed as frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  geometry.retraction_by_name(retraction)  # a ValueError naming the valid ones
  _checks.check_hyperparams(
    "manifold_muon",
    learning_rate=learning_rate,
    beta=beta,
    iterations=iterations,
    ns_iterations=ns_iterations,
  )
  bound = float(learning_rate) if isinstance(learning_rate, (int, float)) else None
  lr_tx = optax.scale_by_learning_rate(learning_rate)

  def init_fn(params: optax.Params) -> ManifoldMuonState:
    def leaf(
      path: Any, w: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
      spec = checked_frames(frames, path, w)
      skipped = _routing.zeros_per_frame(spec, w, jnp.int32)
      cd = jnp.promote_types(compute_dtype(w.dtype), jnp.float32)
      r = spec.frame_shape(w.shape)[2]
      multiplier = jnp.zeros(skipped.shape + (r, r), cd)
      # Distinct buffers (a donated state must not alias one array twice).
      residual, gap = jnp.zeros_like(skipped, dtype=cd), jnp.zeros_like(skipped, dtype=cd)
      return jnp.zeros_like(w), multiplier, residual, gap, skipped

    # The retraction's init validates that the frames are on the manifold.
    with _checks.called_as("manifold_muon"):
      retract_state = _transforms.retract(retraction, frames=frames, name="manifold_muon").init(
        params
      )
    del retract_state
    mu, multiplier, residual, gap, skipped = _routing.per_leaf(leaf, 5, params)
    return ManifoldMuonState(jnp.zeros([], jnp.int32), mu, multiplier, residual, gap, skipped)

  def update_fn(
    updates: optax.Updates, state: ManifoldMuonState, params: Optional[optax.Params] = None
  ) -> tuple[optax.Updates, ManifoldMuonState]:
    _checks.require_params("manifold_muon", params, updates)
    mstate = state
    count = optax.safe_increment(mstate.count)
    # -lr from optax's own transform. A schedule reads the count before the step,
    # which is this state's count (the one the schedule's own state would hold).
    if callable(learning_rate):
      lr_state: Any = optax.ScaleByScheduleState(count=mstate.count)
    else:
      lr_state = optax.EmptyState()
    neg_lr, _ = lr_tx.update(jnp.ones([]), lr_state)
    # A traced beta or rate out of range (a schedule turned NaN): a counted skip.
    lr = -neg_lr if callable(learning_rate) else learning_rate
    ok = _checks.hyperparams_ok(beta=beta, learning_rate=lr)

    def leaf(
      path: Any,
      g: jax.Array,
      w: jax.Array,
      mu: jax.Array,
      lam: jax.Array,
      res: jax.Array,
      gap: jax.Array,
      skipped: jax.Array,
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
      spec = checked_frames(frames, path, w)
      cd = jnp.promote_types(compute_dtype(g.dtype), lam.dtype)
      wf = spec.to_frames(w).astype(cd)
      gf = spec.to_frames(g).astype(cd)
      m_prev = spec.to_frames(mu).astype(cd)
      finite = jnp.isfinite(geometry.frame_sq_norm(gf))
      if ok is not None:
        finite = finite & ok
      gf = jnp.where(_routing.expand(finite), gf, 0)
      m = geometry.stiefel_tangent(wf, beta * m_prev + gf)
      direction = geometry.stiefel_tangent(wf, beta * m + gf) if nesterov else m
      sol = spectral_tangent_direction(
        wf, direction, lam.astype(cd), iterations=iterations, ns_iterations=ns_iterations
      )
      moved = finite & (geometry.frame_sq_norm(direction) > 0)
      eta = neg_lr.astype(cd) * sol.direction
      delta, _ = geometry.retraction_step(
        wf, jnp.where(_routing.expand(moved), eta, 0), retraction=retraction, step_bound=bound
      )
      keep = _routing.expand(finite)
      keep2 = finite[..., None, None]
      return (
        spec.from_frames(delta, g.shape).astype(g.dtype),
        spec.from_frames(jnp.where(keep, m, m_prev), w.shape).astype(mu.dtype),
        jnp.where(keep2 & moved[..., None, None], sol.multiplier, lam).astype(lam.dtype),
        jnp.where(moved, sol.residual, res).astype(res.dtype),
        jnp.where(moved, sol.gap, gap).astype(gap.dtype),
        skipped + (~finite).astype(jnp.int32),
      )

    out, mu, lam, res, gap, skipped = _routing.per_leaf(
      leaf,
      6,
      updates,
      params,
      mstate.mu,
      mstate.multiplier,
      mstate.residual,
      mstate.gap,
      mstate.skipped,
    )
    return out, ManifoldMuonState(count, mu, lam, res, gap, skipped)

  return optax.GradientTransformation(init_fn, update_fn)
