"""The geometric diagnostics of :mod:`stiefax.diagnostics`."""

from __future__ import annotations

import functools
import math
from typing import Any
from typing import NamedTuple
from typing import Optional

import chex
import jax
import jax.numpy as jnp
import optax

from stiefax import _geometry as geometry
from stiefax._frames import FrameSpec
from stiefax._labels import label_mask
from stiefax._layouts import STIEFEL_LABEL
from stiefax._layouts import path_names
from stiefax._resolve import FramesLike
from stiefax._resolve import LabelsLike
from stiefax._resolve import checked_frames
from stiefax._resolve import resolve_frames


def _labelled_leaves(
  params: Any, labels: LabelsLike, label: str, frames: FramesLike
) -> list[tuple[int, Any, FrameSpec, jax.Array]]:
  """``[(index, path, spec, leaf)]`` for the labelled leaves (see ``resolve_labels``).

  ``index`` is the leaf's position in ``jax.tree.leaves(params)``.
  """
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return [
    (i, p, checked_frames(frames, p, x), x)
    for i, ((p, x), keep) in enumerate(zip(flat, label_mask(params, labels, label)))
    if keep
  ]


def _frame_leaves(
  params: Any, labels: LabelsLike, label: str, frames: FramesLike
) -> list[tuple[FrameSpec, jax.Array]]:
  """``[(spec, leaf)]`` for the labelled leaves."""
  return [(spec, x) for _, _, spec, x in _labelled_leaves(params, labels, label, frames)]


