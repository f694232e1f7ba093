"""The effective learning rate of :mod:`stiefax.elr`."""

from __future__ import annotations

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from stiefax._labels import label_mask
from stiefax._layouts import STIEFEL_LABEL
from stiefax._resolve import FramesLike
from stiefax._resolve import LabelsLike
from stiefax._resolve import resolve_frames
from stiefax._routing import per_leaf


class ELR(NamedTuple):
  """Radial and tangential parts of an update, and the angle it turns.

  Each field is a tree with the structure of the parameters whose leaves are scalars
  (per leaf) or arrays of the frames' batch shape (per frame).

  Attributes:
    radial: ``<Delta, w> / ||w||^2``.
    tangential: ``||Delta - radial w|| / ||w||``, the effective learning rate.
    angle: the angle between ``w_t`` and ``w_{t+1}``, in radians.
  """

  radial: Any
  tangential: Any
  angle: Any


#: What :func:`effective_learning_rate` measures one value over (``per=``).
_PER = ("leaf", "frame")


def _frame_view(
  frames: FramesLike, path: Any, w: jax.Array, w_new: jax.Array
) -> tuple[jax.Array, jax.Array, tuple[int, ...]]:
  """``w`` and ``w_new`` as :meth:`stiefax.FrameSpec.view` shows them, and the axes
  of one frame there (a vector is one frame and a scalar a ``1 x 1`` one)."""
  if w.ndim <= 1:
    return w, w_new, tuple(range(w.ndim))
  spec = resolve_frames(frames, path, w)
  return spec.view(w), spec.view(w_new), spec.frame_axes(w.shape)


def _whole(w: jax.Array, w_new: jax.Array) -> tuple[jax.Array, jax.Array, tuple[int, ...]]:
  return w, w_new, tuple(range(jnp.ndim(w)))


def _checked_per(who: str, per: Any, frames: FramesLike) -> None:
  if per not in _PER:
    raise ValueError(f"stiefax.elr.{who}: per must be 'leaf' or 'frame', got {per!r}.")
  if per == "leaf" and frames is not None:
    raise ValueError(
      f"stiefax.elr.{who}: frames= views leaves as frames, but per='leaf' measures each"
      " leaf whole; pass per='frame' for one value per frame."
    )


def _elr_leaf(
  w: jax.Array, w_new: jax.Array, axes: tuple[int, ...]
) -> tuple[jax.Array, jax.Array, jax.Array]:
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


def effective_learning_rate(
  old: Any, new: Any, frames: FramesLike = None, *, per: str = "leaf"
) -> ELR:
  """Radial part, effective learning rate and angle of the update ``old -> new``.

  With ``Delta = new - old`` and ``w = old``, per leaf (``per="leaf"``, the default)
  or per frame (``per="frame"``, each leaf viewed as frames by ``frames``)::

      radial     = <Delta, w> / ||w||^2
      tangential = ||Delta - radial w|| / ||w||
      angle      = atan2(tangential, 1 + radial)  # the angle between w and w + Delta

  ``tangential`` is the effective learning rate that keeps the parameter-update inner
  product (the second seed) rather than assuming ``<Delta, w> = 0``; ``w + Delta``
  is ``(1 + radial) w`` plus a part of relative size ``tangential`` orthogonal to
  ``w``. On a Stiefel frame (``||W||_F = sqrt(r)``) whose capped step binds,
  ``tangential = tau + O(tau^3)`` (Proposition 3(ii)). A zero ``w`` gives zeros. Pure
  ``jnp``: use it inside jitted training steps.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.elr import effective_learning_rate
    >>> elr = effective_learning_rate(jnp.array([2.0, 0.0]), jnp.array([3.0, 1.0]))
    >>> float(elr.radial), float(elr.tangential)       # Delta = (1, 1), w = (2, 0)
    (0.5, 0.5)
    >>> round(float(elr.angle), 4)                      # atan(1 / 3)
    0.3218

  Args:
    old: parameters before the update (an array or a tree).
    new: parameters after the update, same structure.
    frames: with ``per="frame"``, how each leaf is viewed as frames (``None``: by its
      name, see :func:`stiefax.layouts.resolve_frames`; vectors are one frame).
    per: ``"leaf"`` (default) for one value per leaf, ``"frame"`` for one per frame.

  Returns:
    An :class:`ELR` of trees like ``old``.
  """
  _checked_per("effective_learning_rate", per, frames)

  def leaf(path: Any, w: jax.Array, w_new: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    views = _whole(w, w_new) if per == "leaf" else _frame_view(frames, path, w, w_new)
    return _elr_leaf(*views)

  return ELR(*per_leaf(leaf, 3, old, new))


def angular_update(old: Any, new: Any, frames: FramesLike = None, *, per: str = "leaf") -> Any:
  """The angle (radians) between each leaf (or frame) before and after an update.

  ``angle(w_t, w_{t+1}) = atan2(||Delta - radial w||, ||w|| + <Delta, w> / ||w||)``,
  the angular update size; see :func:`effective_learning_rate`.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.elr import angular_update
    >>> round(float(angular_update(
    ...     jnp.array([1.0, 0.0]), jnp.array([1.0, 1.0]))), 4)
    0.7854

  Args:
    old: parameters before the update.
    new: parameters after the update.
    frames: with ``per="frame"``, how each leaf is viewed as frames (``None``: by its
      name, see :func:`stiefax.layouts.resolve_frames`).
    per: ``"leaf"`` (default) for one angle per leaf, ``"frame"`` for one per frame.

  Returns:
    A tree like ``old`` of scalars (per leaf) or per-frame arrays.
  """
  _checked_per("angular_update", per, frames)
  return effective_learning_rate(old, new, frames, per=per).angle


def update_summary(
  old: Any,
  new: Any,
  labels: LabelsLike = None,
  frames: FramesLike = None,
  *,
  label: str = STIEFEL_LABEL,
  groups: Any = None,
) -> dict[str, jax.Array]:
  """Effective learning rate per parameter group, as a flat dict of scalars.

  Leaves labelled ``label`` (by default the query/key weights found by
  :func:`stiefax.layouts.qk_labels`) are measured per frame with ``frames`` and form the
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
    >>> from stiefax.elr import update_summary
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
      :func:`stiefax.layouts.qk_labels`; a single array is one frame parameter), a label
      tree or a callable ``params -> labels`` (see
      :func:`stiefax.labels.resolve_labels`).
    frames: how the labelled leaves are viewed as frames (``None``:
      :func:`stiefax.layouts.qk_frames`).
    label: the label that marks frames.
    groups: optional group names per leaf, overriding the default grouping.

  Returns:
    A dict ``{"<group>/<stat>": scalar}``.
  """
  flat_old, treedef = jax.tree_util.tree_flatten_with_path(old)
  flat_new = treedef.flatten_up_to(new)  # type: ignore[attr-defined]  # missing from the PyTreeDef stub
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
  collected: dict[str, list[tuple[jax.Array, jax.Array, jax.Array]]] = {}
  for (path, w), w_new, fr, name in zip(flat_old, flat_new, is_frame, names):
    views = _frame_view(frames, path, w, w_new) if fr else _whole(w, w_new)
    collected.setdefault(str(name), []).append(_elr_leaf(*views))
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
    >>> from stiefax.elr import reference_elr_schedule
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
