"""Stateless frame transforms: the tangent projections and the step cap.

Each is an ``optax.GradientTransformation`` that maps every frame's update by a
projection: onto the tangent (or horizontal) space at the current point ``W``
(:func:`stiefel_project`, :func:`grassmann_project`, :func:`canonical_gradient`, which
read ``params``), or onto the Frobenius ball of radius ``tau sqrt(r)``
(:func:`step_norm_cap`). They are exported by :mod:`stiefax`; see
:func:`stiefax.riemannian_adam` for the chain they belong to.
"""

from __future__ import annotations

import math
from typing import Any
from typing import Callable
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

__all__ = [
  "PROJECTORS",
  "stiefel_project",
  "grassmann_project",
  "canonical_gradient",
  "step_norm_cap",
]

#: Tangent projectors by name (``projector=`` of the moments and the aliases).
PROJECTORS = tuple(geometry.PROJECTIONS)


def _projection(
  name: str, fn: Callable[[jax.Array, jax.Array], jax.Array], frames: FramesLike
) -> optax.GradientTransformation:
  def leaf(path: Any, u: jax.Array, w: jax.Array) -> jax.Array:
    spec = checked_frames(frames, path, w)
    cd = _routing.update_dtype(u, w)
    out = fn(spec.to_frames(w).astype(cd), spec.to_frames(u).astype(cd))
    return spec.from_frames(out, u.shape).astype(w.dtype)

  return _routing.map_with_params(name, leaf)


def stiefel_project(*, frames: FramesLike = None) -> optax.GradientTransformation:
  """Projects each frame's update onto the tangent space (paper eq. 3).

  ``G -> Pi_W(G) = G - W sym(W^T G)``: the Riemannian gradient in the embedded
  metric, so the chain that follows performs steepest descent on ``St(d, r)``
  (Proposition 2). Weight decay ``lambda W`` is annihilated (Proposition 8).

  Example:
    >>> import jax, jax.numpy as jnp, optax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (6, 2, 3))
    >>> g = jax.random.normal(jax.random.key(1), w.shape)
    >>> xi, _ = stiefax.stiefel_project().update(g, optax.EmptyState(), w)
    >>> bool(stiefax.diagnostics.tangency_error(w, xi) < 1e-6)
    True

  Args:
    frames: how each leaf is viewed as frames: ``None`` (by its name, see
      :func:`stiefax.layouts.resolve_frames`), a :class:`FrameSpec` or a callable
      ``(path, leaf) -> FrameSpec``.

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  return _projection("stiefel_project", geometry.PROJECTIONS["stiefel"].project, frames)


def grassmann_project(*, frames: FramesLike = None) -> optax.GradientTransformation:
  """Projects each frame's update onto the horizontal space ``(I - W W^T) G``.

  The PA16 / B2-SGD projector: besides the normal part it removes the per-frame
  gauge block ``W W^T G``, which is *not* a symmetry of attention (Proposition 1), so
  it discards the ``||Pi_{G_W} g||^2`` share of the decrease (Proposition 2, eq. 12).

  Example:
    >>> import jax, jax.numpy as jnp, optax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (6, 2, 3))
    >>> g = jax.random.normal(jax.random.key(1), w.shape)
    >>> h, _ = stiefax.grassmann_project().update(g, optax.EmptyState(), w)
    >>> bool(jnp.max(jnp.abs(jnp.einsum("dhr,dhs->hrs", w, h))) < 1e-6)  # W^T h = 0
    True

  Args:
    frames: how each leaf is viewed as frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  return _projection("grassmann_project", geometry.PROJECTIONS["grassmann"].project, frames)


