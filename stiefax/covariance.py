"""Symmetries, covariant optimizers and the effective learning rate.

**Covariance.** An action ``phi`` maps parameters to parameters; training the
reparameterized loss ``l'(theta) = l(phi^{-1}(theta))`` from ``phi(theta_0)`` gives
the same model as training ``l`` from ``theta_0`` exactly when the optimizer is
*covariant* under ``phi``::

    theta'_t = phi(theta_t)   for every t.

When ``phi`` is a symmetry of the model (``l' = l``) covariance says that two
parameterizations of one function train identically. The paper's Propositions 3(ii)
(scale-freeness: the loss ``l' = c l``) and 7 (``O(d)``-equivariance: rotation of
the rows of every frame) are instances; :func:`covariance_violation` measures
``max_t max |phi(theta_t) - theta'_t|`` for any Optax optimizer, and
:func:`left_rotation`, :func:`right_rotation`, :func:`rescale` and
:func:`gradient_scale` build the actions.

**Effective learning rate.** For an update ``Delta = w_{t+1} - w_t`` of a parameter
(or a frame) ``w = w_t``, split ``Delta`` into its radial and tangential parts::

    radial     = <Delta, w> / ||w||^2
    tangential = ||Delta - radial w|| / ||w||        (the effective learning rate)
    angle      = angle(w_t, w_{t+1}) = atan2(tangential, 1 + radial)

The tangential part keeps the inner product ``<Delta, w>`` instead of assuming it is
zero; with ``<Delta, w> = 0`` it is the usual ``||Delta|| / ||w||``.
:func:`effective_learning_rate`, :func:`angular_update` and :func:`update_summary`
are pure ``jnp`` and run inside jitted training loops.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stiefax.frames import FramesLike
from stiefax.frames import FrameSpec
from stiefax.frames import resolve_frames
from stiefax.labels import STIEFEL_LABEL
from stiefax.labels import label_mask
from stiefax.sphere import frame_axes

__all__ = [
  "Action",
  "left_rotation",
  "right_rotation",
  "rescale",
  "gradient_scale",
  "covariance_violation",
  "ELR",
  "effective_learning_rate",
  "angular_update",
  "update_summary",
  "reference_elr_schedule",
  "ReferenceELR",
]


def __getattr__(name: str) -> Any:
  if name == "FRAMES_LABEL":
    warnings.warn(
      "stiefax.covariance.FRAMES_LABEL is deprecated; use stiefax.labels.STIEFEL_LABEL.",
      DeprecationWarning,
      stacklevel=2,
    )
    return STIEFEL_LABEL
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------
# Actions.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Action:
  """A reparameterization ``theta -> phi(theta)`` of a parameter tree.

  ``action(params)`` applies ``phi``, ``action.inverse(params)`` applies
  ``phi^{-1}``, and ``action.loss(loss_fn)`` is the loss of the reparameterized
  model, by default ``l'(theta) = l(phi^{-1}(theta))``. An action that changes the
  loss rather than the parameters (:func:`gradient_scale`) overrides ``loss`` and is
  the identity on parameters. Build actions with :func:`left_rotation`,
  :func:`right_rotation`, :func:`rescale` and :func:`gradient_scale`, or directly.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.covariance import Action
    >>> shift = Action("shift", lambda p: p + 1.0, lambda p: p - 1.0)
    >>> l = shift.loss(lambda p: jnp.sum(p ** 2))
    >>> float(l(shift(jnp.array([2.0]))))   # l'(phi(theta)) = l(theta)
    4.0

  Attributes:
    name: a short description, for tables.
    forward: ``params -> phi(params)``.
    backward: ``params -> phi^{-1}(params)``.
    loss_map: ``loss_fn -> l'``; ``None`` means ``l' = l o phi^{-1}``.
  """

  name: str
  forward: Callable[[Any], Any]
  backward: Callable[[Any], Any]
  loss_map: Optional[Callable[[Callable[..., Any]], Callable[..., Any]]] = None

  def __call__(self, params: Any) -> Any:
    return self.forward(params)

  def inverse(self, params: Any) -> Any:
    return self.backward(params)

  def loss(self, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
    """The reparameterized loss ``l'``."""
    if self.loss_map is not None:
      return self.loss_map(loss_fn)
    return lambda params, *args, **kwargs: loss_fn(self.backward(params), *args, **kwargs)


