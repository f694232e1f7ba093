"""Geometric diagnostics: how far frames are from the manifold, and from tangency.

All functions are pure, work on parameter trees (with an optional label tree, as
given by :func:`stiefax.flax.qk_labels`), and run under ``jax.jit``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from stiefax import geometry
from stiefax.alias import STIEFEL_LABEL
from stiefax.frames import FrameSpec, FramesLike, resolve_frames

__all__ = ["isometry_error", "tangency_error"]


def _frame_leaves(params: Any, labels: Any, label: str, frames: FramesLike):
  """``[(spec, leaf)]`` for the labelled leaves (all leaves when ``labels`` is None)."""
  if labels is None:
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return [(resolve_frames(frames, p, x), x) for p, x in flat]
  tree = labels(params) if callable(labels) else labels
  flat_labels = jax.tree.leaves(tree)
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  if len(flat_labels) != len(flat):
    raise ValueError(
        f"labels has {len(flat_labels)} leaves but params has {len(flat)}; give a"
        " label tree with the structure of params (see stiefax.flax.qk_labels)."
    )
  return [
      (resolve_frames(frames, p, x), x)
      for (p, x), lab in zip(flat, flat_labels)
      if lab == label
  ]


def isometry_error(
    params: Any,
    labels: Any = None,
    frames: FramesLike = FrameSpec(),
    *,
    label: str = STIEFEL_LABEL,
) -> jax.Array:
  """``max |W^T W - I|`` over every frame (the paper's isometry error).

  Computed in float32 or wider. Zero frames (none labelled) give 0.

  Example:
    >>> import jax.numpy as jnp, stiefax
    >>> float(stiefax.diagnostics.isometry_error(jnp.eye(4)[:, :2]))
    0.0

  Args:
    params: an array or a parameter tree.
    labels: ``None`` (every leaf is a frame), a label tree or a callable
      ``params -> labels`` such as :func:`stiefax.flax.qk_labels`.
    frames: how each leaf is viewed as frames.
    label: the label that marks frames.

  Returns:
    A scalar.
  """
  errs = [
      jnp.max(geometry.isometry_residual(
          spec.to_frames(x).astype(jnp.promote_types(x.dtype, jnp.float32))))
      for spec, x in _frame_leaves(params, labels, label, frames)
  ]
  if not errs:
    return jnp.zeros([], jnp.float32)
  return jnp.max(jnp.stack([e.astype(jnp.float32) for e in errs]))


def tangency_error(w: jax.Array, x: jax.Array, frames: FrameSpec = FrameSpec()) -> jax.Array:
  """``max |W^T X + X^T W|``: zero when ``X`` is tangent to ``St(d, r)`` at ``W``.

  Example:
    >>> import jax.numpy as jnp, stiefax
    >>> w = jnp.eye(3)[:, :1]
    >>> float(stiefax.diagnostics.tangency_error(w, jnp.array([[0.], [1.], [0.]])))
    0.0

  Args:
    w: a frame parameter.
    x: an update of the same shape.
    frames: how both are viewed as frames.

  Returns:
    A scalar.
  """
  wf, xf = frames.to_frames(w), frames.to_frames(x)
  s = geometry.mT(wf) @ xf
  return jnp.max(jnp.abs(s + geometry.mT(s)))
