"""The moment transforms: :func:`scalar_moment` (the paper's) and :func:`elementwise_moment`.

Adam's first and second moments of the tangent updates of each frame, with moment
transport; the rules of ``stiefax._transforms`` (non-finite input, hyperparameter
checks, sharded states) hold for them.
"""

from __future__ import annotations

from typing import Any
from typing import NamedTuple
from typing import Optional

import jax
import jax.numpy as jnp
import optax

from stiefax import _checks
from stiefax import _geometry as geometry
from stiefax import _routing
from stiefax._matrix import compute_dtype
from stiefax._resolve import FramesLike
from stiefax._resolve import checked_frames
from stiefax._routing import expand

__all__ = [
  "ScalarMomentState",
  "ElementwiseMomentState",
  "scalar_moment",
  "elementwise_moment",
]


class ScalarMomentState(NamedTuple):
  """State of :func:`scalar_moment`.

  Attributes:
    count: int32 scalar, the steps taken (for the bias correction).
    mu: the first moment, a tree like the params, tangent at the current point.
    nu: the second moment, one scalar per frame: leaves of the frames' batch shape.
    skipped: int32 per frame, steps skipped because the update was not finite.
  """

  count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as optax's states do
  mu: Any
  nu: Any
  skipped: Any


class ElementwiseMomentState(NamedTuple):
  """State of :func:`elementwise_moment`.

  Attributes:
    count: int32 scalar, the steps taken.
    mu: the first moment, a tree like the params.
    nu: the second moment, a tree like the params (one entry per parameter entry).
    skipped: int32 per frame, steps skipped because the update was not finite.
  """

  count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as optax's states do
  mu: Any
  nu: Any
  skipped: Any