def _map_selected(fn: Callable, params: Any, labels: Any, label: str) -> Any:
  """Applies ``fn(path, leaf)`` to the selected leaves, the identity elsewhere."""
  mask = iter(label_mask(params, labels, label))
  return jax.tree_util.tree_map_with_path(lambda path, x: fn(path, x) if next(mask) else x, params)


def _frame_matmul(
  mat: jax.Array, params: Any, frames: FramesLike, labels: Any, label: str, side: str
) -> Any:
  """``M W`` (side ``"left"``) or ``W M`` (``"right"``) for every selected frame."""

  def leaf(path, x):
    spec = resolve_frames(frames, path, x)
    batch_shape, d, r = spec.frame_shape(x.shape)
    n = d if side == "left" else r
    if mat.shape[-2:] != (n, n):
      raise ValueError(
        f"The {side} rotation has shape {mat.shape}, but the parameter at"
        f" {jax.tree_util.keystr(path) or '<root>'} (shape {tuple(x.shape)}, viewed"
        f" with {spec}) has frames of d={d} rows and r={r} columns: give a"
        f" ({n}, {n}) matrix (or a batch of them), or restrict the action with"
        " labels=."
      )
    try:
      m = jnp.broadcast_to(mat, batch_shape + (n, n)).astype(x.dtype)
    except ValueError as e:
      raise ValueError(
        f"The {side} rotation of shape {mat.shape} does not broadcast against the"
        f" frames' batch shape {batch_shape} of the parameter at"
        f" {jax.tree_util.keystr(path) or '<root>'}: give one ({n}, {n}) matrix or"
        f" one per frame, {batch_shape + (n, n)}."
      ) from e
    w = spec.to_frames(x)
    out = m @ w if side == "left" else w @ m
    return spec.from_frames(out, x.shape)

  return _map_selected(leaf, params, labels, label)


def left_rotation(
  q: jax.Array,
  frames: FramesLike = FrameSpec(),
  *,
  labels: Any = None,
  label: str = STIEFEL_LABEL,
) -> Action:
  """The left action ``W -> Q W`` of ``Q`` in ``O(d)`` on every frame.

  ``phi(W) = Q W``, ``phi^{-1}(W) = Q^T W``; the reparameterized loss
  ``l'(W) = l(Q^T W)`` has gradient ``Q grad l(Q^T W)``. A covariant optimizer
  satisfies ``Phi(Q W, Q g) = Q Phi(W, g)``: the paper's ``O(d)``-equivariance
  (Proposition 7, Table 9). The corrected Riemannian Adam and SGD are covariant; an
  elementwise second moment is not.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.covariance import left_rotation
    >>> q = jnp.array([[0.0, -1.0], [1.0, 0.0]])     # 90 degrees in O(2)
    >>> act = left_rotation(q)
    >>> act(jnp.array([[1.0], [0.0]])).ravel()
    Array([0., 1.], dtype=float32)
    >>> act.inverse(act(jnp.array([[1.0], [0.0]]))).ravel()
    Array([1., 0.], dtype=float32)

  Args:
    q: an orthogonal ``(d, d)`` matrix, or a batch of them broadcasting against the
      frames' batch shape (one per head, say).
    frames: how each leaf is viewed as frames.
    labels: which leaves to act on: ``None`` (default: the query/key weights found by
      :func:`stiefax.flax.qk_labels`; a single array is acted on whole), a label tree
      or a callable ``params -> labels`` (see :func:`stiefax.labels.resolve_labels`).
    label: the label of the leaves to act on.

  Returns:
    An :class:`Action`.
  """
  q = jnp.asarray(q)
  qt = jnp.swapaxes(q, -1, -2)
  return Action(
    "left O(d)",
    lambda p: _frame_matmul(q, p, frames, labels, label, "left"),
    lambda p: _frame_matmul(qt, p, frames, labels, label, "left"),
  )


