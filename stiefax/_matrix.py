"""Matrix functions of frames: polar factors, inverse square roots, QR and Cayley.

The batched linear algebra under :mod:`stiefax.geometry`, which re-exports the public
functions (``stiefax.geometry.polar`` and so on); import them from there. Every
function takes arrays of shape ``(..., d, r)`` or ``(..., r, r)`` and is batched over
the leading axes with matrix products. The Newton-Schulz, Cholesky-QR and Schulz
iterations use matrix products only, so they are safe inside fused XLA:CPU programs,
where LAPACK-backed decompositions have deadlocked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: Polar methods by name (``method=`` of :func:`polar`, :func:`stiefax.polar_retract`
#: and the aliases); exported as ``stiefax.POLAR_METHODS``.
POLAR_METHODS = ("auto", "newton_schulz", "eigh", "svd", "qdwh")

#: Methods that call LAPACK-backed decompositions (see :func:`polar`).
DECOMPOSITION_METHODS = ("eigh", "svd", "qdwh")


def mT(x: jax.Array) -> jax.Array:
  """Transpose of the last two axes: ``mT(X)[..., i, j] = X[..., j, i]``.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax import geometry
    >>> geometry.mT(jnp.zeros((5, 4, 3))).shape
    (5, 3, 4)

  Args:
    x: an array of rank >= 2 (a batch of matrices).

  Returns:
    ``x`` with its last two axes swapped.
  """
  return jnp.swapaxes(x, -1, -2)


def sym(a: jax.Array) -> jax.Array:
  """Symmetric part ``sym(A) = (A + A^T) / 2`` of a batch of square matrices.

  The normal space of ``St(d, r)`` at ``W`` is ``{W sym(A)}``; eq. (3) removes
  ``W sym(W^T G)`` from ``G``.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax import geometry
    >>> geometry.sym(jnp.array([[0.0, 2.0], [0.0, 1.0]]))
    Array([[0., 1.],
           [1., 1.]], dtype=float32)

  Args:
    a: square matrices ``(..., r, r)``.

  Returns:
    ``(a + a^T) / 2``, same shape.
  """
  return 0.5 * (a + mT(a))


def frame_sq_norm(x: jax.Array) -> jax.Array:
  """Squared Frobenius norm of each frame: ``||X||_F^2 = sum_ij X_ij^2``.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax import geometry
    >>> geometry.frame_sq_norm(jnp.ones((2, 4, 3)))
    Array([12., 12.], dtype=float32)

  Args:
    x: frames ``(..., d, r)``.

  Returns:
    The squared norms, shape ``x.shape[:-2]``.
  """
  return jnp.sum(jnp.square(x), axis=(-2, -1))


def compute_dtype(dtype: jax.typing.DTypeLike) -> jnp.dtype:
  """The dtype polar factors are computed in: float32 for 16-bit floats, else ``dtype``.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax import geometry
    >>> geometry.compute_dtype(jnp.bfloat16), geometry.compute_dtype(jnp.float32)
    (dtype('float32'), dtype('float32'))

  Args:
    dtype: the parameters' dtype.

  Returns:
    The ``numpy`` dtype, ``float32`` for ``float16`` / ``bfloat16`` and ``dtype``
      otherwise.
  """
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
    return jnp.dtype(jnp.float32)
  return dtype


def eye_like(a: jax.Array) -> jax.Array:
  """Identity matrices broadcast to the batch shape of square matrices ``a``.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax import geometry
    >>> geometry.eye_like(jnp.zeros((2, 3, 3))).shape
    (2, 3, 3)

  Args:
    a: square matrices ``(..., r, r)``.

  Returns:
    ``I_r`` for every matrix of the batch, in ``a``'s dtype.
  """
  return jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape[:-2] + (a.shape[-1],) * 2)


def _polar_svd(a: jax.Array) -> jax.Array:
  u, _, vt = jnp.linalg.svd(a, full_matrices=False)
  return u @ vt


def _polar_eigh(a: jax.Array) -> jax.Array:
  lam, v = jnp.linalg.eigh(mT(a) @ a)
  tiny = jnp.finfo(a.dtype).tiny
  inv_sqrt = jax.lax.rsqrt(jnp.maximum(lam, tiny))
  return a @ ((v * inv_sqrt[..., None, :]) @ mT(v))


def _polar_qdwh(a: jax.Array) -> jax.Array:
  batch = a.shape[:-2]
  flat = a.reshape((-1,) + a.shape[-2:])
  u = jax.vmap(lambda x: jax.scipy.linalg.polar(x, side="right", method="qdwh")[0])(flat)
  return u.reshape(batch + a.shape[-2:])


def newton_schulz_iterations(
  step_bound: float, r: int, dtype: jax.typing.DTypeLike = jnp.float32
) -> int:
  """Cubic Newton-Schulz iterations that make :func:`polar` exact after a capped step.

  After a tangent step ``eta`` from ``W`` in ``St(d, r)``, ``A = W + eta`` has
  ``A^T A = I + eta^T eta`` (Proposition 6(i)), so every eigenvalue ``lambda`` lies in
  ``[1, 1 + ||eta||_F^2]`` and the scale ``c = 1 + tr(A^T A) - r = 1 + ||eta||_F^2``
  bounds ``lambda_max``. The normalized eigenvalues ``mu = lambda / c`` then lie in
  ``[1 / (1 + tau^2 r), 1]`` when ``||eta||_F <= tau sqrt(r)`` (the step cap). The
  cubic map ``mu -> mu (3 - mu)^2 / 4`` is increasing on ``(0, 1]``, so the smallest
  ``mu`` is the slowest; this returns the number of iterations that take it to within
  the dtype's epsilon of 1. For ``tau = 0.1``: 3 iterations at ``r = 16`` and 4 at
  ``r = 32, 64`` in float32.

  Example:
    >>> from stiefax import geometry
    >>> (geometry.newton_schulz_iterations(0.1, 16),
    ...  geometry.newton_schulz_iterations(0.1, 64))
    (3, 4)

  Args:
    step_bound: ``tau`` such that every step satisfies ``||eta||_F <= tau sqrt(r)``.
    r: the frames' column count.
    dtype: the dtype the iteration runs in.

  Returns:
    The iteration count (at least 1).
  """
  eps = float(jnp.finfo(compute_dtype(dtype)).eps)
  mu = 1.0 / (1.0 + float(step_bound) ** 2 * r)
  k = 0
  while 1.0 - mu > eps and k < 100:
    mu = mu * (3.0 - mu) ** 2 / 4.0
    k += 1
  return max(k, 1)


def polar_newton_schulz(
  a: jax.Array, iterations: int | None = None, *, prescaled: bool = False
) -> jax.Array:
  """Cubic Newton-Schulz for ``A (A^T A)^{-1/2}``, iterated in the ``r x r`` Gram space.

  The cubic Newton-Schulz map on ``X = A Z / sqrt(c)`` is
  ``X <- X T`` with ``T = (3 I - X^T X) / 2``. Every matrix it produces is a
  polynomial in ``Y = A^T A / c``, so all of them commute and the map can be carried out
  on ``r x r`` matrices: with ``Q = X^T X`` (``Q = Y`` and ``Z = I`` at the start),

      T = (3 I - Q) / 2,    Z <- Z T,    Q <- Q T^2   (or Q <- Z (Y Z)).

  The coupled update ``Q T^2`` is stable for any conditioning and runs under the
  stopping rule. With a fixed count (well-conditioned input, ``mu >= 1 / (1 + tau^2
  r)``) ``Q`` is formed afresh as ``Z Y Z``: the same two products, and less
  rounding in the result because errors of ``Q`` do not accumulate (this uncoupled
  form is unstable when ``Y`` is ill-conditioned, hence only there).

  Each eigenvalue ``mu`` of ``Q`` moves to ``mu (3 - mu)^2 / 4``: monotone on
  ``(0, 1]``, convergent on ``(0, 3)`` and quadratic near 1
  (``1 - mu' ~ 3/4 (1 - mu)^2``). The first iteration needs no product (``Z = T``) and
  the last no update of ``Q``, so ``k`` iterations cost ``3k - 3`` products of
  ``r x r`` matrices, then one ``d x r`` by ``r x r`` product forms ``A Z / sqrt(c)``.

  The scale is ``c = max(1 + tr(A^T A) - r, ||A^T A||_inf / 2.5)``: the first term
  bounds ``lambda_max`` after a tangent step (see :func:`newton_schulz_iterations`),
  the second keeps every ``mu < 3`` for any input. ``prescaled=True`` says that the
  caller has already divided ``A`` by ``sqrt(c)`` (the retraction after a capped step
  knows ``c = 1 + ||eta||_F^2`` without reading the Gram matrix), so ``c = 1``. With
  ``iterations`` given the loop
  has that fixed length (no data-dependent control flow and no reduction across
  frames, so sharded frames need no communication); otherwise it runs until
  ``max |Q - I|`` reaches the dtype's rounding level or stops improving.
  """
  dtype = a.dtype
  r = a.shape[-1]
  gram = mT(a) @ a
  if prescaled:
    y = gram
  else:
    trace = jnp.trace(gram, axis1=-2, axis2=-1)
    inf_norm = jnp.max(jnp.sum(jnp.abs(gram), axis=-1), axis=-1)
    c = jnp.maximum(jnp.maximum(1 + trace - r, inf_norm / 2.5), jnp.finfo(dtype).tiny)
    c = c[..., None, None]
    y = gram / c
  eye = eye_like(y)

  if iterations is not None:
    if iterations < 1:
      raise ValueError(f"polar_newton_schulz needs iterations >= 1, got {iterations}.")
    z, q = 1.5 * eye - 0.5 * y, y
    for _ in range(iterations - 1):
      q = z @ (y @ z)
      z = z @ (1.5 * eye - 0.5 * q)
  else:
    tol = 8 * jnp.finfo(dtype).eps
    max_iters = 60 if dtype == jnp.float64 else 40

    def residual(q: jax.Array) -> jax.Array:
      return jnp.max(jnp.abs(q - eye))

    def cond(state: tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]) -> jax.Array:
      _, _, k, res, prev = state
      return (k < max_iters) & (res > tol) & (res < prev)

    def body(
      state: tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array],
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
      z, q, k, res, _ = state
      t = 1.5 * eye - 0.5 * q
      z, q = z @ t, (q @ t) @ t
      return z, q, k + 1, residual(q), res

    init = (eye, y, jnp.asarray(0), residual(y), jnp.asarray(jnp.inf, dtype))
    z, _, _, _, _ = jax.lax.while_loop(cond, body, init)
  return a @ z if prescaled else a @ (z * jax.lax.rsqrt(c))


def polar(a: jax.Array, method: str = "auto", *, step_bound: float | None = None) -> jax.Array:
  """Polar factor ``polar(A) = U V^T = A (A^T A)^{-1/2}`` of each full-rank frame.

  ``polar(A)`` is the nearest point of ``St(d, r)`` to ``A`` in the Frobenius norm;
  ``polar(W + eta)`` is the retraction of the paper's update (section 3.2).
  16-bit inputs are computed in float32 and cast back.

  Methods (all agree to the dtype's rounding on well-conditioned input, such as
  ``W + eta`` after a tangent step; the Gram-space methods ``newton_schulz`` and
  ``eigh`` lose accuracy like ``eps * cond(A)^2`` on ill-conditioned input, for which
  ``svd`` is the right choice):

  * ``"newton_schulz"``: cubic Newton-Schulz in the ``r x r`` Gram space (matrix
    products only): a fixed count from :func:`newton_schulz_iterations` when
    ``step_bound`` is given, else a stopping rule.
  * ``"eigh"``: ``A V diag(lambda)^{-1/2} V^T`` from the eigendecomposition of
    ``A^T A``.
  * ``"svd"``: ``U V^T`` from the thin SVD: the reference.
  * ``"qdwh"``: :func:`jax.scipy.linalg.polar` (QR-based dynamically weighted Halley).
  * ``"auto"``: ``"newton_schulz"``. On the CPU backend the LAPACK-backed methods
    (``svd``, ``eigh``, ``qdwh``) have been seen to deadlock inside fused or scanned
    training steps; matrix products never have.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax import geometry
    >>> a = jnp.array([[2.0, 0.0], [0.0, 0.5], [0.0, 0.0]])
    >>> geometry.polar(a).round(4)
    Array([[1., 0.],
           [0., 1.],
           [0., 0.]], dtype=float32)

  Args:
    a: matrices ``(..., d, r)`` with ``r <= d`` and full column rank.
    method: one of :data:`stiefax.POLAR_METHODS`.
    step_bound: optional ``tau`` with ``a = W + eta``, ``W`` on the manifold, ``eta``
      tangent and ``||eta||_F <= tau sqrt(r)`` (Proposition 6). It fixes the
      Newton-Schulz iteration count; other methods ignore it.

  Returns:
    The polar factors, same shape and dtype as ``a``.
  """
  if method not in POLAR_METHODS:
    raise ValueError(f"Unknown polar method {method!r}; valid methods are {POLAR_METHODS}.")
  dtype = a.dtype
  a = a.astype(compute_dtype(dtype))
  if method in ("auto", "newton_schulz"):
    iterations = None
    if step_bound is not None:
      iterations = newton_schulz_iterations(step_bound, a.shape[-1], a.dtype)
    u = polar_newton_schulz(a, iterations)
  elif method == "eigh":
    u = _polar_eigh(a)
  elif method == "svd":
    u = _polar_svd(a)
  else:
    u = _polar_qdwh(a)
  return u.astype(dtype)


def inverse_sqrt(p: jax.Array, iterations: int) -> tuple[jax.Array, jax.Array]:
  """``(P^{-1/2}, P^{1/2})`` of symmetric positive semi-definite ``r x r`` matrices.

  Coupled cubic Newton-Schulz on ``Y = P / c`` with ``c = ||P||_F >= lambda_max``
  (matrix products only): ``T = (3 I - Q) / 2``, ``Z <- Z T``, ``Q <- Q T^2`` from
  ``Z = I``, ``Q = Y``. Every eigenvalue ``mu`` of ``Y`` in ``(0, 1]`` moves to
  ``mu (3 - mu)^2 / 4`` (monotone, at most 1, quadratic near 1; a small ``mu`` grows by
  ``9/4`` per iteration), so after ``k`` iterations ``Z -> Y^{-1/2}`` on the
  eigenvalues that have converged and ``Z Y Z <= I`` on every eigenvalue: an
  unconverged or zero eigenvalue is damped, never overshot. This is what makes
  ``Y Z`` a matrix of spectral norm at most 1 even for a rank-deficient ``P``.
  Returns ``Z / sqrt(c)`` and ``P Z / sqrt(c)``.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax import geometry
    >>> p = jnp.diag(jnp.array([4.0, 1.0]))
    >>> z, root = geometry.inverse_sqrt(p, 12)
    >>> jnp.round(jnp.diag(z), 4), jnp.round(jnp.diag(root), 4)
    (Array([0.5, 1. ], dtype=float32), Array([2., 1.], dtype=float32))

  Args:
    p: symmetric positive semi-definite matrices ``(..., r, r)``.
    iterations: the fixed Newton-Schulz count.

  Returns:
    ``(inverse square root, square root)``, each ``(..., r, r)``.
  """
  c = jnp.sqrt(jnp.sum(jnp.square(p), axis=(-2, -1), keepdims=True))
  c = jnp.maximum(c, jnp.finfo(p.dtype).tiny)
  y = p / c
  eye = eye_like(y)
  z, q = eye, y
  for i in range(iterations):
    t = 1.5 * eye - 0.5 * q
    z = t if i == 0 else z @ t
    if i < iterations - 1:
      q = (q @ t) @ t
  scale = jax.lax.rsqrt(c)
  return z * scale, (p @ z) * scale


def _cholesky_upper(p: jax.Array) -> jax.Array:
  """Upper-triangular ``R`` with ``R^T R = P`` and ``diag(R) > 0`` (products only).

  Column-oriented Cholesky as a ``fori_loop`` over the ``r`` columns, each a masked
  vector update: no LAPACK call, so it is safe inside fused CPU programs.
  """
  r = p.shape[-1]
  idx = jnp.arange(r)

  def body(j: int, low: jax.Array) -> jax.Array:
    row_j = jnp.take(low, j, axis=-2)  # (..., r): L[j, :], zero at columns >= j
    col = jnp.take(p, j, axis=-1) - jnp.einsum("...ik,...k->...i", low, row_j)
    pivot = jnp.sqrt(jnp.maximum(jnp.take(col, j, axis=-1), jnp.finfo(p.dtype).tiny))
    new = jnp.where(idx >= j, col / pivot[..., None], 0)
    return jnp.where((idx == j)[None, :], new[..., :, None], low)

  low = jax.lax.fori_loop(0, r, body, jnp.zeros_like(p))
  return mT(low)


def _triangular_inverse_upper(u: jax.Array) -> jax.Array:
  """``U^{-1}`` of upper-triangular ``U`` with a positive diagonal (back substitution)."""
  r = u.shape[-1]
  idx = jnp.arange(r)
  eye = eye_like(u)

  def body(k: int, inv: jax.Array) -> jax.Array:
    i = r - 1 - k  # rows from the bottom: X[i] = (e_i - U[i, i+1:] X[i+1:]) / U[i, i]
    u_row = jnp.where(idx > i, jnp.take(u, i, axis=-2), 0)
    row = jnp.take(eye, i, axis=-2) - jnp.einsum("...k,...kj->...j", u_row, inv)
    row = row / jnp.take(jnp.take(u, i, axis=-2), i, axis=-1)[..., None]
    return jnp.where((idx == i)[:, None], row[..., None, :], inv)

  return jax.lax.fori_loop(0, r, body, jnp.zeros_like(u))


def qr_retract(w: jax.Array, xi: jax.Array) -> jax.Array:
  """QR retraction ``qf(W + xi)`` with ``diag(R) > 0`` (the sign-fixed, continuous one).

  ``A = W + xi = Q R`` with ``R`` upper triangular and positive on its diagonal is
  unique for a full-rank ``A`` and smooth in ``A``, so ``xi -> qf(W + xi)`` is a
  retraction (Absil et al. 2008, eq. 4.8; geoopt's default for the Stiefel manifold).
  Computed as Cholesky-QR: ``R^T R = A^T A`` and ``Q = A R^{-1}``. For a tangent
  ``xi``, ``A^T A = I + xi^T xi`` has eigenvalues in ``[1, 1 + ||xi||_F^2]``
  (Proposition 6(i)), so the Cholesky factor is well conditioned and Cholesky-QR is
  accurate. The factorization and the triangular inverse are loops of matrix-vector
  products over the ``r`` columns (no LAPACK call; safe inside jitted CPU loops).

  Example:
    >>> import jax.random as jr, stiefax
    >>> from stiefax import geometry
    >>> w = stiefax.flax.orthonormal_init()(jr.key(0), (6, 3))
    >>> xi = geometry.stiefel_tangent(w, 0.3 * jr.normal(jr.key(1), (6, 3)))
    >>> bool(geometry.isometry_residual(geometry.qr_retract(w, xi)) < 1e-5)
    True

  Args:
    w: frames ``(..., d, r)`` on the manifold.
    xi: steps of the same shape (tangent for the error bound above).

  Returns:
    ``qf(w + xi)``, same shape.
  """
  a = w + xi
  r_upper = _cholesky_upper(mT(a) @ a)
  return a @ _triangular_inverse_upper(r_upper)


def _schulz_inverse(m: jax.Array, max_iterations: int) -> jax.Array:
  """``M^{-1}`` by the Newton-Schulz (Schulz) iteration ``X <- X (2 I - M X)``.

  Started at ``X_0 = M^T / (||M||_1 ||M||_inf)``, for which ``||I - M X_0||_2 < 1`` for
  any nonsingular ``M`` (Pan and Schreiber 1991); the error ``I - M X`` squares every
  iteration. The loop stops when ``max |I - M X|`` reaches the dtype's rounding level
  or stops decreasing, or after ``max_iterations``.
  """
  norm1 = jnp.max(jnp.sum(jnp.abs(m), axis=-2), axis=-1)
  norm_inf = jnp.max(jnp.sum(jnp.abs(m), axis=-1), axis=-1)
  x = mT(m) / (norm1 * norm_inf)[..., None, None]
  eye = eye_like(m)
  tol = 8 * jnp.finfo(m.dtype).eps

  def residual(x: jax.Array) -> jax.Array:
    return jnp.max(jnp.abs(eye - m @ x))

  def cond(state: tuple[jax.Array, jax.Array, jax.Array, jax.Array]) -> jax.Array:
    _, k, res, prev = state
    return (k < max_iterations) & (res > tol) & (res < prev)

  def body(
    state: tuple[jax.Array, jax.Array, jax.Array, jax.Array],
  ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    x, k, res, _ = state
    x = x @ (2 * eye - m @ x)
    return x, k + 1, residual(x), res

  init = (x, jnp.asarray(0), residual(x), jnp.asarray(jnp.inf, m.dtype))
  return jax.lax.while_loop(cond, body, init)[0]


def cayley_retract(w: jax.Array, xi: jax.Array, iterations: int = 30) -> jax.Array:
  """Cayley retraction ``(I - Omega / 2)^{-1} (I + Omega / 2) W`` with ``Omega W = xi``.

  ``Omega = P xi W^T - W xi^T P`` with ``P = I - W W^T / 2`` is skew and satisfies
  ``Omega W = xi`` for every tangent ``xi`` (Wen and Yin 2013, sec. 3; Li et al. 2020,
  eq. 6), so the Cayley transform of ``Omega`` (an orthogonal matrix) maps ``W`` to a
  point of ``St(d, r)`` exactly, with derivative ``xi`` at ``xi = 0``. With
  ``Omega = U V^T``, ``U = [P xi, W]``, ``V = [W, -P xi]`` (``d x 2r``), the
  Sherman-Morrison-Woodbury identity gives (Wen and Yin, Lemma 4.1)

      W_new = W + U (I_2r - V^T U / 2)^{-1} V^T W,

  a ``2r x 2r`` linear system. It is solved with the Schulz iteration (matrix products
  only, no LAPACK call, so safe in jitted CPU loops): ``I - V^T U / 2`` has the
  eigenvalues ``1 - i theta / 2`` of ``I - Omega / 2`` on its range (modulus >= 1)
  and is well conditioned for the capped steps of the optimizers. The iteration stops
  at the dtype's rounding (the error squares every iteration), after at most
  ``iterations``, which covers condition numbers up to about ``2^(iterations / 2)``.

  Example:
    >>> import jax.random as jr, stiefax
    >>> from stiefax import geometry
    >>> w = stiefax.flax.orthonormal_init()(jr.key(0), (6, 3))
    >>> xi = geometry.stiefel_tangent(w, 0.3 * jr.normal(jr.key(1), (6, 3)))
    >>> bool(geometry.isometry_residual(geometry.cayley_retract(w, xi)) < 1e-5)
    True

  Args:
    w: frames ``(..., d, r)`` on the manifold.
    xi: tangent steps of the same shape.
    iterations: the most Schulz iterations of the ``2r x 2r`` inverse.

  Returns:
    The retracted frames, same shape.
  """
  p_xi = xi - 0.5 * (w @ (mT(w) @ xi))
  u = jnp.concatenate([p_xi, w], axis=-1)
  v = jnp.concatenate([w, -p_xi], axis=-1)
  vtu = mT(v) @ u
  m = eye_like(vtu) - 0.5 * vtu
  vtw = mT(v) @ w
  return w + u @ (_schulz_inverse(m, iterations) @ vtw)