def _moment(
  name: str,
  b1: Any,
  b2: Any,
  eps: Any,
  frames: FramesLike,
  projector: str,
  elementwise: bool,
  mu_dtype: Any,
) -> optax.GradientTransformation:
  _checks.check_hyperparams(name, b1=b1, b2=b2, eps=eps)
  tangent = geometry.projection(geometry.projection(projector).transport).project
  state_cls = ElementwiseMomentState if elementwise else ScalarMomentState

  def init_fn(params: optax.Params) -> ScalarMomentState | ElementwiseMomentState:
    def leaf(path: Any, w: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
      spec = checked_frames(frames, path, w)
      nu_dtype = jnp.promote_types(compute_dtype(w.dtype), jnp.float32)
      # zeros_like: a state built from sharded params is sharded like them.
      mu = jnp.zeros_like(w, dtype=mu_dtype or w.dtype)
      skipped = _routing.zeros_per_frame(spec, w, jnp.int32)
      nu = jnp.zeros_like(w, dtype=nu_dtype) if elementwise else jnp.zeros_like(skipped, nu_dtype)
      return mu, nu, skipped

    mu, nu, skipped = _routing.per_leaf(leaf, 3, params)
    return state_cls(jnp.zeros([], jnp.int32), mu, nu, skipped)

  def update_fn(
    updates: optax.Updates,
    state: ScalarMomentState | ElementwiseMomentState,
    params: Optional[optax.Params] = None,
  ) -> tuple[optax.Updates, ScalarMomentState | ElementwiseMomentState]:
    _checks.require_params(name, params, updates)
    count = optax.safe_increment(state.count)

    def leaf(
      path: Any,
      u: jax.Array,
      w: jax.Array,
      mu: jax.Array,
      nu: jax.Array,
      skipped: jax.Array,
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
      spec = checked_frames(frames, path, w)
      cd = jnp.promote_types(_routing.update_dtype(u, w), nu.dtype)
      wf = spec.to_frames(w).astype(cd)
      xi = spec.to_frames(u).astype(cd)
      m_prev = spec.to_frames(mu).astype(cd)
      v_prev = (spec.to_frames(nu) if elementwise else nu).astype(cd)
      # One reduction serves both the finiteness test and the scalar moment.
      sq_norm = geometry.frame_sq_norm(xi)
      finite = jnp.isfinite(sq_norm)
      ok = _checks.hyperparams_ok(b1=b1, b2=b2, eps=eps)  # traced b1, b2, eps in range
      if ok is not None:
        finite = finite & ok
      xi = jnp.where(expand(finite), xi, 0)
      # Moment transport: the previous m is re-projected at the current W.
      m = tangent(wf, b1 * m_prev + (1 - b1) * xi)
      if elementwise:
        v = b2 * v_prev + (1 - b2) * jnp.square(xi)
      else:
        v = b2 * v_prev + (1 - b2) * jnp.where(finite, sq_norm, 0)
      # m_hat / (sqrt(v_hat) + eps); v_hat = 0 (and eps = 0) is a zero step, not 0/0.
      coef = geometry.adam_coefficient(v, count, b1, b2, eps)
      step = m * (coef if elementwise else expand(coef))
      if elementwise:
        step = tangent(wf, step)  # the entrywise quotient is not tangent.
      step = jnp.where(expand(finite), step, 0)
      m = jnp.where(expand(finite), m, m_prev)
      v = jnp.where(expand(finite) if elementwise else finite, v, v_prev)
      new_nu = spec.from_frames(v, w.shape) if elementwise else v
      return (
        spec.from_frames(step, u.shape).astype(w.dtype),
        spec.from_frames(m, w.shape).astype(mu.dtype),
        new_nu.astype(nu.dtype),
        skipped + (~finite).astype(jnp.int32),
      )

    out, mu, nu, skipped = _routing.per_leaf(
      leaf, 4, updates, params, state.mu, state.nu, state.skipped
    )
    return out, state_cls(count, mu, nu, skipped)

  return optax.GradientTransformation(init_fn, update_fn)


def scalar_moment(
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  *,
  frames: FramesLike = None,
  projector: str = "stiefel",
  mu_dtype: Any = None,
) -> optax.GradientTransformation:
  """Adam moments with one second-moment scalar per frame (paper section 3.2).

  For each frame with current point ``W`` and incoming tangent update ``xi_t``::

      m_t = Pi_W(b1 m_{t-1} + (1 - b1) xi_t)      # moment transport by re-projection
      v_t = b2 v_{t-1} + (1 - b2) ||xi_t||_F^2     # a scalar per frame
      out = m_hat_t / (sqrt(v_hat_t) + eps)        # m_hat, v_hat bias-corrected

  ``out`` is tangent at ``W`` (the re-projection of the quotient is exact because the
  divisor is a scalar). The scalar moment makes the update ``O(d)``-equivariant
  (Proposition 7) and, with ``eps = 0``, degree zero in the gradient
  (Proposition 3(ii)). Jensen gives ``||m_hat_t||_F <= sqrt(v_hat_t)`` when
  ``b1 = b2``, and for ``b1 <= b2`` when tangent-gradient norms do not grow; with the
  defaults and growing gradients the ratio can exceed 1 (see
  :mod:`stiefax.certificates`), which the step cap then bounds. When
  ``v_hat_t = 0`` the step is defined as zero (no ``0/0``). The state stores
  ``mu`` like the params and ``nu`` as one scalar per frame. A frame whose update holds
  a NaN or an Inf keeps ``mu`` and ``nu`` and outputs a zero step; ``skipped`` counts
  such frame-steps. Weight decay is never formed (Proposition 8).

  Example:
    >>> import jax, optax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (8, 2, 4))
    >>> tx = stiefax.scalar_moment()
    >>> state = tx.init(w)
    >>> state.nu.shape   # one scalar per head
    (2,)

  Args:
    b1: decay of the first moment.
    b2: decay of the second moment.
    eps: added to ``sqrt(v_hat)``; below this tangent-gradient scale the step becomes
      gradient-proportional (Remark 5).
    frames: how each leaf is viewed as frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`).
    projector: ``"stiefel"`` (also right for ``"canonical"``) or ``"grassmann"``: the
      projection used to transport the first moment.
    mu_dtype: dtype of ``mu`` (default: the parameter's dtype).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  return _moment("scalar_moment", b1, b2, eps, frames, projector, False, mu_dtype)


def elementwise_moment(
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  *,
  frames: FramesLike = None,
  projector: str = "stiefel",
  mu_dtype: Any = None,
) -> optax.GradientTransformation:
  """The "naive" Riemannian Adam moment: per-entry ``v`` (the paper's ablation).

  As :func:`scalar_moment` but ``v_t = b2 v_{t-1} + (1 - b2) xi_t**2`` entrywise and
  ``out = Pi_W(m_hat_t / (sqrt(v_hat_t) + eps))`` (re-projected, since an entrywise
  quotient leaves the tangent space). The per-entry scaling varies down the columns,
  so the update is *not* ``O(d)``-equivariant (Proposition 7, Table 9).

  Example:
    >>> import jax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (6, 2, 3))
    >>> tx = stiefax.elementwise_moment()
    >>> state = tx.init(w)
    >>> state.nu.shape  # one second moment per entry (the scalar moment keeps (2,))
    (6, 2, 3)
    >>> g = stiefax.geometry.stiefel_tangent(
    ...     jax.numpy.swapaxes(w, 0, 1),
    ...     jax.random.normal(jax.random.key(1), (2, 6, 3)))
    >>> step, state = tx.update(jax.numpy.swapaxes(g, 0, 1), state, w)
    >>> bool(stiefax.diagnostics.tangency_error(w, step) < 1e-5)
    True

  Args:
    b1: decay of the first moment.
    b2: decay of the second moment.
    eps: added to ``sqrt(v_hat)`` entrywise.
    frames: how each leaf is viewed as frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`).
    projector: ``"stiefel"`` or ``"grassmann"``: the projection used for transport
      and for the output.
    mu_dtype: dtype of ``mu`` (default: the parameter's dtype).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  return _moment("elementwise_moment", b1, b2, eps, frames, projector, True, mu_dtype)