def right_rotation(
  r: jax.Array,
  frames: FramesLike = FrameSpec(),
  *,
  labels: Any = None,
  label: str = STIEFEL_LABEL,
) -> Action:
  """The right action ``W -> W R`` of ``R`` in ``O(r)`` on every frame (the gauge).

  ``phi(W) = W R``, ``phi^{-1}(W) = W R^T``. Applied jointly to ``W_Q`` and ``W_K``
  of one head (``labels`` selecting both, the same ``R`` for the pair) it is a
  symmetry of attention, ``(X W_Q R)(X W_K R)^T = X W_Q W_K^T X^T``: the gauge of
  Proposition 1. On ``St(d, r)`` the Stiefel projection, the scalar moment, the cap
  and the polar retraction all commute with it, so the corrected Riemannian Adam is
  covariant; an elementwise second moment is not.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.covariance import right_rotation
    >>> r = jnp.array([[0.0, 1.0], [1.0, 0.0]])      # swap the two columns
    >>> right_rotation(r)(jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    Array([[2., 1.],
           [4., 3.],
           [6., 5.]], dtype=float32)

  Args:
    r: an orthogonal ``(r, r)`` matrix, or a batch of them broadcasting against the
      frames' batch shape.
    frames: how each leaf is viewed as frames.
    labels: which leaves to act on: ``None`` (default: the query/key weights found by
      :func:`stiefax.flax.qk_labels`; a single array is acted on whole), a label tree
      or a callable ``params -> labels`` (see :func:`stiefax.labels.resolve_labels`).
    label: the label of the leaves to act on.

  Returns:
    An :class:`Action`.
  """
  r = jnp.asarray(r)
  rt = jnp.swapaxes(r, -1, -2)
  return Action(
    "right O(r)",
    lambda p: _frame_matmul(r, p, frames, labels, label, "right"),
    lambda p: _frame_matmul(rt, p, frames, labels, label, "right"),
  )


def rescale(c: float, *, labels: Any = None, label: str = STIEFEL_LABEL) -> Action:
  """Positive rescaling ``w -> c w`` of parameters.

  ``phi(w) = c w``, ``phi^{-1}(w) = w / c``; ``l'(w) = l(w / c)`` has gradient
  ``grad l(w / c) / c``. For a scale-invariant parameter (``l(c w) = l(w)``: query/key
  under QK-norm) ``l' = l`` and the action is a symmetry. SGD, Adam and AdamW are not
  covariant under it (the second seed's example: SGD's update shrinks by ``c`` where
  it should grow by ``c``); :func:`stiefax.hyperball_adam` with ``radius=None`` is.
  Stiefel frames have no rescaled counterpart (``c W`` leaves ``St(d, r)``).

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.covariance import rescale
    >>> act = rescale(2.0, labels={"w": "stiefel", "b": "adamw"})
    >>> moved = act({"w": jnp.array([1.0, 3.0]), "b": jnp.array([1.0])})
    >>> moved["w"], moved["b"]
    (Array([2., 6.], dtype=float32), Array([1.], dtype=float32))

  Args:
    c: the factor, ``c > 0``.
    labels: which leaves to act on: ``None`` (default: the query/key weights found by
      :func:`stiefax.flax.qk_labels`; a single array is acted on whole), a label tree
      or a callable ``params -> labels`` (see :func:`stiefax.labels.resolve_labels`).
    label: the label of the leaves to act on.

  Returns:
    An :class:`Action`.
  """
  if isinstance(c, (int, float)) and not c > 0:
    raise ValueError(f"rescale needs a positive factor c, got c={c}.")
  return Action(
    f"rescale x{c:g}" if isinstance(c, (int, float)) else "rescale",
    lambda p: _map_selected(lambda _, x: x * jnp.asarray(c, x.dtype), p, labels, label),
    lambda p: _map_selected(lambda _, x: x / jnp.asarray(c, x.dtype), p, labels, label),
  )


