"""The Riemannian sphere transforms of :mod:`stiefax.sphere`."""

from __future__ import annotations

import math
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional
from typing import Sequence
import warnings

import chex
import jax
import jax.numpy as jnp
import optax

from stiefax import _checks
from stiefax import _geometry as geometry
from stiefax import _routing
from stiefax._frames import FrameSpec
from stiefax._matrix import compute_dtype
from stiefax._moments import ScalarMomentState
from stiefax._projections import norm_cap
from stiefax._resolve import FramesLike
from stiefax._resolve import resolve_frames


class _Frames(NamedTuple):
  """A leaf's sphere frames: its spec (``None`` for vectors and scalars) and the axes
  of :meth:`stiefax.FrameSpec.view` that one frame spans."""

  spec: Optional[FrameSpec]
  axes: tuple[int, ...]

  def view(self, x: jax.Array) -> jax.Array:
    """The entries of ``x`` that are frames, in the split layout."""
    return x if self.spec is None else self.spec.view(x)

  def unview(self, v: jax.Array, like: jax.Array) -> jax.Array:
    """``v`` (a view) back in the layout of ``like``, zero outside the selection."""
    return v if self.spec is None else self.spec.from_view(v, like.shape)

  def columns(self, view_shape: Sequence[int]) -> int:
    """The column count ``r`` of each frame (1 for vectors and scalars)."""
    if self.spec is None:
      return 1
    return math.prod(view_shape[a] for a in self.spec.axes(len(view_shape))[1])


def _leaf_frames(frames: FramesLike, path: Any, w: jax.Array) -> _Frames:
  """The sphere frames of leaf ``w``: a vector is one ``d x 1`` frame and a scalar a
  ``1 x 1`` frame, whatever ``frames`` says."""
  if w.ndim <= 1:
    return _Frames(None, tuple(range(w.ndim)))
  spec = resolve_frames(frames, path, w)
  return _Frames(spec, spec.frame_axes(w.shape))


def frame_inner(a: jax.Array, b: jax.Array, axes: Sequence[int]) -> jax.Array:
  """``<A, B>`` per frame, kept as size-1 axes so it broadcasts against the leaf."""
  return jnp.sum(a * b, axis=tuple(axes), keepdims=True)


def _cd(x: jax.Array) -> jnp.dtype:
  return jnp.promote_types(compute_dtype(x.dtype), jnp.float32)


def project_to_sphere_tangent(w: jax.Array, g: jax.Array, axes: Sequence[int]) -> jax.Array:
  """``G - <G, W> / ||W||^2 W`` per frame (``G`` itself where ``W = 0``)."""
  coef = geometry.safe_divide(frame_inner(g, w, axes), frame_inner(w, w, axes))
  return g - coef * w


def sphere_project(*, frames: FramesLike = None) -> optax.GradientTransformation:
  """Projects each frame's update onto the tangent space of its sphere.

  ``G -> G - <G, W> / ||W||^2 W``: the orthogonal projection onto
  ``{X : <X, W> = 0}``, the tangent space at ``W`` of the sphere of radius ``||W||``.
  It is the sphere's analogue of the Stiefel projection (paper eq. 3). For a
  scale-invariant loss the gradient is already tangent (``<grad, W> = 0``, by the
  argument of Proposition 1 applied to the scaling group), so the projection only
  removes what the optimizer adds (weight decay, for instance: the gradient
  ``lambda W`` is annihilated, as in Proposition 8). A zero frame is left unprojected.

  Example:
    >>> import jax.numpy as jnp, optax, stiefax
    >>> w = jnp.array([3.0, 4.0])
    >>> out, _ = stiefax.sphere.sphere_project().update(
    ...     jnp.array([1.0, 0.0]), optax.EmptyState(), w)
    >>> out.round(4)                      # (1, 0) - 3/25 (3, 4)
    Array([ 0.64, -0.48], dtype=float32)

  Args:
    frames: how each leaf is grouped into frames: ``None`` (by its name, see
      :func:`stiefax.layouts.resolve_frames`), a :class:`stiefax.FrameSpec` or a
      callable ``(path, leaf) -> FrameSpec``; vectors are one frame.

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """

  def leaf(path: Any, u: jax.Array, w: jax.Array) -> jax.Array:
    fr = _leaf_frames(frames, path, w)
    cd = _cd(u)
    out = project_to_sphere_tangent(fr.view(w).astype(cd), fr.view(u).astype(cd), fr.axes)
    return fr.unview(out.astype(u.dtype), u)

  return _routing.map_with_params("sphere_project", leaf)