def canonical_gradient(*, frames: FramesLike = None) -> optax.GradientTransformation:
  """Maps each frame's gradient to the canonical-metric gradient ``G - W G^T W`` (eq. 4).

  Used by the B2m-can arm. The result is tangent at ``W``.

  Example:
    >>> import jax, optax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (6, 2, 3))
    >>> g = jax.random.normal(jax.random.key(1), w.shape)
    >>> xi, _ = stiefax.canonical_gradient().update(g, optax.EmptyState(), w)
    >>> bool(stiefax.diagnostics.tangency_error(w, xi) < 1e-6)
    True

  Args:
    frames: how each leaf is viewed as frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  return _projection("canonical_gradient", geometry.PROJECTIONS["canonical"].project, frames)


def step_norm_cap(
  max_norm: Any = 0.1, *, frames: FramesLike = None
) -> optax.GradientTransformation:
  """Caps each frame's step at Frobenius norm ``tau * sqrt(r)`` (paper section 3.2).

  ``eta -> eta * min(1, tau sqrt(r) / ||eta||_F)`` with ``tau = max_norm`` and ``r``
  the frame's column count. With the cap the largest principal angle between
  ``col(W)`` and ``col(W + eta)`` is at most ``arctan(tau sqrt(r))`` (Proposition
  6(ii)). It does not read ``params``.

  Example:
    >>> import jax.numpy as jnp, optax, stiefax
    >>> step = jnp.ones((4, 1, 4))       # one 4 x 4 frame, ||step||_F = 4
    >>> out, _ = stiefax.step_norm_cap(0.1).update(step, optax.EmptyState())
    >>> float(jnp.linalg.norm(out))      # capped at 0.1 * sqrt(4)
    0.2...

  Args:
    max_norm: ``tau``; a float (finite and > 0, else a ValueError) or a scalar array
      (traced under ``optax.inject_hyperparams``, so it can follow a schedule there;
      a traced value that is not finite and >= 0 makes the step NaN, which the
      retraction that follows skips and counts).
    frames: how each leaf is viewed as frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`).

  Returns:
    An ``optax.GradientTransformation``.
  """

  _checks.check_hyperparams("step_norm_cap", max_norm=max_norm)

  def stiefel_frames(
    path: Any, u: jax.Array
  ) -> tuple[jax.Array, jax.Array, int, Callable[..., Any]]:
    spec = checked_frames(frames, path, u)
    cd = jnp.promote_types(compute_dtype(u.dtype), jnp.float32)
    eta = spec.to_frames(u).astype(cd)
    restore = lambda x: spec.from_frames(x, u.shape).astype(u.dtype)
    return eta, _routing.expand(geometry.frame_sq_norm(eta)), eta.shape[-1], restore

  return norm_cap(max_norm, stiefel_frames)


def norm_cap(
  max_norm: Any,
  frames_of: Callable[[Any, jax.Array], tuple[jax.Array, jax.Array, int, Callable[..., Any]]],
) -> optax.GradientTransformation:
  """The step cap of :func:`step_norm_cap` on the frames that ``frames_of`` finds.

  ``frames_of(path, u) -> (eta, sq_norm, r, restore)``: the leaf's frames in the
  compute dtype, their squared Frobenius norms (broadcasting against ``eta``), their
  column count and the map from capped frames back to a leaf like ``u``.
  :func:`step_norm_cap` views Stiefel frames; :func:`stiefax.sphere.sphere_adam` views
  sphere frames, which may be wide, vectors or scalars. ``max_norm`` is checked by
  the caller.
  """

  def init_fn(params: optax.Params) -> optax.EmptyState:
    del params
    return optax.EmptyState()

  def update_fn(
    updates: optax.Updates, state: optax.EmptyState, params: Optional[optax.Params] = None
  ) -> tuple[optax.Updates, optax.EmptyState]:
    del params
    ok = _checks.hyperparams_ok(max_norm=max_norm)  # a traced tau out of range: a NaN step

    def leaf(path: Any, u: jax.Array) -> jax.Array:
      eta, sq_norm, r, restore = frames_of(path, u)
      limit = jnp.asarray(max_norm, eta.dtype) * math.sqrt(r)
      factor = _checks.nan_unless(ok, _routing.cap_factor(jnp.sqrt(sq_norm), limit))
      return restore(eta * factor)

    return jax.tree_util.tree_map_with_path(leaf, updates), state

  return optax.GradientTransformation(init_fn, update_fn)


def project(
  projector: str = "stiefel", *, frames: FramesLike = None
) -> optax.GradientTransformation:
  """The projection transform called ``projector``: a key of :data:`stiefax.geometry.PROJECTIONS`.

  ``project("stiefel")`` is :func:`stiefel_project`, ``project("grassmann")``
  :func:`grassmann_project` and ``project("canonical")`` :func:`canonical_gradient`.

  Example:
    >>> import jax, optax, stiefax
    >>> from stiefax._projections import project
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (6, 2, 3))
    >>> g = jax.random.normal(jax.random.key(1), w.shape)
    >>> xi, _ = project("canonical").update(g, optax.EmptyState(), w)
    >>> bool(stiefax.diagnostics.tangency_error(w, xi) < 1e-6)
    True

  Args:
    projector: ``"stiefel"`` (eq. 3), ``"grassmann"`` (horizontal) or ``"canonical"``
      (eq. 4).
    frames: how each leaf is viewed as frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  fn = geometry.projection(projector).project
  return _projection(f"project({projector!r})", fn, frames)
