"""Optax gradient transformations that keep frames on the Stiefel manifold: the retractions.

This module holds the retraction transforms (:func:`polar_retract`, :func:`retract`)
and the rules below, which every frame transform follows; the moments are in
``stiefax._moments``, the projections and the step cap in ``stiefax._projections``.
Each transform routes a pytree of parameters to the pure functions of
:mod:`stiefax.geometry`, viewing every leaf as a batch of ``d x r`` frames through a
:class:`stiefax.FrameSpec` (``frames=``). Chained in the order of the paper's
section 3.2 they form the corrected Riemannian Adam (see
:func:`stiefax.riemannian_adam`)::

    projector -> scalar_moment -> scale_by_learning_rate -> step_norm_cap -> polar_retract

All transforms except ``step_norm_cap`` read the current point ``W`` and so need
``params`` in ``update``. Every transform works leaf-wise, so apply them to the frame
parameters only (``optax.partition``; see :func:`stiefax.stiefel_adamw`).

Non-finite input: a frame whose incoming update holds a NaN or an Inf (or whose squared
Frobenius norm overflows the dtype) is skipped by the
moment transforms (its moments are kept, its step is zero) and by
:func:`polar_retract` (its point is kept), and the skipped frame-steps are counted in
their state's ``skipped`` field (one int32 per frame, so head-sharded states need no
communication to keep it); read them anywhere in an
optimizer state with ``optax.tree_utils.tree_get_all_with_path(state, "skipped")``.

Hyperparameters: every transform and alias checks its scalar hyperparameters when it is
built, a ``ValueError`` naming the argument and its range (``b1``, ``b2`` in [0, 1),
``eps`` finite and >= 0, ``max_norm`` finite and > 0 or None, rates finite and >= 0).
Only Python numbers are checked then; a traced value (``optax.inject_hyperparams``, a
schedule) that is non-finite or out of range at some step skips that step and is
counted in ``skipped``, like a non-finite gradient.

Sharding: ``init`` builds every state leaf with ``zeros_like`` of the params (per-frame
leaves from one entry of each frame), so a state initialized outside ``jit`` from
sharded params is sharded like them, and every update works frame by frame (see the
how-to "Shard heads across devices").
"""

from __future__ import annotations

import functools
from typing import Any
from typing import NamedTuple
from typing import Optional
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stiefax import _checks
from stiefax import _geometry as geometry
from stiefax import _routing
from stiefax._frames import FrameSpec
from stiefax._matrix import DECOMPOSITION_METHODS
from stiefax._matrix import POLAR_METHODS
from stiefax._matrix import compute_dtype
from stiefax._resolve import FramesLike
from stiefax._resolve import checked_frames
from stiefax._resolve import frames_argument
from stiefax._resolve import warn_one_dense_frame

__all__ = [
  "PolarRetractState",
  "polar_retract",
  "retract",
  "RETRACTIONS",
]

#: Retractions by name (``retraction=`` of :func:`retract` and the aliases): the rows
#: of :data:`stiefax.geometry.RETRACTION_TABLE`.
RETRACTIONS = tuple(geometry.RETRACTION_TABLE)

_OFF_MANIFOLD = (
  "stiefax.{name}: init was given the parameter at {path} (shape {shape}, {dtype}), which"
  " is not on the Stiefel manifold: max|W^T W - I| = {err:.3g} > {tol:.3g}. Snap it onto"
  " the manifold before init with params = stiefax.flax.project_params(params{frames})"
  " (with the optimizer's labels= too, if it was given any), or initialize it with"
  " stiefax.flax.orthonormal_init({init_frames})."
)

# ``max|W^T W - I|`` above which ``polar_retract.init`` rejects a concrete float32 or
# float64 parameter (the floor of :func:`_init_tolerance`).
OFF_MANIFOLD_TOL = 1e-3


def _init_tolerance(dtype: jax.typing.DTypeLike) -> float:
  """``max(1e-3, 4 eps(dtype))``: the init check's default tolerance for a dtype.

  Rounding an exactly orthonormal frame entrywise to unit roundoff ``u = eps / 2``
  moves each entry of ``W^T W`` by at most ``2u + u^2`` (Cauchy-Schwarz on unit
  columns), about ``eps``; the factor 4 leaves room for the roundings of training.
  bfloat16: 0.031, float16: 0.0039, float32 and float64: 1e-3.
  """
  eps = float(jnp.finfo(dtype).eps)
  return max(OFF_MANIFOLD_TOL, 4.0 * eps)


class PolarRetractState(NamedTuple):
  """State of :func:`polar_retract`.

  Attributes:
    skipped: int32 per frame, steps skipped because the update was not finite.
  """

  skipped: Any


_LAPACK_WARNING = (
  "stiefax.polar_retract(method={method!r}) calls a LAPACK-backed decomposition."
  " On the CPU backend (jaxlib 0.10) such decompositions have deadlocked inside"
  " jitted or scanned training steps (eigh hangs in a jitted update of 12 heads of"
  " St(768, 64), with or without XLA_FLAGS=--xla_cpu_use_thunk_runtime=false; a"
  " batched svd polar hung in a jitted Flax step). Use method='auto' (matrix"
  " products only), or run this method outside fused training programs."
)


