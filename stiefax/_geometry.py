"""The per-frame math of :mod:`stiefax.geometry`: projections, transport, the Adam coefficient and retraction steps."""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from stiefax._matrix import cayley_retract
from stiefax._matrix import eye_like
from stiefax._matrix import frame_sq_norm
from stiefax._matrix import mT
from stiefax._matrix import newton_schulz_iterations
from stiefax._matrix import polar
from stiefax._matrix import polar_newton_schulz
from stiefax._matrix import qr_retract
from stiefax._matrix import sym


def stiefel_tangent(w: jax.Array, g: jax.Array) -> jax.Array:
  """Tangent projection in the embedded (Euclidean) metric, paper eq. (3).

  ``Pi_W(G) = G - W sym(W^T G)``. It is the orthogonal projection of ``R^{d x r}``
  onto ``T_W St = {X : W^T X + X^T W = 0}``, so ``Pi_W G`` is the Riemannian
  gradient of a loss with Euclidean gradient ``G`` (Proposition 2). Its kernel is the
  normal space ``{W S : S = S^T}``, which contains the weight-decay gradient
  ``lambda W`` (Proposition 8).

  Example:
    >>> import jax, jax.numpy as jnp, stiefax
    >>> from stiefax import geometry
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (6, 3))
    >>> xi = geometry.stiefel_tangent(
    ...     w, jax.random.normal(jax.random.key(1), (6, 3)))
    >>> bool(jnp.max(jnp.abs(w.T @ xi + xi.T @ w)) < 1e-6)        # tangent
    True
    >>> bool(jnp.max(jnp.abs(geometry.stiefel_tangent(w, 0.1 * w))) < 1e-7)  # decay
    True

  Args:
    w: frames ``(..., d, r)`` on the manifold.
    g: ambient matrices of the same shape.

  Returns:
    The tangent part of ``g`` at ``w``.
  """
  return g - w @ sym(mT(w) @ g)


def grassmann_horizontal(w: jax.Array, g: jax.Array) -> jax.Array:
  """Horizontal projection ``Pi^h_W(G) = (I - W W^T) G`` (the PA16 / B2-SGD projector).

  It removes the per-frame gauge block ``W (W^T G)`` as well as the normal part, so
  ``||Pi_W G||^2 = ||Pi^h_W G||^2 + ||Pi_{G_W} G||^2`` (Proposition 2, eq. 12).

  Example:
    >>> import jax, jax.numpy as jnp, stiefax
    >>> from stiefax import geometry
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (6, 3))
    >>> g = jax.random.normal(jax.random.key(1), (6, 3))
    >>> h, xi = geometry.grassmann_horizontal(w, g), geometry.stiefel_tangent(w, g)
    >>> bool(jnp.max(jnp.abs(w.T @ h)) < 1e-6)   # horizontal: W^T h = 0
    True
    >>> skew = xi - h                            # the per-frame block W skew(W^T G)
    >>> bool(abs(geometry.frame_sq_norm(xi) - geometry.frame_sq_norm(h)
    ...          - geometry.frame_sq_norm(skew)) < 1e-5)   # eq. (12)
    True

  Args:
    w: frames ``(..., d, r)`` on the manifold.
    g: ambient matrices of the same shape.

  Returns:
    The horizontal part of ``g`` at ``w``.
  """
  return g - w @ (mT(w) @ g)


def canonical_tangent(w: jax.Array, g: jax.Array) -> jax.Array:
  """Riemannian gradient in the canonical metric, paper eq. (4): ``G - W G^T W``.

  Args:
    w: frames ``(..., d, r)`` on the manifold.
    g: Euclidean gradients of the same shape.

  Returns:
    The canonical-metric gradient (a tangent vector at ``w``; the B2m-can arm).

  Example:
    >>> import jax, jax.numpy as jnp, stiefax
    >>> from stiefax import geometry
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (6, 3))
    >>> xi = geometry.canonical_tangent(
    ...     w, jax.random.normal(jax.random.key(1), (6, 3)))
    >>> bool(jnp.max(jnp.abs(w.T @ xi + xi.T @ w)) < 1e-6)
    True
  """
  return g - w @ (mT(g) @ w)


def isometry_residual(w: jax.Array) -> jax.Array:
  """Per-frame isometry error ``max_ij |(W^T W - I)_ij|``: zero on ``St(d, r)``.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax import geometry
    >>> geometry.isometry_residual(
    ...     jnp.stack([jnp.eye(3)[:, :2], 2 * jnp.eye(3)[:, :2]]))
    Array([0., 3.], dtype=float32)

  Args:
    w: frames ``(..., d, r)``.

  Returns:
    The residuals, shape ``w.shape[:-2]``.
  """
  gram = mT(w) @ w
  return jnp.max(jnp.abs(gram - eye_like(gram)), axis=(-2, -1))


