"""Ready-made optimizers of the frames alone: chains of the frame transforms of :mod:`stiefax`.

The optimizer of a whole model, frames plus AdamW, is ``stiefax._stiefel_adamw``.
"""

from __future__ import annotations

from typing import Any
from typing import Optional

import chex
import optax

from stiefax import _checks
from stiefax import _geometry as geometry
from stiefax import _moments
from stiefax import _transforms
from stiefax._fused import fused_scalar_adam
from stiefax._projections import project
from stiefax._projections import step_norm_cap
from stiefax._resolve import FramesLike

__all__ = [
  "MOMENTS",
  "riemannian_adam",
  "riemannian_sgd",
]

#: Second-moment rules by name (``moment=`` of :func:`riemannian_adam`).
MOMENTS = ("scalar", "elementwise")


def riemannian_adam(
  learning_rate: optax.ScalarOrSchedule,
  *,
  b1: chex.Numeric = 0.9,
  b2: chex.Numeric = 0.999,
  eps: chex.Numeric = 1e-8,
  max_norm: Optional[chex.Numeric] = 0.1,
  projector: str = "stiefel",
  moment: str = "scalar",
  method: str = "auto",
  retraction: str = "polar",
  frames: FramesLike = None,
  mu_dtype: Any = None,
  fused: bool = True,
  group_frames: Optional[bool] = None,
  init_tol: Optional[float] = None,
) -> optax.GradientTransformation:
  r"""The corrected Riemannian Adam on ``St(d, r)`` (the paper's B2; section 3.2).

  Per frame ``W`` with Euclidean gradient ``g_t``::

      xi_t  = Pi_W(g_t)                                  # tangent projection, eq. (3)
      m_t   = Pi_W(b1 m_{t-1} + (1 - b1) xi_t)           # moment transport
      v_t   = b2 v_{t-1} + (1 - b2) ||xi_t||_F^2         # one scalar per frame
      eta_t = -lr * m_hat_t / (sqrt(v_hat_t) + eps)
      eta_t = eta_t * min(1, tau sqrt(r) / ||eta_t||_F)  # step cap, tau = max_norm
      W    <- polar(W + eta_t)                           # polar retraction
                                                         # (or another retraction)

  It is steepest descent in the embedded metric (Proposition 2), degree zero in the
  gradient at ``eps = 0`` (Proposition 3(ii)), keeps ``sigma_min(W + eta) >= 1`` and
  rotates each frame by at most ``arctan(tau sqrt(r))`` (Proposition 6), and is
  ``O(d)``-equivariant (Proposition 7). The paper's arms:

  * B2: ``riemannian_adam(1.0)`` (image task) or ``riemannian_adam(1.0, eps=1e-3)`` (grokking).
  * Grassmann-projector R-Adam: ``riemannian_adam(1.0, projector="grassmann")``.
  * elementwise ablation: ``riemannian_adam(0.03, moment="elementwise")``.
  * B2m: ``riemannian_adam(1e-3, moment="elementwise", max_norm=None)``; B2m-can adds
    ``projector="canonical"``.
  * frozen: ``riemannian_adam(0.0)`` (frames keep their initial point exactly).

  With the scalar moment the transform is the chain
  ``projector -> scalar_moment -> scale_by_learning_rate -> step_norm_cap ->
  polar_retract`` of the top-level package, with the chain's state, computed in
  one pass per frame (``fused=True``): the projection of the gradient and the
  transport of the first moment are linear in their argument, so both come from one
  product ``W^T [g | m_{t-1}]`` and one ``W [N_g | N_m]``
  (``xi = g - W N_g``, ``m_t = b1 m_{t-1} + (1 - b1) g - W N_m``; ``N_g = sym(W^T g)``
  for eq. (3)), the cap is a per-frame scalar on ``m_t``, and no intermediate step is
  rounded to the parameter dtype between transforms. The result and the state equal
  the chain's to rounding; ``fused=False`` returns the chain itself. Every operation
  acts on one frame at a time, so on an accelerator the fused update stacks the frame
  leaves of one batch shape, ``d``, ``r`` and dtype (the query and key kernels of
  every layer) and updates each such group in one batched pass: the number of device
  kernels does not grow with the number of layers.

  Example:
    >>> import jax, jax.numpy as jnp, optax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (16, 2, 4))
    >>> tx = stiefax.riemannian_adam(1.0)
    >>> state = tx.init(w)
    >>> g = jax.random.normal(jax.random.key(1), w.shape)
    >>> updates, state = tx.update(g, state, w)
    >>> w = optax.apply_updates(w, updates)
    >>> bool(stiefax.diagnostics.isometry_error(w) < 1e-5)
    True

  Args:
    learning_rate: the Riemannian rate ``eta_R`` (a float or an Optax schedule).
    b1: first-moment decay.
    b2: second-moment decay.
    eps: added to ``sqrt(v_hat)``; choose it as the tangent-gradient scale below
      which frames should stop moving (Remark 5).
    max_norm: ``tau`` of the step cap ``||eta||_F <= tau sqrt(r)``; ``None`` drops
      the cap.
    projector: ``"stiefel"`` (eq. 3), ``"grassmann"`` (horizontal) or
      ``"canonical"`` (eq. 4).
    moment: ``"scalar"`` (one ``v`` per frame) or ``"elementwise"``.
    method: the polar retraction's method, see :func:`stiefax.polar_retract`.
    retraction: one of :data:`stiefax.RETRACTIONS` (``"polar"``, the paper's, by
      default); see :func:`stiefax.retract`.
    frames: how each leaf is viewed as frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`).
    mu_dtype: dtype of the first moment (default: the parameter's).
    fused: compute the scalar-moment update in one pass per frame (default), or
      return the literal ``optax.chain`` of the transforms (``False``; same state,
      same result to rounding). The elementwise moment always runs as the chain.
    group_frames: with ``fused``, update the frame leaves of one batch shape, ``d``,
      ``r`` and compute dtype in one batched pass (``True``), or each leaf on its own
      (``False``; the same result to rounding). ``None`` (default) groups on GPUs and
      TPUs, where the update is bound by kernel launches, and not on the CPU, where a
      leaf's frames stay in cache and a stacked group is slower. Grouping stacks the
      leaves along a new axis (a copy of the frames, their gradients and moments),
      which keeps their sharding when they are sharded alike; turn it off for leaves
      of the same shape sharded differently.
    init_tol: the largest ``max|W^T W - I|`` that ``init`` accepts (default
      ``max(1e-3, 4 eps)`` of each frame's dtype; see :func:`stiefax.polar_retract`).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  _checks.check_name("moment", moment, MOMENTS)
  if group_frames is not None and not isinstance(group_frames, bool):
    raise ValueError(
      f"stiefax.riemannian_adam: group_frames must be None, True or False, got {group_frames!r}."
    )
  _checks.check_hyperparams(
    "riemannian_adam",
    learning_rate=learning_rate,
    b1=b1,
    b2=b2,
    eps=eps,
    max_norm=max_norm,
    init_tol=init_tol,
  )
  moment_fn = _moments.scalar_moment if moment == "scalar" else _moments.elementwise_moment
  transport = geometry.projection(projector).transport
  lr_tx = optax.scale_by_learning_rate(learning_rate)
  parts = [
    project(projector, frames=frames),
    moment_fn(b1, b2, eps, frames=frames, projector=transport, mu_dtype=mu_dtype),
    lr_tx,
  ]
  if max_norm is not None:
    parts.append(step_norm_cap(max_norm, frames=frames))
  # A static cap bounds the singular values of W + eta (Proposition 6), which fixes the
  # Newton-Schulz iteration count; a traced or absent cap iterates to convergence.
  bound = float(max_norm) if isinstance(max_norm, (int, float)) else None
  parts.append(_retraction(frames, retraction, method, bound, init_tol))
  chain = optax.chain(*parts)
  if not fused or moment != "scalar":
    return _checks.named_init(chain, "riemannian_adam")
  fused_tx = fused_scalar_adam(
    chain,
    lr_tx,
    scheduled=callable(learning_rate),
    b1=b1,
    b2=b2,
    eps=eps,
    max_norm=max_norm,
    projector=projector,
    method=method,
    step_bound=bound,
    retraction=retraction,
    frames=frames,
    group_frames=group_frames,
  )
  return _checks.named_init(fused_tx, "riemannian_adam")


def _retraction(
  frames: FramesLike,
  retraction: str,
  method: str,
  bound: Optional[float] = None,
  init_tol: Optional[float] = None,
) -> optax.GradientTransformation:
  """The chain's last transform, :func:`stiefax.retract` (the polar one is
  :func:`stiefax.polar_retract`, and named so in its messages)."""
  return _transforms.retract(
    retraction,
    method,
    frames=frames,
    step_bound=bound,
    init_tol=init_tol,
    name="polar_retract" if retraction == "polar" else "retract",
  )


def riemannian_sgd(
  learning_rate: optax.ScalarOrSchedule,
  *,
  projector: str = "grassmann",
  method: str = "auto",
  retraction: str = "polar",
  frames: FramesLike = None,
  init_tol: Optional[float] = None,
) -> optax.GradientTransformation:
  """Fixed-step Riemannian SGD on ``St(d, r)``: PA16 / B2-SGD (Bonnabel 2013).

  ``W <- polar(W - lr * Pi^h_W(g))`` with the Grassmann horizontal projector by
  default. The displacement is degree one in the gradient (Proposition 3(i)), so the
  frames barely move once gradients are small.

  Example:
    >>> import jax, optax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (16, 4))
    >>> tx = stiefax.riemannian_sgd(0.02)
    >>> u, _ = tx.update(
    ...     jax.random.normal(jax.random.key(1), w.shape), tx.init(w), w)
    >>> bool(stiefax.diagnostics.isometry_error(optax.apply_updates(w, u)) < 1e-5)
    True

  Args:
    learning_rate: the fixed step ``eta`` (a float or an Optax schedule).
    projector: ``"grassmann"`` (PA16), ``"stiefel"`` or ``"canonical"``.
    method: the polar retraction's method, see :func:`stiefax.polar_retract`.
    retraction: one of :data:`stiefax.RETRACTIONS`; see :func:`stiefax.retract`.
    frames: how each leaf is viewed as frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`).
    init_tol: the largest ``max|W^T W - I|`` that ``init`` accepts (default
      ``max(1e-3, 4 eps)`` of each frame's dtype).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  _checks.check_hyperparams("riemannian_sgd", learning_rate=learning_rate, init_tol=init_tol)
  chain = optax.chain(
    project(projector, frames=frames),
    optax.scale_by_learning_rate(learning_rate),
    _retraction(frames, retraction, method, init_tol=init_tol),
  )
  return _checks.named_init(chain, "riemannian_sgd")