def polar_retract(
  method: str = "auto",
  *,
  frames: FramesLike = None,
  step_bound: float | None = None,
  init_tol: float | None = None,
) -> optax.GradientTransformation:
  """Retracts each frame with its polar factor; put it last in a chain.

  Returns ``polar(W + eta) - W``, so ``optax.apply_updates(W, updates)`` lands on
  ``polar(W + eta) = U V^T`` (the Frobenius-nearest point of ``St(d, r)``; paper
  section 3.2). For a tangent ``eta``, ``sigma_min(W + eta) >= 1`` (Proposition
  6(i)), so the polar factor is unique and smooth. A frame whose step is exactly zero
  or not finite keeps its point exactly (``skipped`` counts the non-finite ones).
  16-bit parameters are retracted in float32.

  ``init`` checks the parameters: a frame with ``max|W^T W - I|`` above ``init_tol``
  is a ValueError (initialize with :func:`stiefax.flax.orthonormal_init` or snap with
  :func:`stiefax.flax.project_params`). Under ``jax.jit``, ``nnx.jit`` or ``vmap`` the
  same check runs inside the program and raises when it runs, with the same message
  (inside a ``jax.errors.JaxRuntimeError``); it is never skipped. The default tolerance follows the
  parameter's dtype, ``max(1e-3, 4 eps)``: rounding an orthonormal frame to unit
  roundoff ``u = eps / 2`` moves ``W^T W`` by at most ``2u + u^2``, so bfloat16
  (0.031) and float16 (0.0039) frames from ``orthonormal_init`` or ``project_params``
  pass, and float32 frames are held to 1e-3. Updates come back in the parameter's
  dtype, so float32 frames keep float32 isometry under 16-bit gradients.

  Example:
    >>> import jax, jax.numpy as jnp, optax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (8, 2, 4))
    >>> tx = stiefax.polar_retract()
    >>> step = 0.1 * jax.random.normal(jax.random.key(1), w.shape)
    >>> u, _ = tx.update(step, tx.init(w), w)
    >>> bool(stiefax.diagnostics.isometry_error(optax.apply_updates(w, u)) < 1e-5)
    True

  Args:
    method: ``"auto"`` (default; matrix products only), ``"newton_schulz"``,
      ``"eigh"``, ``"svd"`` (the reference) or ``"qdwh"``; see
      :func:`stiefax.geometry.polar`. The LAPACK-backed methods warn once on the CPU
      backend, where they have deadlocked inside fused training steps.
    frames: how each leaf is viewed as frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`).
    step_bound: ``tau`` when every incoming step is tangent and capped at
      ``||eta||_F <= tau sqrt(r)`` (a preceding :func:`stiefax.step_norm_cap`). Newton-Schulz
      then runs a fixed number of iterations derived from Proposition 6
      (:func:`stiefax.geometry.newton_schulz_iterations`): no data-dependent loop and
      no reduction across frames, so head-sharded frames retract without
      communication. ``None``: iterate to convergence.
    init_tol: the largest ``max|W^T W - I|`` that ``init`` accepts (default
      ``max(1e-3, 4 eps)`` of each parameter's dtype).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  return _retract(frames, "polar", method, step_bound, init_tol, "polar_retract")


def retract(
  retraction: str = "polar",
  method: str = "auto",
  *,
  frames: FramesLike = None,
  step_bound: float | None = None,
  init_tol: float | None = None,
  name: str = "retract",
) -> optax.GradientTransformation:
  """Retracts each frame with the chosen retraction; put it last in a chain.

  Returns ``R_W(eta) - W``, so ``optax.apply_updates(W, updates)`` lands on
  ``R_W(eta)``, for ``R`` the row ``retraction`` of
  :data:`stiefax.geometry.RETRACTION_TABLE`: ``"polar"``, ``polar(W + eta)`` (the
  default; :func:`polar_retract`), ``"qr"``, ``qf(W + eta)`` with ``diag(R) > 0``
  (:func:`stiefax.geometry.qr_retract`), or ``"cayley"``, the Cayley transform of
  ``Omega = P eta W^T - W eta^T P``, ``P = I - W W^T / 2``
  (:func:`stiefax.geometry.cayley_retract`), on the manifold exactly for a tangent
  ``eta``.

  Every retraction agrees with ``W + eta`` to first order (``R_W(eta) = W + eta +
  O(||eta||^2)``); the polar one is second order (its ``O(||eta||^2)`` term is
  normal). These three are matrix products only (safe in fused CPU programs) unless
  ``method`` names a LAPACK polar.
  State, ``init`` checks and the non-finite rule as in :func:`polar_retract`.

  Example:
    >>> import jax, jax.numpy as jnp, optax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (8, 2, 4))
    >>> tx = stiefax.retract(retraction="qr")
    >>> step = stiefax.geometry.stiefel_tangent(
    ...     jnp.swapaxes(w, 0, 1),
    ...     0.1 * jax.random.normal(jax.random.key(1), (2, 8, 4)))
    >>> u, _ = tx.update(jnp.swapaxes(step, 0, 1), tx.init(w), w)
    >>> bool(stiefax.diagnostics.isometry_error(optax.apply_updates(w, u)) < 1e-5)
    True

  Args:
    retraction: one of :data:`stiefax.RETRACTIONS`.
    method: the polar method (for the retractions that take one, such as
      ``"polar"``), see :func:`polar_retract`.
    frames: how each leaf is viewed as frames (``None``: by its name, see
      :func:`stiefax.layouts.resolve_frames`).
    step_bound: ``tau`` of a preceding step cap (``"polar"`` uses it), see
      :func:`polar_retract`.
    init_tol: the largest ``max|W^T W - I|`` that ``init`` accepts (default
      ``max(1e-3, 4 eps)`` of each parameter's dtype), see :func:`polar_retract`.
    name: the name used in error messages.

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  return _retract(frames, retraction, method, step_bound, init_tol, name)


def _check_on_manifold(err: Any, *, tol: float, **message: Any) -> None:
  """The ValueError of ``init`` for a frame with ``max|W^T W - I| = err > tol``."""
  err = float(err)
  if not err <= tol:
    raise ValueError(_OFF_MANIFOLD.format(err=err, tol=tol, **message))


def _retract(
  frames: FramesLike,
  retraction: str,
  method: str,
  step_bound: Any,
  init_tol: Any,
  name: str,
) -> optax.GradientTransformation:
  row = geometry.retraction_by_name(retraction)
  _checks.check_hyperparams(name, step_bound=step_bound, init_tol=init_tol)
  if method not in POLAR_METHODS:
    raise ValueError(f"Unknown polar method {method!r}; valid methods are {POLAR_METHODS}.")
  if row.takes_method and method in DECOMPOSITION_METHODS and jax.default_backend() == "cpu":
    # The caller of polar_retract / retract.
    warnings.warn(_LAPACK_WARNING.format(method=method), RuntimeWarning, stacklevel=3)

  def init_fn(params: optax.Params) -> PolarRetractState:
    def leaf(path: Any, w: jax.Array) -> jax.Array:
      spec = checked_frames(frames, path, w)
      skipped = _routing.zeros_per_frame(spec, w, jnp.int32)  # also validates the axes, r <= d
      tol = _init_tolerance(w.dtype) if init_tol is None else float(init_tol)
      frames_arg = frames_argument(frames, path, w, spec)
      check = functools.partial(
        _check_on_manifold,
        name=who,
        path=jax.tree_util.keystr(path) or "<root>",
        shape=tuple(w.shape),
        dtype=jnp.dtype(w.dtype).name,
        frames=frames_arg,
        init_frames="" if spec == FrameSpec() else f"stiefax.{spec!r}",
        tol=tol,
      )
      if isinstance(w, jax.core.Tracer):
        # Under jit (or nnx.jit, vmap, ...) the same check runs with the program and
        # raises from it: a JaxRuntimeError that carries this ValueError's message.
        wf = spec.to_frames(w)
        cd = jnp.promote_types(compute_dtype(w.dtype), jnp.float32)
        wf = wf.astype(cd)
        gram = geometry.mT(wf) @ wf
        err = jnp.max(jnp.abs(gram - geometry.eye_like(gram)), initial=0.0)
        jax.debug.callback(check, err)
      elif getattr(w, "is_fully_addressable", True):
        # Concrete params that this process holds entirely are checked on the host (a
        # global array spread over several hosts is not fetched).
        host = np.asarray(spec.to_frames(jnp.asarray(w)), np.float64)
        host_gram = np.swapaxes(host, -1, -2) @ host
        check(float(np.max(np.abs(host_gram - np.eye(host_gram.shape[-1])), initial=0.0)))
      return skipped

    who = _checks.caller(name)  # the function the user called, e.g. stiefel_adamw
    for path, w in jax.tree_util.tree_flatten_with_path(params)[0]:
      warn_one_dense_frame(who, frames, path, w)  # every leaf, before any error
    return PolarRetractState(jax.tree_util.tree_map_with_path(leaf, params))

  def update_fn(
    updates: optax.Updates, state: PolarRetractState, params: Optional[optax.Params] = None
  ) -> tuple[optax.Updates, PolarRetractState]:
    _checks.require_params(name, params, updates)

    def leaf(
      path: Any, u: jax.Array, w: jax.Array, skipped: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
      spec = checked_frames(frames, path, w)
      cd = _routing.update_dtype(u, w)
      delta, finite = geometry.retraction_step(
        spec.to_frames(w).astype(cd),
        spec.to_frames(u).astype(cd),
        retraction=retraction,
        method=method,
        step_bound=step_bound,
      )
      return (
        spec.from_frames(delta, u.shape).astype(w.dtype),
        skipped + (~finite).astype(jnp.int32),
      )

    out, skipped = _routing.per_leaf(leaf, 2, updates, params, state.skipped)
    return out, PolarRetractState(skipped)

  return optax.GradientTransformation(init_fn, update_fn)