def gradient_scale(c: float) -> Action:
  """Scaling of the loss ``l -> c l``: identity on parameters, gradients times ``c``.

  ``phi = id`` and ``l' = c l``, so a covariant optimizer follows the same trajectory
  whatever the gradient scale: the scale-freeness of Proposition 3(ii) (exact for the
  scalar-moment Adams with ``eps = 0``). SGD is not covariant (its step is degree one
  in the gradient, Proposition 3(i)).

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.covariance import gradient_scale
    >>> act = gradient_scale(10.0)
    >>> float(act.loss(lambda w: jnp.sum(w ** 2))(jnp.array([1.0, 2.0])))
    50.0

  Args:
    c: the factor, ``c > 0``.

  Returns:
    An :class:`Action`.
  """
  if isinstance(c, (int, float)) and not c > 0:
    raise ValueError(f"gradient_scale needs a positive factor c, got c={c}.")

  def loss_map(loss_fn):
    return lambda params, *args, **kwargs: c * loss_fn(params, *args, **kwargs)

  identity = lambda p: p
  return Action(
    f"loss x{c:g}" if isinstance(c, (int, float)) else "loss scale",
    identity,
    identity,
    loss_map,
  )


def _max_abs_diff(a: Any, b: Any) -> jax.Array:
  diffs = jax.tree.leaves(jax.tree.map(lambda x, y: jnp.max(jnp.abs(x - y)), a, b))
  if not diffs:
    return jnp.zeros([])
  return jnp.max(jnp.stack(diffs))


def covariance_violation(
  tx: optax.GradientTransformation,
  loss_fn: Callable[[Any], jax.Array],
  params: Any,
  action: Action,
  steps: int = 15,
) -> jax.Array:
  """``max_{1 <= t <= T} max |phi(theta_t) - theta'_t|``: how far ``tx`` is from covariant.

  Trains ``loss_fn`` from ``params`` (``theta_t``) and the reparameterized loss
  ``l' = action.loss(loss_fn)`` from ``action(params)`` (``theta'_t``) with the same
  optimizer for ``T = steps`` full-gradient steps, and returns the largest entrywise
  deviation between ``phi(theta_t)`` and ``theta'_t`` along the way. A covariant
  optimizer gives zero up to rounding (the paper's Table 9 is the case
  ``phi = left_rotation``; run it in float64 to see ``1e-15``). Both trajectories run
  in one jitted ``lax.scan``.

  Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> from stiefax.covariance import covariance_violation, left_rotation
    >>> q, _ = jnp.linalg.qr(jax.random.normal(jax.random.key(0), (4, 4)))
    >>> w = jax.random.normal(jax.random.key(1), (4, 2))
    >>> loss = lambda w: jnp.sum(jnp.sin(w))
    >>> float(covariance_violation(optax.sgd(0.1), loss, w, left_rotation(q))) < 1e-5
    True
    >>> float(covariance_violation(optax.adam(0.1), loss, w, left_rotation(q))) > 1e-2
    True

  Args:
    tx: any Optax optimizer (``update`` receives ``params``).
    loss_fn: ``params -> scalar``.
    params: the starting point ``theta_0``.
    action: the reparameterization (see :class:`Action`).
    steps: the number of steps ``T``.

  Returns:
    A scalar.
  """
  loss_prime = action.loss(loss_fn)
  grad, grad_prime = jax.grad(loss_fn), jax.grad(loss_prime)

  def run(theta, theta_p):
    def body(carry, _):
      theta, state, theta_p, state_p = carry
      u, state = tx.update(grad(theta), state, theta)
      theta = optax.apply_updates(theta, u)
      u_p, state_p = tx.update(grad_prime(theta_p), state_p, theta_p)
      theta_p = optax.apply_updates(theta_p, u_p)
      dev = _max_abs_diff(action(theta), theta_p)
      return (theta, state, theta_p, state_p), dev

    carry = (theta, tx.init(theta), theta_p, tx.init(theta_p))
    _, devs = jax.lax.scan(body, carry, None, length=steps)
    return jnp.max(devs)

  if steps < 1:
    raise ValueError(f"covariance_violation needs steps >= 1, got steps={steps}.")
  theta_p = action(params)
  # Optimizer init may inspect concrete params (polar_retract rejects off-manifold
  # frames), so initialize outside the trace first.
  tx.init(params)
  tx.init(theta_p)
  return jax.jit(run)(params, theta_p)


# ----------------------------------------------------------------------------
# Effective learning rate.
# ----------------------------------------------------------------------------