def _identity(a: jax.Array) -> jax.Array:
  return a


class Projection(NamedTuple):
  """A tangent projection of the form ``Pi_W(G) = G - W N(W^T G)``, with ``N`` linear.

  Example:
    >>> from stiefax import geometry
    >>> geometry.PROJECTIONS["canonical"].transport
    'stiefel'

  Attributes:
    project: ``(W, G) -> Pi_W(G)``.
    normal: ``N``, a linear map of ``r x r`` matrices (``sym`` for eq. (3), the
      identity for the horizontal projection, the transpose for eq. (4)).
    transport: the name of the projection that re-projects first moments at the
      current point (moment transport): the orthogonal projection onto the space the
      projected gradients lie in (eq. (3) for the canonical gradient).
  """

  project: Callable[[jax.Array, jax.Array], jax.Array]
  normal: Callable[[jax.Array], jax.Array]
  transport: str


#: The tangent projections by name (``projector=`` of the transforms and optimizers).
PROJECTIONS = {
  "stiefel": Projection(stiefel_tangent, sym, "stiefel"),
  "grassmann": Projection(grassmann_horizontal, _identity, "grassmann"),
  "canonical": Projection(canonical_tangent, mT, "stiefel"),
}


def projection(name: str) -> Projection:
  """The :class:`Projection` called ``name``; a ValueError names the valid ones.

  Example:
    >>> from stiefax import geometry
    >>> geometry.projection("grassmann").transport
    'grassmann'

  Args:
    name: a key of :data:`PROJECTIONS`.

  Returns:
    The projection.
  """
  if name not in PROJECTIONS:
    raise ValueError(f"Unknown projector {name!r}; valid projectors are {tuple(PROJECTIONS)}.")
  return PROJECTIONS[name]


def project_and_transport(
  w: jax.Array,
  g: jax.Array,
  m_prev: jax.Array,
  b1: Any,
  projector: str = "stiefel",
  *,
  concat: bool = True,
) -> tuple[jax.Array, jax.Array]:
  """``xi = Pi_W(g)`` and ``m = T_W(b1 m_prev + (1 - b1) xi)`` from shared products.

  ``Pi`` is the projection ``projector`` and ``T`` its transport (see
  :class:`Projection`). Both have the form ``x - W N(W^T x)`` with ``N`` linear, so
  the products ``W^T [g | m_prev]`` give both ``N`` arguments and
  ``W [N_g | b1 N_m + (1 - b1) N_g]`` gives ``xi`` and ``m``:
  ``xi = g - W N_g``, ``m = b1 m_prev + (1 - b1) g - W N_mix`` (the first moment of
  the paper's section 3.2, re-projected at ``W``). With ``concat`` each pair is one
  matrix product; without, two (for frames viewed through a transpose, where XLA folds
  the transpose into separate products but must copy it into a concatenation).

  Example:
    >>> import jax, jax.numpy as jnp, stiefax
    >>> from stiefax import geometry
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (6, 3))
    >>> g, m0 = jax.random.normal(jax.random.key(1), (2, 6, 3))
    >>> xi, m = geometry.project_and_transport(w, g, m0, 0.9)
    >>> want = geometry.stiefel_tangent(w, 0.9 * m0 + 0.1 * xi)
    >>> bool(jnp.allclose(m, want, atol=1e-6))
    True

  Args:
    w: frames ``(..., d, r)`` on the manifold.
    g: incoming updates of the same shape.
    m_prev: the previous first moments, same shape.
    b1: the first-moment decay.
    projector: a key of :data:`PROJECTIONS`.
    concat: compute each pair of products as one product.

  Returns:
    ``(xi, m)``.
  """
  proj = projection(projector)
  r = w.shape[-1]
  if concat:
    p = mT(w) @ jnp.concatenate([g, m_prev], axis=-1)
    a, b = p[..., :r], p[..., r:]
  else:
    a, b = mT(w) @ g, mT(w) @ m_prev
  n_g = proj.normal(a)
  n_m = PROJECTIONS[proj.transport].normal(b)
  n_mix = b1 * n_m + (1 - b1) * n_g
  if concat:
    q = w @ jnp.concatenate([n_g, n_mix], axis=-1)
    wn_g, wn_mix = q[..., :r], q[..., r:]
  else:
    wn_g, wn_mix = w @ n_g, w @ n_mix
  return g - wn_g, b1 * m_prev + (1 - b1) * g - wn_mix