def _wide(x: jax.Array) -> jax.Array:
  """``x`` in float32 or wider (16-bit inputs are measured in float32)."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def isometry_error(
  params: Any,
  labels: LabelsLike = None,
  frames: FramesLike = None,
  *,
  label: str = STIEFEL_LABEL,
) -> jax.Array:
  """``max |W^T W - I|`` over every frame (the paper's isometry error).

  Computed in float32 or wider. A tree with no labelled frame raises a ValueError
  (it never reports 0.0 for nothing measured).

  Example:
    >>> import jax.numpy as jnp, stiefax
    >>> float(stiefax.diagnostics.isometry_error(jnp.eye(4)[:, :2]))
    0.0

  Args:
    params: an array or a parameter tree.
    labels: which leaves are frames: ``None`` (default: the query/key weights found by
      :func:`stiefax.layouts.qk_labels`; a single array is one frame parameter), a label
      tree or a callable ``params -> labels`` (see
      :func:`stiefax.labels.resolve_labels`).
    frames: how each leaf is viewed as frames (``None``:
      :func:`stiefax.layouts.qk_frames`, which reads the layout from the name; see
      :func:`stiefax.layouts.resolve_frames`).
    label: the label that marks frames.

  Returns:
    A scalar.
  """
  errs = [
    jnp.max(
      geometry.isometry_residual(spec.to_frames(x).astype(jnp.promote_types(x.dtype, jnp.float32)))
    )
    for spec, x in _frame_leaves(params, labels, label, frames)
  ]
  if not errs:
    raise ValueError(
      f"isometry_error: no leaf of the params is labelled {label!r}, so there is no"
      " frame to measure (an error of 0.0 would look like success). Check the"
      " labels (stiefax.layouts.qk_labels(params) shows which leaves are frames, and"
      " is what labels=None selects)."
    )
  return jnp.max(jnp.stack([e.astype(jnp.float32) for e in errs]))


def tangency_error(w: chex.Array, x: chex.Array, frames: FramesLike = None) -> chex.Array:
  """``max |W^T X + X^T W|``: zero when ``X`` is tangent to ``St(d, r)`` at ``W``.

  Example:
    >>> import jax.numpy as jnp, stiefax
    >>> w = jnp.eye(3)[:, :1]
    >>> float(stiefax.diagnostics.tangency_error(w, jnp.array([[0.], [1.], [0.]])))
    0.0

  Args:
    w: a frame parameter.
    x: an update of the same shape.
    frames: how both are viewed as frames (a :class:`stiefax.FrameSpec`, or a
      callable ``(path, array) -> FrameSpec`` called with an empty path; ``None``:
      :func:`stiefax.layouts.resolve_frames` at the root path, ``FrameSpec()``).

  Returns:
    A scalar.
  """
  spec = resolve_frames(frames, (), w)
  wf, xf = spec.to_frames(w), spec.to_frames(x)
  s = geometry.mT(wf) @ xf
  return jnp.max(jnp.abs(s + geometry.mT(s)))


# ----------------------------------------------------------------------------
# Gauge content (Proposition 1, Table 8).
# ----------------------------------------------------------------------------


class GaugeContent(NamedTuple):
  """Result of :func:`gauge_content`; each field has the frames' batch shape (one per head).

  Attributes:
    joint: ``||P_joint (g_Q, g_K)|| / ||(Pi g_Q, Pi g_K)||``, the joint ``O(r)``
      (gauge) fraction of the tangent gradient: zero for a true gradient
      (Proposition 1).
    per_frame: ``||P_{G_WQ x G_WK} (g_Q, g_K)|| / ||(Pi g_Q, Pi g_K)||``, the
      per-frame ``O(r)`` fraction: about 0.25 for a random tangent vector at
      ``d=128, r=16`` (Table 8).
  """

  joint: jax.Array
  per_frame: jax.Array


def _skew_sq_norm(a: jax.Array) -> jax.Array:
  """``||skew(A)||_F^2`` per matrix of a batch ``(..., r, r)``."""
  return geometry.frame_sq_norm(0.5 * (a - geometry.mT(a)))


def gauge_content(
  w_q: jax.Array,
  w_k: jax.Array,
  g_q: jax.Array,
  g_k: jax.Array,
  frames: FramesLike = None,
) -> GaugeContent:
  """Gauge content of a query/key gradient: joint ``O(r)`` vs per-frame ``O(r)`` (Table 8).

  An attention score ``(X W_Q)(X W_K)^T`` is invariant under the *joint* action
  ``(W_Q, W_K) -> (W_Q R, W_K R)``, ``R`` in ``O(r)`` (one ``R`` per head), so by
  Proposition 1 a true gradient has no component along its orbit. The orbit's tangent
  directions are ``(W_Q Omega, W_K Omega)`` with ``Omega`` skew, and for orthonormal
  frames the orthogonal projection of ``(g_Q, g_K)`` onto them has norm
  ``||skew(W_Q^T g_Q + W_K^T g_K)||_F / sqrt(2)``. The *per-frame* action
  ``W_Q -> W_Q R`` alone is not a symmetry; its directions ``(W_Q Omega_1, W_K
  Omega_2)`` (the spaces ``G_W`` of section 5.3) carry
  ``sqrt(||skew(W_Q^T g_Q)||^2 + ||skew(W_K^T g_K)||^2)``. Both are reported as
  fractions of the tangent-gradient norm ``||(Pi_WQ g_Q, Pi_WK g_K)||_F`` (eq. 3):

  * ``joint``: machine zero for the gradient of any function of the scores; about
    ``sqrt((r - 1) / (4 (d - r) + 2 (r - 1)))`` (0.18 at ``d=128, r=16``) for a
    random pair.
  * ``per_frame``: about ``sqrt((r - 1) / (2 (d - r) + (r - 1)))`` (0.25 at
    ``d=128, r=16``) for a random tangent vector, the dimension count of Table 8;
    removing it (the Grassmann projector) deletes descent signal (Proposition 2).

  The frames must be the units the scores are invariant on: one frame per head (the
  default ``FrameSpec()`` on ``(d_model, heads, head_dim)`` kernels), not merged
  block frames. A frame pair whose tangent gradient is zero reports 0.

  Example:
    >>> import jax, jax.numpy as jnp, stiefax
    >>> init = stiefax.flax.orthonormal_init()
    >>> wq, wk = (init(jax.random.key(0), (8, 2, 3)),
    ...           init(jax.random.key(1), (8, 2, 3)))
    >>> x = jax.random.normal(jax.random.key(2), (5, 8))
    >>> def loss(wq, wk):
    ...   s = jnp.einsum("nhr,mhr->hnm", jnp.einsum("nd,dhr->nhr", x, wq),
    ...                  jnp.einsum("nd,dhr->nhr", x, wk))
    ...   return jnp.sum(jax.nn.softmax(s) ** 2)
    >>> gq, gk = jax.grad(loss, argnums=(0, 1))(wq, wk)
    >>> gc = stiefax.diagnostics.gauge_content(wq, wk, gq, gk)
    >>> bool(jnp.all(gc.joint < 1e-5)), bool(jnp.all(gc.per_frame > 1e-2))
    (True, True)

  Args:
    w_q: query kernel (frames on the manifold), e.g. ``(d_model, heads, head_dim)``.
    w_k: key kernel, same shape.
    g_q: Euclidean gradient (or any update) for ``w_q``, same shape.
    g_k: Euclidean gradient for ``w_k``, same shape.
    frames: how the four arrays are viewed as frames (a :class:`stiefax.FrameSpec`, or
      a callable ``(path, array) -> FrameSpec``, called with an empty path; ``None``:
      :func:`stiefax.layouts.resolve_frames` at the root path, ``FrameSpec()``).

  Returns:
    A :class:`GaugeContent` of the frames' batch shape, computed in float32 or wider.
  """
  shapes = [jnp.shape(a) for a in (w_q, w_k, g_q, g_k)]
  if len(set(shapes)) != 1:
    raise ValueError(
      "gauge_content: w_q, w_k, g_q and g_k must have one shape (the joint O(r)"
      f" action pairs query head h with key head h); got shapes {shapes[0]},"
      f" {shapes[1]}, {shapes[2]} and {shapes[3]}."
    )
  spec = resolve_frames(frames, (), w_q)
  wq, wk, gq, gk = (_wide(spec.to_frames(jnp.asarray(a))) for a in (w_q, w_k, g_q, g_k))
  aq, ak = geometry.mT(wq) @ gq, geometry.mT(wk) @ gk
  tangent = jnp.sqrt(
    geometry.frame_sq_norm(geometry.stiefel_tangent(wq, gq))
    + geometry.frame_sq_norm(geometry.stiefel_tangent(wk, gk))
  )
  joint = jnp.sqrt(0.5 * _skew_sq_norm(aq + ak))
  per_frame = jnp.sqrt(_skew_sq_norm(aq) + _skew_sq_norm(ak))
  safe = tangent > 0
  den = jnp.where(safe, tangent, 1)
  return GaugeContent(
    joint=jnp.where(safe, joint / den, 0),
    per_frame=jnp.where(safe, per_frame / den, 0),
  )


# ----------------------------------------------------------------------------
# O(d)-equivariance (Proposition 7, Table 9).
# ----------------------------------------------------------------------------


def _householder_product(vs: jax.Array) -> jax.Array:
  """``H(v_1) ... H(v_k)`` with ``H(v) = I - 2 v v^T / ||v||^2``: exactly orthogonal.

  Matrix products only (safe inside fused programs on every backend).
  """
  d = vs.shape[-1]
  eye = jnp.eye(d, dtype=vs.dtype)

  def body(q: jax.Array, v: jax.Array) -> tuple[jax.Array, None]:
    u = v / jnp.sqrt(jnp.sum(jnp.square(v)))
    return q - 2.0 * jnp.outer(q @ u, u), None

  q, _ = jax.lax.scan(body, eye, vs)
  return q


def _rotate(q: jax.Array, w: jax.Array) -> jax.Array:
  """``Q^T W`` acting on the row axis (axis 0) of a ``(d, heads, r)`` kernel."""
  return jnp.einsum("ed,ehr->dhr", q, w)


def equivariance_violation(
  tx: optax.GradientTransformation,
  *,
  key: Optional[jax.Array] = None,
  d: int = 24,
  r: int = 6,
  heads: int = 3,
  steps: int = 15,
  rotations: int = 5,
  dtype: Any = None,
) -> jax.Array:
  """The paper's Table 9 experiment: how far ``tx`` is from ``O(d)``-equivariance.

  On the ``O(d)``-invariant problem ``f(W) = -tr(W^T A W)`` (``A`` symmetric, summed
  over the heads; Euclidean gradient ``-2 A W``) it runs ``steps`` updates of ``tx``
  from an orthonormal ``(d, heads, r)`` kernel ``W_0``, and again from ``Q^T W_0`` on
  the rotated problem ``Q^T A Q`` for ``rotations`` random orthogonal ``Q``, and
  returns ``max_Q max |W_T^(Q) - Q^T W_T|``. An update is equivariant (eq. 11) when
  ``Phi(Q^T W, Q^T g) = Q^T Phi(W, g)`` (Proposition 7): the corrected Riemannian Adam
  and Riemannian SGD give rounding error; the elementwise Riemannian Adam and Adam
  give errors far above it (of the order of ``W`` for Adam).

  ``tx`` must accept the kernel as its params (a single ``(d, heads, r)`` array, the
  layout of the default :class:`stiefax.FrameSpec`). The ``Q`` are products of ``d``
  random Householder reflections (exactly orthogonal, matrix products only), so the
  whole experiment runs under ``jax.jit`` with ``tx`` closed over. It computes in
  ``dtype`` (default: the default float type, float64 only under
  ``jax.enable_x64(True)``). The experiment is compiled once per ``tx`` object and
  size, so reuse one ``tx`` to measure it repeatedly.

  Example:
    >>> import jax, optax, stiefax
    >>> ev = stiefax.diagnostics.equivariance_violation
    >>> with jax.enable_x64(True):
    ...   ok = float(ev(stiefax.riemannian_adam(1.0), steps=3))
    ...   bad = float(ev(optax.adam(0.05), steps=3))
    >>> ok < 1e-12, bad > 1e-3
    (True, True)

  Args:
    tx: any Optax gradient transformation (called with ``params``).
    key: PRNG key for ``A``, ``W_0`` and the rotations (default ``jax.random.key(0)``).
    d: rows of each frame.
    r: columns of each frame.
    heads: frames per kernel.
    steps: updates ``T``.
    rotations: number of random ``Q``; the worst is returned.
    dtype: float dtype of the run.

  Returns:
    The scalar ``max_Q max_ij |W_T^(Q) - Q^T W_T|``.
  """
  if r > d:
    raise ValueError(f"equivariance_violation: r={r} > d={d}; frames need r <= d.")
  if min(steps, rotations, heads) < 1:
    raise ValueError(
      f"equivariance_violation: steps={steps}, rotations={rotations} and"
      f" heads={heads} must all be >= 1."
    )
  if key is None:
    key = jax.random.key(0)
  dtype = jax.dtypes.canonicalize_dtype(jnp.float64 if dtype is None else dtype)
  qs, w_start, a_all = _equivariance_problem(key, d, r, heads, rotations, dtype)
  w_final = _equivariance_trajectories(tx, w_start, a_all, steps)
  expected = jax.vmap(_rotate, in_axes=(0, None))(qs, w_final[0])
  return jnp.max(jnp.abs(w_final[1:] - expected))


@functools.partial(jax.jit, static_argnames=("d", "r", "heads", "rotations", "dtype"))
def _equivariance_problem(
  key: jax.Array, d: int, r: int, heads: int, rotations: int, dtype: jax.typing.DTypeLike
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Rotations ``Q`` and the starting kernels and matrices of the Table 9 problems.

  Index 0 is the unrotated problem ``(W_0, A)``, index ``i`` is ``(Q_i^T W_0, Q_i^T A
  Q_i)``. Compiled once per size, whatever the transform.
  """
  k_a, k_w, k_q = jax.random.split(key, 3)
  n = jax.random.normal(k_a, (d, d), dtype)
  a = 0.5 * (n + n.T) / math.sqrt(d)
  w0 = jnp.swapaxes(geometry.polar(jax.random.normal(k_w, (heads, d, r), dtype)), 0, 1)
  qs = jax.vmap(_householder_product)(jax.random.normal(k_q, (rotations, d, d), dtype))
  qs_all = jnp.concatenate([jnp.eye(d, dtype=dtype)[None], qs], axis=0)
  w_start = jax.vmap(_rotate, in_axes=(0, None))(qs_all, w0)
  a_all = jnp.einsum("qed,ef,qfg->qdg", qs_all, a, qs_all)
  return qs, w_start, a_all


@functools.partial(jax.jit, static_argnames=("tx", "steps"))
def _equivariance_trajectories(
  tx: optax.GradientTransformation, w_start: jax.Array, a_all: jax.Array, steps: int
) -> jax.Array:
  """``steps`` updates of ``tx`` on each problem ``f(W) = -tr(W^T A W)``, batched."""

  def run(w: jax.Array, a: jax.Array) -> jax.Array:
    def body(
      carry: tuple[jax.Array, optax.OptState], _: None
    ) -> tuple[tuple[jax.Array, optax.OptState], None]:
      w, state = carry
      g = -2.0 * jnp.einsum("de,ehr->dhr", a, w)
      u, state = tx.update(g, state, w)
      return (optax.apply_updates(w, u), state), None

    (w, _), _ = jax.lax.scan(body, (w, tx.init(w)), None, length=steps)
    return w

  return jax.vmap(run)(w_start, a_all)


# ----------------------------------------------------------------------------
# Step statistics (section 4.7).
# ----------------------------------------------------------------------------


class StepStatistics(NamedTuple):
  """Per-frame step statistics of one update; each field has the frames' batch shape.

  Attributes:
    grad_norm: ``||Pi_W g||_F`` at the old point, the tangent-gradient norm.
    step_norm: ``||W_new - W||_F``, the displacement.
    ratio: ``step_norm / grad_norm`` (0 when both are 0, inf when only the gradient
      is).
  """

  grad_norm: jax.Array
  step_norm: jax.Array
  ratio: jax.Array


def step_statistics(
  old_params: Any,
  new_params: Any,
  grads: Any,
  labels: LabelsLike = None,
  frames: FramesLike = None,
  *,
  label: str = STIEFEL_LABEL,
  projector: str = "stiefel",
) -> dict[str, StepStatistics]:
  """Tangent-gradient norm, step norm and their ratio for every frame (section 4.7).

  Per frame with old point ``W``, new point ``W'`` and Euclidean gradient ``g``::

      grad_norm = ||Pi_W g||_F        # eq. (3); ``projector`` picks Pi
      step_norm = ||W' - W||_F
      ratio     = step_norm / grad_norm

  The fixed-step rule keeps ``ratio`` near its learning rate (degree one,
  Proposition 3(i); the paper logs about 0.006-0.02 for PA16), the scale-free
  Riemannian Adam keeps it large as gradients shrink (degree zero, Proposition 3(ii);
  0.52 late in training). Works on linen variable dicts and nnx ``State`` trees alike
  and under ``jax.jit``.

  Example:
    >>> import jax, optax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (16, 2, 4))
    >>> g = jax.random.normal(jax.random.key(1), w.shape)
    >>> tx = stiefax.riemannian_sgd(0.02)
    >>> new = optax.apply_updates(w, tx.update(g, tx.init(w), w)[0])
    >>> stats = stiefax.diagnostics.step_statistics(
    ...     w, new, g, projector="grassmann")
    >>> stats[""].ratio.shape, bool(abs(stats[""].ratio[0] - 0.02) < 1e-3)
    ((2,), True)

  Args:
    old_params: the parameters before the update (an array or a tree).
    new_params: the parameters after it (same structure).
    grads: the Euclidean gradients at ``old_params`` (same structure).
    labels: which leaves are frames: ``None`` (default: the query/key weights found by
      :func:`stiefax.layouts.qk_labels`; a single array is one frame parameter), a label
      tree or a callable ``params -> labels`` (see
      :func:`stiefax.labels.resolve_labels`).
    frames: how each leaf is viewed as frames (``None``:
      :func:`stiefax.layouts.qk_frames`; see :func:`stiefax.layouts.resolve_frames`).
    label: the label that marks frames.
    projector: ``"stiefel"`` (default), ``"grassmann"`` or ``"canonical"``: which
      tangent gradient to measure.

  Returns:
    A dict from each frame leaf's path (its :func:`stiefax.layouts.path_names` joined by
      ``"/"``; ``""`` for a bare array) to a :class:`StepStatistics`.
  """
  if projector not in geometry.PROJECTIONS:
    raise ValueError(
      f"step_statistics: unknown projector {projector!r}; valid projectors are"
      f" {tuple(geometry.PROJECTIONS)}."
    )
  tangent = geometry.PROJECTIONS[projector].project
  n_old = len(jax.tree.leaves(old_params))
  new_flat, grad_flat = jax.tree.leaves(new_params), jax.tree.leaves(grads)
  if not n_old == len(new_flat) == len(grad_flat):
    raise ValueError(
      f"step_statistics: old_params, new_params and grads have {n_old},"
      f" {len(new_flat)} and {len(grad_flat)} leaves; give three trees of one"
      " structure."
    )
  out = {}
  for i, path, spec, w in _labelled_leaves(old_params, labels, label, frames):
    if not w.shape == new_flat[i].shape == grad_flat[i].shape:
      raise ValueError(
        f"step_statistics: the leaf at {jax.tree_util.keystr(path)} has shapes"
        f" {w.shape} (old), {new_flat[i].shape} (new) and {grad_flat[i].shape}"
        " (grads); they must match."
      )
    wf, nf, gf = (_wide(spec.to_frames(x)) for x in (w, new_flat[i], grad_flat[i]))
    grad_norm = jnp.sqrt(geometry.frame_sq_norm(tangent(wf, gf)))
    step_norm = jnp.sqrt(geometry.frame_sq_norm(nf - wf))
    ratio = jnp.where(
      grad_norm > 0,
      step_norm / jnp.where(grad_norm > 0, grad_norm, 1),
      jnp.where(step_norm > 0, jnp.inf, 0),
    )
    out["/".join(path_names(path))] = StepStatistics(grad_norm, step_norm, ratio)
  return out