class ELR(NamedTuple):
  """Radial and tangential parts of an update, and the angle it turns.

  Each field is a tree with the structure of the parameters whose leaves are scalars
  (per leaf) or arrays of the frames' batch shape (per frame).

  Attributes:
    radial: ``<Delta, w> / ||w||^2``.
    tangential: ``||Delta - radial w|| / ||w||``, the effective learning rate.
    angle: the angle between ``w_t`` and ``w_{t+1}``, in radians.
  """

  radial: Any  # <Delta, w> / ||w||^2
  tangential: Any  # ||Delta - radial w|| / ||w||: the effective learning rate
  angle: Any  # angle between w_t and w_{t+1}, radians


def _reduce_axes(frames: Optional[FramesLike], path: Any, x: jax.Array) -> tuple[int, ...]:
  if frames is None:
    return tuple(range(x.ndim))
  return frame_axes(resolve_frames(frames, path, x), x.shape)


def _elr_leaf(w: jax.Array, w_new: jax.Array, axes: tuple[int, ...]):
  dtype = jnp.promote_types(w.dtype, jnp.float32)
  w, w_new = w.astype(dtype), w_new.astype(dtype)
  delta = w_new - w
  ww = jnp.sum(w * w, axis=axes, keepdims=True)
  pos = ww > 0
  radial = jnp.where(pos, jnp.sum(delta * w, axis=axes, keepdims=True) / jnp.where(pos, ww, 1), 0)
  perp = delta - radial * w
  perp_norm = jnp.sqrt(jnp.sum(perp * perp, axis=axes, keepdims=True))
  tangential = jnp.where(pos, perp_norm / jnp.sqrt(jnp.where(pos, ww, 1)), 0)
  angle = jnp.arctan2(tangential, 1 + radial)
  squeeze = lambda a: jnp.squeeze(a, axis=axes) if axes else a
  return squeeze(radial), squeeze(tangential), squeeze(angle)


def effective_learning_rate(old: Any, new: Any, frames: Optional[FramesLike] = None) -> ELR:
  """Radial part, effective learning rate and angle of the update ``old -> new``.

  With ``Delta = new - old`` and ``w = old``, per leaf (``frames=None``) or per frame
  (``frames`` a :class:`stiefax.FrameSpec` or callable)::

      radial     = <Delta, w> / ||w||^2
      tangential = ||Delta - radial w|| / ||w||
      angle      = atan2(tangential, 1 + radial)      # the angle between w and w + Delta

  ``tangential`` is the effective learning rate that keeps the parameter-update inner
  product (the second seed) rather than assuming ``<Delta, w> = 0``; ``w + Delta``
  is ``(1 + radial) w`` plus a part of relative size ``tangential`` orthogonal to
  ``w``. On a Stiefel frame (``||W||_F = sqrt(r)``) whose capped step binds,
  ``tangential = tau + O(tau^3)`` (Proposition 3(ii)). A zero ``w`` gives zeros. Pure
  ``jnp``: use it inside jitted training steps.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.covariance import effective_learning_rate
    >>> elr = effective_learning_rate(jnp.array([2.0, 0.0]), jnp.array([3.0, 1.0]))
    >>> float(elr.radial), float(elr.tangential)       # Delta = (1, 1), w = (2, 0)
    (0.5, 0.5)
    >>> round(float(elr.angle), 4)                      # atan(1 / 3)
    0.3218

  Args:
    old: parameters before the update (an array or a tree).
    new: parameters after the update, same structure.
    frames: ``None`` for one value per leaf, or how each leaf is viewed as frames
      for one value per frame (vectors are one frame).

  Returns:
    An :class:`ELR` of trees like ``old``.
  """
  treedef = jax.tree_util.tree_structure(old)
  outs = jax.tree_util.tree_map_with_path(
    lambda path, w, w_new: _elr_leaf(w, w_new, _reduce_axes(frames, path, w)), old, new
  )
  flat = treedef.flatten_up_to(outs)
  return ELR(*(treedef.unflatten([o[i] for o in flat]) for i in range(3)))


