"""Optax gradient transformations that keep frames on the Stiefel manifold.

Each transform routes a pytree of parameters to the pure functions of
:mod:`stiefax.geometry`, viewing every leaf as a batch of ``d x r`` frames through a
:class:`stiefax.FrameSpec` (``frames=``). Chained in the order of the paper's
section 3.2 they form the corrected Riemannian Adam (see
:func:`stiefax.riemannian_adam`)::

    projector -> scalar_moment -> scale_by_learning_rate -> step_norm_cap -> polar_retract

All transforms except :func:`step_norm_cap` read the current point ``W`` and so need
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
from stiefax._matrix import POLAR_METHODS
from stiefax._resolve import FramesLike
from stiefax._resolve import checked_frames
from stiefax._routing import expand

__all__ = [
  "PROJECTORS",
  "ScalarMomentState",
  "ElementwiseMomentState",
  "PolarRetractState",
  "scalar_moment",
  "elementwise_moment",
  "polar_retract",
  "retract",
  "RETRACTIONS",
]

#: Tangent projectors by name (``projector=`` of the moments and the aliases).
PROJECTORS = tuple(geometry.PROJECTIONS)

#: Retractions by name (``retraction=`` of :func:`retract` and the aliases): the rows
#: of :data:`stiefax.geometry.RETRACTION_TABLE`.
RETRACTIONS = tuple(geometry.RETRACTION_TABLE)

_OFF_MANIFOLD = (
  "stiefax.{name}.init: the parameter at {path} (shape {shape}, {dtype}) is not on"
  " the Stiefel manifold: max|W^T W - I| = {err:.3g} > {tol:.3g}. Initialize it with"
  " stiefax.flax.orthonormal_init(...) or snap pretrained weights with"
  " stiefax.flax.project_params(params, labels) before building the optimizer state."
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
      nu_dtype = jnp.promote_types(geometry.compute_dtype(w.dtype), jnp.float32)
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

      m_t = Pi_W(b1 m_{t-1} + (1 - b1) xi_t)          # moment transport by re-projection
      v_t = b2 v_{t-1} + (1 - b2) ||xi_t||_F^2         # a scalar per frame
      out = m_hat_t / (sqrt(v_hat_t) + eps)            # m_hat, v_hat bias-corrected

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
    ...     jax.numpy.swapaxes(w, 0, 1), jax.random.normal(jax.random.key(1), (2, 6, 3)))
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
      ``||eta||_F <= tau sqrt(r)`` (a preceding :func:`step_norm_cap`). Newton-Schulz
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
    ...     jnp.swapaxes(w, 0, 1), 0.1 * jax.random.normal(jax.random.key(1), (2, 8, 4)))
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


def _check_on_manifold(
  err: Any, *, name: str, path: str, shape: tuple[int, ...], dtype: str, tol: float
) -> None:
  """The ValueError of ``init`` for a frame with ``max|W^T W - I| = err > tol``."""
  err = float(err)
  if not err <= tol:
    raise ValueError(
      _OFF_MANIFOLD.format(name=name, path=path, shape=shape, dtype=dtype, err=err, tol=tol)
    )


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
  if (
    row.takes_method and method in geometry.DECOMPOSITION_METHODS and jax.default_backend() == "cpu"
  ):
    # The caller of polar_retract / retract.
    warnings.warn(_LAPACK_WARNING.format(method=method), RuntimeWarning, stacklevel=3)

  def init_fn(params: optax.Params) -> PolarRetractState:
    def leaf(path: Any, w: jax.Array) -> jax.Array:
      spec = checked_frames(frames, path, w)
      skipped = _routing.zeros_per_frame(spec, w, jnp.int32)  # also validates the axes, r <= d
      tol = _init_tolerance(w.dtype) if init_tol is None else float(init_tol)
      check = functools.partial(
        _check_on_manifold,
        name=name,
        path=jax.tree_util.keystr(path) or "<root>",
        shape=tuple(w.shape),
        dtype=jnp.dtype(w.dtype).name,
        tol=tol,
      )
      if isinstance(w, jax.core.Tracer):
        # Under jit (or nnx.jit, vmap, ...) the same check runs with the program and
        # raises from it: a JaxRuntimeError that carries this ValueError's message.
        wf = spec.to_frames(w)
        cd = jnp.promote_types(geometry.compute_dtype(w.dtype), jnp.float32)
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