def safe_divide(num: Any, den: jax.Array) -> jax.Array:
  """``num / den`` where ``den > 0``, else 0 (no ``0 / 0``, and no NaN in gradients).

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax import geometry
    >>> geometry.safe_divide(jnp.array([1.0, 1.0]), jnp.array([2.0, 0.0]))
    Array([0.5, 0. ], dtype=float32)

  Args:
    num: the numerator (broadcasts against ``den``).
    den: the denominator.

  Returns:
    The quotient, 0 where ``den <= 0`` (or NaN).
  """
  pos = den > 0
  return jnp.where(pos, num / jnp.where(pos, den, 1), 0)


def adam_coefficient(v: jax.Array, count: jax.Array, b1: Any, b2: Any, eps: Any) -> jax.Array:
  """Adam's bias-corrected step per unit of first moment: ``step = coef * m``.

  ``coef = 1 / ((1 - b1^t) (sqrt(v / (1 - b2^t)) + eps))``, i.e. the step
  ``m_hat / (sqrt(v_hat) + eps)`` of the paper's section 3.2 with
  ``m_hat = m / (1 - b1^t)`` and ``v_hat = v / (1 - b2^t)``. Where the denominator
  ``sqrt(v_hat) + eps`` is zero (``v_hat = 0`` and ``eps = 0``) the step is defined as
  zero, not ``0 / 0``. ``v`` is one scalar per frame (the scalar moment) or one per
  entry (the elementwise moment); the coefficient has its shape and dtype.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax import geometry
    >>> v = jnp.array([4.0, 0.0])  # after one step: v_hat = v / (1 - b2) = (16, 0)
    >>> geometry.adam_coefficient(v, jnp.array(1), 0.5, 0.75, 0.0)  # 1 / (0.5 * 4)
    Array([0.5, 0. ], dtype=float32)

  Args:
    v: the second moment (before bias correction).
    count: the step number ``t >= 1`` (an int scalar).
    b1: the first-moment decay.
    b2: the second-moment decay.
    eps: added to ``sqrt(v_hat)``.

  Returns:
    The coefficient, shape and dtype of ``v``.
  """
  dtype = v.dtype
  t = count.astype(dtype)
  den = jnp.sqrt(v / (1 - jnp.asarray(b2, dtype) ** t)) + eps
  return safe_divide(1, (1 - jnp.asarray(b1, dtype) ** t) * den)


class Retraction(NamedTuple):
  """A retraction of ``St(d, r)``: one row of :data:`RETRACTION_TABLE`.

  ``retract(W, eta, method=..., step_bound=..., sq_norm=...)`` is ``R_W(eta)`` for a
  batch of frames ``W`` ``(..., d, r)`` on the manifold and finite steps ``eta`` of
  their shape (zero where a step was not finite); :func:`retraction_step` calls it
  and keeps ``W`` where a step is zero or not finite. The options are the same for
  every row, and a row ignores those it has no use for: ``method`` the polar method
  (one of :data:`stiefax.POLAR_METHODS`), ``step_bound`` the ``tau`` of a preceding
  step cap (``||eta||_F <= tau sqrt(r)``) or ``None``, ``sq_norm`` ``||eta||_F^2`` per
  frame. Every retraction agrees with ``W + eta`` to first order,
  ``R_W(eta) = W + eta + O(||eta||^2)``.

  Example:
    >>> from stiefax import geometry
    >>> (geometry.RETRACTION_TABLE["qr"].takes_method,
    ...  geometry.RETRACTION_TABLE["polar"].takes_method)
    (False, True)

  Attributes:
    retract: ``(W, eta, *, method, step_bound, sq_norm) -> R_W(eta)``.
    takes_method: whether ``method=`` picks how it is computed (the polar factor's
      algorithm; the LAPACK-backed ones warn on the CPU backend).
  """

  retract: Callable[..., jax.Array]
  takes_method: bool


def _polar_retract(
  w: jax.Array, eta: jax.Array, *, method: str, step_bound: Any, sq_norm: jax.Array
) -> jax.Array:
  """``polar(W + eta)``; after a capped step, the prescaled Newton-Schulz iteration of
  :func:`retraction_step`."""
  if method in ("auto", "newton_schulz") and step_bound is not None:
    a = (w + eta) * jax.lax.rsqrt(1 + sq_norm)[..., None, None]
    iterations = newton_schulz_iterations(step_bound, w.shape[-1], w.dtype)
    return polar_newton_schulz(a, iterations, prescaled=True)
  return polar(w + eta, method, step_bound=step_bound)


