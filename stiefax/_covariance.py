"""The parameter symmetries and the covariance measure of :mod:`stiefax.covariance`."""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import Optional

import jax
import jax.numpy as jnp
import optax

from stiefax._labels import label_mask
from stiefax._layouts import STIEFEL_LABEL
from stiefax._resolve import FramesLike
from stiefax._resolve import LabelsLike
from stiefax._resolve import resolve_frames

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


def _map_selected(fn: Callable, params: Any, labels: LabelsLike, label: str) -> Any:
  """Applies ``fn(path, leaf)`` to the selected leaves, the identity elsewhere."""
  mask = iter(label_mask(params, labels, label))
  return jax.tree_util.tree_map_with_path(lambda path, x: fn(path, x) if next(mask) else x, params)


def _frame_matmul(
  mat: jax.Array, params: Any, frames: FramesLike, labels: LabelsLike, label: str, side: str
) -> Any:
  """``M W`` (side ``"left"``) or ``W M`` (``"right"``) for every selected frame."""

  def leaf(path: Any, x: jax.Array) -> jax.Array:
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


#: The group a rotation on each side of a frame ``d x r`` belongs to.
_GROUP = {"left": "O(d)", "right": "O(r)"}


def _rotation(
  mat: jax.Array, side: str, frames: FramesLike, labels: LabelsLike, label: str
) -> Action:
  """``W -> M W`` (``side="left"``) or ``W -> W M`` (``"right"``) on every selected
  frame, for orthogonal ``M``; the inverse multiplies by ``M^T`` on the same side."""
  mat = jnp.asarray(mat)
  mat_t = jnp.swapaxes(mat, -1, -2)
  return Action(
    f"{side} {_GROUP[side]}",
    lambda p: _frame_matmul(mat, p, frames, labels, label, side),
    lambda p: _frame_matmul(mat_t, p, frames, labels, label, side),
  )


def left_rotation(
  q: jax.Array,
  frames: FramesLike = None,
  *,
  labels: LabelsLike = None,
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
    frames: how each leaf is viewed as frames (``None``:
      :func:`stiefax.layouts.qk_frames`).
    labels: which leaves to act on: ``None`` (default: the query/key weights found by
      :func:`stiefax.layouts.qk_labels`; a single array is acted on whole), a label tree
      or a callable ``params -> labels`` (see :func:`stiefax.labels.resolve_labels`).
    label: the label of the leaves to act on.

  Returns:
    An :class:`Action`.
  """
  return _rotation(q, "left", frames, labels, label)


def right_rotation(
  r: jax.Array,
  frames: FramesLike = None,
  *,
  labels: LabelsLike = None,
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
    frames: as in :func:`left_rotation`.
    labels: as in :func:`left_rotation`.
    label: as in :func:`left_rotation`.

  Returns:
    An :class:`Action`.
  """
  return _rotation(r, "right", frames, labels, label)


def rescale(c: float, *, labels: LabelsLike = None, label: str = STIEFEL_LABEL) -> Action:
  """Positive rescaling ``w -> c w`` of parameters.

  ``phi(w) = c w``, ``phi^{-1}(w) = w / c``; ``l'(w) = l(w / c)`` has gradient
  ``grad l(w / c) / c``. For a scale-invariant parameter (``l(c w) = l(w)``: query/key
  under QK-norm) ``l' = l`` and the action is a symmetry. SGD, Adam and AdamW are not
  covariant under it (the second seed's example: SGD's update shrinks by ``c`` where
  it should grow by ``c``); :func:`stiefax.sphere.sphere_adam` with ``radius=None`` is.
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
      :func:`stiefax.layouts.qk_labels`; a single array is acted on whole), a label tree
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

  def loss_map(loss_fn: Callable[..., Any]) -> Callable[..., Any]:
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
    >>> float(covariance_violation(
    ...     optax.sgd(0.1), loss, w, left_rotation(q))) < 1e-5
    True
    >>> float(covariance_violation(
    ...     optax.adam(0.1), loss, w, left_rotation(q))) > 1e-2
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

  def run(theta: Any, theta_p: Any) -> jax.Array:
    def body(carry: tuple[Any, ...], _: None) -> tuple[tuple[Any, ...], jax.Array]:
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