def angular_update(old: Any, new: Any, frames: Optional[FramesLike] = None) -> Any:
  """The angle (radians) between each leaf (or frame) before and after an update.

  ``angle(w_t, w_{t+1}) = atan2(||Delta - radial w||, ||w|| + <Delta, w> / ||w||)``,
  the angular update size; see :func:`effective_learning_rate`.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.covariance import angular_update
    >>> round(float(angular_update(jnp.array([1.0, 0.0]), jnp.array([1.0, 1.0]))), 4)
    0.7854

  Args:
    old: parameters before the update.
    new: parameters after the update.
    frames: ``None`` (per leaf) or how each leaf is viewed as frames (per frame).

  Returns:
    A tree like ``old`` of scalars (per leaf) or per-frame arrays.
  """
  return effective_learning_rate(old, new, frames).angle


def update_summary(
  old: Any,
  new: Any,
  labels: Any = None,
  frames: FramesLike = FrameSpec(),
  *,
  label: str = STIEFEL_LABEL,
  groups: Any = None,
) -> dict[str, jax.Array]:
  """Effective learning rate per parameter group, as a flat dict of scalars.

  Leaves labelled ``label`` (by default the query/key weights found by
  :func:`stiefax.flax.qk_labels`) are measured per frame with ``frames`` and form the
  group ``"frames"``; every other leaf is measured
  as a whole and goes to ``"matrices"`` (rank >= 2) or ``"vectors"`` (rank <= 1).
  ``groups`` (a tree of group names like ``params``, or a callable
  ``params -> tree``) renames the groups. For each non-empty group::

      <group>/elr        mean tangential part (effective learning rate)
      <group>/elr_max    largest tangential part
      <group>/radial     mean radial part <Delta, w> / ||w||^2
      <group>/angle      mean angle between w_t and w_{t+1}, radians

  means taken over frames (``"frames"``) or leaves. Pure ``jnp``: record it inside a
  jitted step.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.covariance import update_summary
    >>> old = {"kernel": jnp.ones((2, 2)), "bias": jnp.array([1.0, 0.0])}
    >>> new = {"kernel": 2 * jnp.ones((2, 2)), "bias": jnp.array([1.0, 0.1])}
    >>> s = update_summary(old, new)
    >>> sorted(s)[:4]
    ['matrices/angle', 'matrices/elr', 'matrices/elr_max', 'matrices/radial']
    >>> float(s["matrices/radial"]), round(float(s["vectors/elr"]), 4)
    (1.0, 0.1)

  Args:
    old: parameters before the update.
    new: parameters after the update.
    labels: which leaves are frames: ``None`` (default: the query/key weights found by
      :func:`stiefax.flax.qk_labels`; a single array is one frame parameter), a label
      tree or a callable ``params -> labels`` (see
      :func:`stiefax.labels.resolve_labels`).
    frames: how the labelled leaves are viewed as frames.
    label: the label that marks frames.
    groups: optional group names per leaf, overriding the default grouping.

  Returns:
    A dict ``{"<group>/<stat>": scalar}``.
  """
  flat_old, treedef = jax.tree_util.tree_flatten_with_path(old)
  flat_new = treedef.flatten_up_to(new)
  is_frame = label_mask(old, labels, label)
  if groups is not None:
    gtree = groups(old) if callable(groups) else groups
    names = jax.tree.leaves(gtree)
    if len(names) != len(flat_old):
      raise ValueError(
        f"groups has {len(names)} leaves but params has {len(flat_old)}; give one"
        " group name per parameter (the structure of params)."
      )
  else:
    names = [
      "frames" if fr else ("matrices" if x.ndim >= 2 else "vectors")
      for fr, (_, x) in zip(is_frame, flat_old)
    ]
  collected: dict[str, list] = {}
  for (path, w), w_new, fr, name in zip(flat_old, flat_new, is_frame, names):
    axes = _reduce_axes(frames, path, w) if fr else tuple(range(w.ndim))
    collected.setdefault(str(name), []).append(_elr_leaf(w, w_new, axes))
  out = {}
  for name, items in collected.items():
    radial = jnp.concatenate([jnp.ravel(r) for r, _, _ in items])
    tang = jnp.concatenate([jnp.ravel(t) for _, t, _ in items])
    angle = jnp.concatenate([jnp.ravel(a) for _, _, a in items])
    out[f"{name}/elr"] = jnp.mean(tang)
    out[f"{name}/elr_max"] = jnp.max(tang)
    out[f"{name}/radial"] = jnp.mean(radial)
    out[f"{name}/angle"] = jnp.mean(angle)
  return out