def _qr_retract(w: jax.Array, eta: jax.Array, **_: Any) -> jax.Array:
  return qr_retract(w, eta)


def _cayley_retract(w: jax.Array, eta: jax.Array, **_: Any) -> jax.Array:
  return cayley_retract(w, eta)


#: The retractions by name (``retraction=`` of :func:`retraction_step`,
#: :func:`stiefax.retract`, the aliases and :func:`stiefax.manifold_muon`; the names
#: are :data:`stiefax.RETRACTIONS`, the rows described in :func:`stiefax.retract`). A
#: new retraction is a row here and its function.
RETRACTION_TABLE: dict[str, Retraction] = {
  "polar": Retraction(_polar_retract, takes_method=True),
  "qr": Retraction(_qr_retract, takes_method=False),
  "cayley": Retraction(_cayley_retract, takes_method=False),
}


def retraction_by_name(name: str) -> Retraction:
  """The row ``name`` of :data:`RETRACTION_TABLE`; a ValueError names the valid ones.

  Example:
    >>> from stiefax import geometry
    >>> geometry.retraction_by_name("cayley").takes_method
    False

  Args:
    name: a key of :data:`RETRACTION_TABLE`.

  Returns:
    The :class:`Retraction`.
  """
  if name not in RETRACTION_TABLE:
    raise ValueError(
      f"Unknown retraction {name!r}; valid retractions are {tuple(RETRACTION_TABLE)}."
    )
  return RETRACTION_TABLE[name]


def retraction_step(
  w: jax.Array,
  eta: jax.Array,
  *,
  retraction: str = "polar",
  method: str = "auto",
  step_bound: Any = None,
  sq_norm: Any = None,
) -> tuple[jax.Array, jax.Array]:
  """``(R_W(eta) - W, finite)`` per frame; a zero or non-finite step keeps ``W``.

  ``R`` is the row ``retraction`` of :data:`RETRACTION_TABLE`: by default
  ``polar(W + eta)`` (``method`` picks the algorithm; section 3.2). ``finite`` says,
  per frame, whether the step was finite (a non-finite one is replaced by zero).

  ``sq_norm`` is ``||eta||_F^2`` per frame when the caller knows it. With a step bound
  the polar factor is the prescaled Newton-Schulz iteration: ``A^T A = I + eta^T eta``
  for a tangent ``eta`` (Proposition 6(i)), so ``c = 1 + ||eta||_F^2`` bounds
  ``lambda_max(A^T A)`` and ``A / sqrt(c)`` enters the iteration directly (no reduction
  of the Gram matrix), for the fixed count of :func:`newton_schulz_iterations`.

  Example:
    >>> import jax, jax.numpy as jnp, stiefax
    >>> from stiefax import geometry
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (6, 3))
    >>> eta = geometry.stiefel_tangent(
    ...     w, 0.1 * jax.random.normal(jax.random.key(1), (6, 3)))
    >>> delta, finite = geometry.retraction_step(w, eta, step_bound=0.1)
    >>> bool(geometry.isometry_residual(w + delta) < 1e-5), bool(finite)
    (True, True)

  Args:
    w: frames ``(..., d, r)`` on the manifold.
    eta: steps of the same shape (tangent for the bounds above).
    retraction: a key of :data:`RETRACTION_TABLE` (one of :data:`stiefax.RETRACTIONS`).
    method: the polar method (for the rows that take one), one of
      :data:`stiefax.POLAR_METHODS`.
    step_bound: ``tau`` with ``||eta||_F <= tau sqrt(r)`` for every frame, or ``None``.
    sq_norm: ``||eta||_F^2`` per frame, or ``None`` to compute it.

  Returns:
    ``(delta, finite)``: ``delta`` of ``w``'s shape, ``finite`` of its batch shape.
  """
  row = retraction_by_name(retraction)
  if sq_norm is None:
    sq_norm = frame_sq_norm(eta)
  finite = jnp.isfinite(sq_norm)
  moved = finite & (sq_norm > 0)
  eta = jnp.where(finite[..., None, None], eta, 0)
  sq_norm = jnp.where(finite, sq_norm, 0)
  target = row.retract(w, eta, method=method, step_bound=step_bound, sq_norm=sq_norm)
  return jnp.where(moved[..., None, None], target - w, 0), finite