def sphere_retract(
  radius: Optional[Any] = None, *, frames: FramesLike = None
) -> optax.GradientTransformation:
  """Retracts each frame onto its sphere; put it last in a chain.

  Returns ``rho (W + G) / ||W + G|| - W`` per frame, so ``optax.apply_updates`` lands
  on ``rho (W + G) / ||W + G||``, the nearest point of the sphere of radius ``rho``
  to ``W + G`` (the sphere's polar retraction, cf. paper section 3.2). ``radius=None``
  keeps each frame's current norm, ``rho = ||W||``; a given ``radius`` puts every
  frame on the sphere of that radius (from the first step on). A frame whose step is
  zero (with ``radius=None``) or not finite, or for which ``W + G = 0``, keeps its
  point exactly.

  Example:
    >>> import jax.numpy as jnp, optax, stiefax
    >>> w = jnp.array([3.0, 4.0])
    >>> tx = stiefax.sphere.sphere_retract()
    >>> u, _ = tx.update(jnp.array([1.0, -1.0]), tx.init(w), w)
    >>> w = optax.apply_updates(w, u)
    >>> float(jnp.linalg.norm(w)), w.round(4)          # 5 (4, 3) / 5
    (5.0, Array([4., 3.], dtype=float32))

  Args:
    radius: ``rho``: ``None`` (keep each frame's norm), a float, or an array that
      broadcasts against the frames' batch shape.
    frames: how each leaf is grouped into frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`); vectors are one frame.

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """

  _checks.check_hyperparams("sphere_retract", radius=radius)

  def leaf(path: Any, u: jax.Array, w: jax.Array) -> jax.Array:
    fr = _leaf_frames(frames, path, w)
    axes = fr.axes
    cd = _cd(w)
    wf, g = fr.view(w).astype(cd), fr.view(u).astype(cd)
    finite = jnp.all(jnp.isfinite(g), axis=axes, keepdims=True)
    g = jnp.where(finite, g, 0)
    a = wf + g
    norm_a = jnp.sqrt(frame_inner(a, a, axes))
    if radius is None:
      rho = jnp.sqrt(frame_inner(wf, wf, axes))
      keep = ~finite | (norm_a == 0) | jnp.all(g == 0, axis=axes, keepdims=True)
    else:
      rho = _expand_to_frames(jnp.asarray(radius, cd), wf.shape, axes)
      keep = ~finite | (norm_a == 0)
    delta = rho * geometry.safe_divide(a, norm_a) - wf
    return fr.unview(jnp.where(keep, 0, delta).astype(u.dtype), u)

  return _routing.map_with_params("sphere_retract", leaf)


def _expand_to_frames(x: jax.Array, shape: Sequence[int], axes: Sequence[int]) -> jax.Array:
  """Inserts size-1 axes into a per-frame array ``x`` (batch shape) at ``axes``."""
  batch_shape = tuple(s for i, s in enumerate(shape) if i not in axes)
  x = jnp.broadcast_to(x, batch_shape)
  return jnp.expand_dims(x, tuple(axes)) if axes else x