class ReferenceELR(NamedTuple):
  """The reference schedule of :func:`reference_elr_schedule`, one entry per step.

  Attributes:
    learning_rate: ``eta_t``.
    weight_rms: the predicted ``||w_t||_RMS`` before step ``t``.
    elr: the predicted effective learning rate of step ``t``.
  """

  learning_rate: np.ndarray
  weight_rms: np.ndarray
  elr: np.ndarray


def reference_elr_schedule(
  learning_rate: float,
  weight_decay: float,
  steps: int,
  init_rms: float,
  *,
  update_rms: Any = 0.2,
) -> ReferenceELR:
  """The reference ELR of Adam(W) under a linear decay of the rate to zero.

  Derivation (the second note's "ELR Schedule", from Su's "Why is Adam's Update RMS
  0.2?" and "Asymptotic Estimation of AdamW's Weight RMS (Part 2)"):

  * rate: ``eta_t = eta_0 (1 - t / T)`` for ``t = 0 .. T - 1``;
  * Adam's update ``u_t`` has an entry RMS of about ``0.2`` once gradients are noise
    dominated (``update_rms``), and it is nearly orthogonal to the weight ``w_t``;
  * so AdamW's step ``w_{t+1} = (1 - eta_t lambda) w_t - eta_t u_t`` gives, per entry,

        rms_{t+1}^2 = (1 - eta_t lambda)^2 rms_t^2 + eta_t^2 update_rms^2,

    the recursion whose continuous limit ``d rms^2 / dt = -2 lambda eta_t rms^2 +
    update_rms^2 eta_t^2`` is the asymptotic estimate of Part 2 (weights settle near
    ``rms^2 ~ update_rms^2 eta_t / (2 lambda)`` while ``eta`` changes slowly, and
    grow from a small initialization ``init_rms``);
  * the effective learning rate is the relative tangential step
    ``elr_t = eta_t ||u_t|| / ||w_t|| = eta_t update_rms / rms_t``.

  With ``rms_0^2`` below the quasi-static value the weights grow early, so the ELR
  starts high, falls fast, then declines nearly linearly to zero with ``eta_t``. The
  recursion is evaluated exactly (no further approximation); compare its *shape* with
  :func:`update_summary`'s ``elr`` of a real run, since the 0.2 and the orthogonality
  are approximations.

  Example:
    >>> from stiefax.covariance import reference_elr_schedule
    >>> ref = reference_elr_schedule(1e-3, 0.1, 1000, 0.02)
    >>> bool(ref.elr[0] > ref.elr[500] > ref.elr[-1] > 0)
    True
    >>> round(float(ref.elr[0]), 4)  # 1e-3 * 0.2 / 0.02
    0.01

  Args:
    learning_rate: the peak rate ``eta_0``.
    weight_decay: AdamW's decoupled decay ``lambda``.
    steps: ``T``, the step at which the rate reaches zero.
    init_rms: the RMS of the initial weight entries.
    update_rms: Adam's update RMS per entry: a float (the reference's 0.2) or one
      value per step (e.g. measured, to test the rest of the derivation).

  Returns:
    A :class:`ReferenceELR` of ``steps`` entries.
  """
  for name, value in (
    ("learning_rate", learning_rate),
    ("init_rms", init_rms),
    ("update_rms", float(np.min(update_rms))),
  ):
    if not value > 0:
      raise ValueError(f"reference_elr_schedule: {name} must be > 0, got {value!r}.")
  if not weight_decay >= 0:
    raise ValueError(f"reference_elr_schedule: weight_decay must be >= 0, got {weight_decay!r}.")
  if not (isinstance(steps, int) and steps >= 1):
    raise ValueError(f"reference_elr_schedule: steps must be a positive int, got {steps!r}.")
  eta = learning_rate * (1 - np.arange(steps) / steps)
  u = np.broadcast_to(np.asarray(update_rms, np.float64), (steps,))
  rms2 = np.empty(steps)
  r2 = float(init_rms) ** 2
  for t in range(steps):
    rms2[t] = r2
    r2 = (1 - eta[t] * weight_decay) ** 2 * r2 + (eta[t] * u[t]) ** 2
  rms = np.sqrt(rms2)
  return ReferenceELR(eta, rms, eta * u / rms)