def sphere_moment(
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  *,
  frames: FramesLike = None,
  mu_dtype: Any = None,
) -> optax.GradientTransformation:
  """Adam moments with one second-moment scalar per frame, transported on the sphere.

  :func:`stiefax.scalar_moment` with the sphere's projection ``P_W`` in place of the
  Stiefel one. For each frame with current point ``W`` and tangent update ``xi_t``::

      m_t = P_W(b1 m_{t-1} + (1 - b1) xi_t)     # P_W(X) = X - <X, W> / ||W||^2 W
      v_t = b2 v_{t-1} + (1 - b2) ||xi_t||^2     # a scalar per frame
      out = m_hat_t / (sqrt(v_hat_t) + eps)

  ``out`` is tangent to the sphere at ``W``; with ``eps = 0`` it is degree zero in the
  gradient (Proposition 3(ii)) and ``||out|| <= 1`` (Jensen). ``v_hat = 0`` gives a
  zero step; a frame whose update is not finite keeps its moments and outputs zero
  (``skipped`` counts such frame-steps). The state is a
  :class:`stiefax.ScalarMomentState` whose ``nu`` holds one scalar per frame.

  Example:
    >>> import jax.numpy as jnp, stiefax
    >>> from stiefax.sphere import sphere_moment
    >>> sphere_moment().init(jnp.ones((16, 4, 8))).nu.shape   # one scalar per head
    (4,)

  Args:
    b1: decay of the first moment.
    b2: decay of the second moment.
    eps: added to ``sqrt(v_hat)``.
    frames: how each leaf is grouped into frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`); vectors are one frame.
    mu_dtype: dtype of ``mu`` (default: the parameter's dtype).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """

  _checks.check_hyperparams("sphere_moment", b1=b1, b2=b2, eps=eps)

  def init_fn(params: optax.Params) -> ScalarMomentState:
    def leaf(path: Any, w: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
      fr = _leaf_frames(frames, path, w)
      view_shape = fr.view(w).shape
      batch_shape = tuple(s for i, s in enumerate(view_shape) if i not in fr.axes)
      mu = jnp.zeros(w.shape, mu_dtype or w.dtype)
      nu = jnp.zeros(batch_shape, _cd(w))
      return mu, nu, jnp.zeros(batch_shape, jnp.int32)

    mu, nu, skipped = _routing.per_leaf(leaf, 3, params)
    return ScalarMomentState(jnp.zeros([], jnp.int32), mu, nu, skipped)

  def update_fn(
    updates: optax.Updates, state: ScalarMomentState, params: Optional[optax.Params] = None
  ) -> tuple[optax.Updates, ScalarMomentState]:
    _checks.require_params("sphere_moment", params, updates)
    count = optax.safe_increment(state.count)
    ok = _checks.hyperparams_ok(b1=b1, b2=b2, eps=eps)

    def leaf(
      path: Any, u: jax.Array, w: jax.Array, mu: jax.Array, nu: jax.Array, skipped: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
      fr = _leaf_frames(frames, path, w)
      axes = fr.axes
      cd = jnp.promote_types(_cd(u), nu.dtype)
      wf, xi, m_prev = fr.view(w).astype(cd), fr.view(u).astype(cd), fr.view(mu).astype(cd)
      v_prev = _expand_to_frames(nu.astype(cd), wf.shape, axes)
      finite = jnp.all(jnp.isfinite(xi), axis=axes, keepdims=True)
      if ok is not None:  # traced b1, b2, eps out of range: a counted skip
        finite = finite & ok
      xi = jnp.where(finite, xi, 0)
      m = project_to_sphere_tangent(wf, b1 * m_prev + (1 - b1) * xi, axes)
      v = b2 * v_prev + (1 - b2) * frame_inner(xi, xi, axes)
      step = m * geometry.adam_coefficient(v, count, b1, b2, eps)
      step = jnp.where(finite, step, 0)
      m = jnp.where(finite, m, m_prev)
      v = jnp.where(finite, v, v_prev)
      finite_b = jnp.squeeze(finite, axis=axes) if axes else finite
      v = jnp.squeeze(v, axis=axes) if axes else v
      return (
        fr.unview(step.astype(u.dtype), u),
        fr.unview(m.astype(mu.dtype), mu),
        v.astype(nu.dtype),
        skipped + (~finite_b).astype(jnp.int32),
      )

    out, mu, nu, skipped = _routing.per_leaf(
      leaf, 4, updates, params, state.mu, state.nu, state.skipped
    )
    return out, ScalarMomentState(count, mu, nu, skipped)

  return optax.GradientTransformation(init_fn, update_fn)


def _relative_step(frames: FramesLike) -> optax.GradientTransformation:
  """Multiplies each frame's step by ``||W|| / sqrt(r)`` (1 on a Stiefel frame)."""

  def leaf(path: Any, u: jax.Array, w: jax.Array) -> jax.Array:
    fr = _leaf_frames(frames, path, w)
    cd = _cd(u)
    wf = fr.view(w).astype(cd)
    scale = jnp.sqrt(frame_inner(wf, wf, fr.axes) / fr.columns(wf.shape))
    return fr.unview((fr.view(u).astype(cd) * scale).astype(u.dtype), u)

  return _routing.map_with_params("sphere_adam", leaf)


def _sphere_cap(max_norm: chex.Numeric, frames: FramesLike) -> optax.GradientTransformation:
  """``eta -> eta min(1, tau sqrt(r) / ||eta||)`` per frame: the step cap of
  :func:`stiefax.step_norm_cap` on sphere frames (wide ones, vectors and scalars too)."""

  def sphere_frames(
    path: Any, u: jax.Array
  ) -> tuple[jax.Array, jax.Array, int, Callable[[jax.Array], jax.Array]]:
    fr = _leaf_frames(frames, path, u)
    eta = fr.view(u).astype(_cd(u))

    def restore(x: jax.Array) -> jax.Array:
      return fr.unview(x.astype(u.dtype), u)

    return eta, frame_inner(eta, eta, fr.axes), fr.columns(eta.shape), restore

  return norm_cap(max_norm, sphere_frames)


def sphere_adam(
  learning_rate: optax.ScalarOrSchedule,
  *,
  b1: chex.Numeric = 0.9,
  b2: chex.Numeric = 0.999,
  eps: chex.Numeric = 1e-8,
  max_norm: Optional[chex.Numeric] = 0.1,
  radius: Optional[chex.Numeric] = None,
  frames: FramesLike = None,
  relative: bool = True,
  mu_dtype: Any = None,
) -> optax.GradientTransformation:
  r"""The Riemannian sphere Adam: scalar-moment, step-capped Adam on each frame's sphere.

  The corrected Riemannian Adam of the paper (section 3.2) with the sphere
  ``{||W|| = rho}`` in place of ``St(d, r)``. It is not the published Hyperball
  (:func:`stiefax.hyperball`, Wen et al. 2026), which takes any base optimizer's
  direction as it is, steps and renormalizes (``W <- R Normalize(W - eta R
  Normalize(u))``); this one projects the gradient onto the sphere's tangent space,
  transports its first moment, keeps one second-moment scalar per frame and caps the
  step before the retraction. Per frame ``W`` with ``r`` columns and Euclidean
  gradient ``g_t``::

      xi_t  = g_t - <g_t, W> / ||W||^2 W                  # sphere_project
      m_t   = P_W(b1 m_{t-1} + (1 - b1) xi_t)               # sphere_moment
      v_t   = b2 v_{t-1} + (1 - b2) ||xi_t||^2
      eta_t = -lr m_hat_t / (sqrt(v_hat_t) + eps)
      eta_t = eta_t min(1, tau sqrt(r) / ||eta_t||)         # step cap, tau = max_norm
      eta_t = eta_t ||W|| / sqrt(r)                         # relative=True
      W    <- rho (W + eta_t) / ||W + eta_t||               # sphere_retract

  A Stiefel frame has ``||W|| = sqrt(r)``, so with ``relative=True`` a frame of any
  norm takes the step B2 takes on ``St(d, r)``: its relative displacement is at most
  ``min(lr, tau sqrt(r)) / sqrt(r)`` (Proposition 3(ii); equal to ``tau`` while the
  cap binds) and its rotation at most ``arctan(tau sqrt(r))`` (cf. Proposition 6).
  With ``radius=None`` (each frame keeps its norm) and ``eps = 0`` the optimizer is
  covariant under rotations of the rows (Proposition 7), of the columns, positive
  rescaling of each frame, and rescaling of the loss (:mod:`stiefax.covariance`
  measures all four). ``relative=False`` leaves the step absolute.

  Example:
    >>> import jax, jax.numpy as jnp, optax, stiefax
    >>> w = jax.random.normal(jax.random.key(0), (16, 2, 4))   # two heads
    >>> tx = stiefax.sphere.sphere_adam(1.0)
    >>> state = tx.init(w)
    >>> g = jax.random.normal(jax.random.key(1), w.shape)
    >>> updates, state = tx.update(g, state, w)
    >>> norms = lambda x: jnp.sqrt(jnp.sum(x ** 2, axis=(0, 2)))
    >>> bool(jnp.allclose(norms(optax.apply_updates(w, updates)), norms(w)))
    True

  Args:
    learning_rate: the rate (a float or an Optax schedule); the step is capped, so
      with 1.0 the cap sets the step.
    b1: first-moment decay.
    b2: second-moment decay.
    eps: added to ``sqrt(v_hat)``: the gradient scale below which frames slow down.
    max_norm: ``tau`` of the cap ``||eta|| <= tau sqrt(r)`` (before the relative
      scaling); ``None`` drops the cap.
    radius: ``None`` (keep each frame's norm) or the radius of every frame's sphere.
      A frame of norm 0 at ``init`` could never move unless ``radius`` is given and
      ``relative=False``; otherwise it is refused in one line naming its leaf.
    frames: how each leaf is grouped into frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`); vectors are one frame.
    relative: scale each step by ``||W|| / sqrt(r)``, so that the step is an angle.
    mu_dtype: dtype of the first moment (default: the parameter's).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  _checks.check_hyperparams(
    "sphere_adam",
    learning_rate=learning_rate,
    b1=b1,
    b2=b2,
    eps=eps,
    max_norm=max_norm,
    radius=radius,
  )
  parts = [
    sphere_project(frames=frames),
    sphere_moment(b1, b2, eps, frames=frames, mu_dtype=mu_dtype),
    optax.scale_by_learning_rate(learning_rate),
  ]
  if max_norm is not None:
    parts.append(_sphere_cap(max_norm, frames))
  if relative:
    parts.append(_relative_step(frames))
  parts.append(sphere_retract(radius, frames=frames))
  tx = optax.chain(*parts)
  if radius is not None and not relative:
    return tx  # a zero frame's first step puts it on the sphere of that radius
  why = "its sphere keeps radius 0" if radius is None else "its step is relative to its norm"

  def init_fn(params: optax.Params) -> optax.OptState:
    _refuse_zero_frames("stiefax.sphere.sphere_adam", why, frames, params)
    return tx.init(params)

  return tx._replace(init=init_fn)


def _refuse_zero_frames(name: str, why: str, frames: FramesLike, params: optax.Params) -> None:
  """Raises, naming the leaf, where a frame of ``params`` has norm 0 and so could never
  move, for the reason ``why``. Traced parameters have no values to check."""

  def leaf(path: Any, w: Any) -> None:
    w = jnp.asarray(w)
    fr = _leaf_frames(frames, path, w)
    view = fr.view(w).astype(_cd(w))
    _checks.refuse_zero_norms(
      name,
      "a frame of",
      path,
      frame_inner(view, view, fr.axes),
      why,
      "initialise it nonzero or label it for another transform",
    )

  jax.tree_util.tree_map_with_path(leaf, params)


def hyperball_adam(*args: Any, **kwargs: Any) -> optax.GradientTransformation:
  """Deprecated name of :func:`sphere_adam` (removed in 0.5).

  The name suggested the published Hyperball, which is :func:`stiefax.hyperball`
  (with :func:`stiefax.adamh` and :func:`stiefax.muonh`); this is the Riemannian
  sphere Adam, :func:`sphere_adam`, with the same arguments.

  Example:
    >>> import warnings, stiefax
    >>> with warnings.catch_warnings():
    ...   warnings.simplefilter("ignore", DeprecationWarning)
    ...   tx = stiefax.sphere.hyperball_adam(1.0)  # stiefax.sphere.sphere_adam(1.0)

  Args:
    *args: the positional arguments of :func:`sphere_adam`.
    **kwargs: its keyword arguments.

  Returns:
    ``sphere_adam(*args, **kwargs)``.
  """
  warnings.warn(
    "stiefax.sphere.hyperball_adam is deprecated: it is the Riemannian sphere Adam, now"
    " stiefax.sphere.sphere_adam; the published Hyperball is stiefax.hyperball.",
    DeprecationWarning,
    stacklevel=2,
  )
  return sphere_adam(*args, **kwargs)
