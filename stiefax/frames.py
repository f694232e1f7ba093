"""How an array is viewed as a batch of ``d x r`` frames.

A *frame* is a matrix ``W`` in ``R^{d x r}`` with ``r <= d``; on the Stiefel
manifold ``St(d, r) = {W : W^T W = I_r}`` its columns are orthonormal. A parameter
of any rank is a batch of frames: :class:`FrameSpec` names the axis that holds the
``d`` rows and the axes whose product is the ``r`` columns; every other axis is a
batch axis (heads, stacked layers, experts, ...).

Flax stores attention query/key kernels as ``(d_model, num_heads, head_dim)``, so the
default ``FrameSpec()`` views such a kernel as ``num_heads`` independent frames in
``St(d_model, head_dim)`` (one per head). ``FrameSpec(col_axes=(-2, -1))`` merges the
heads into one frame in ``St(d_model, num_heads * head_dim)``: the block-orthogonal
multi-head variant in which all heads are mutually orthogonal (paper section 3.2).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence, Union

import jax
import jax.numpy as jnp

__all__ = ["FrameSpec", "FramesLike", "resolve_frames", "checked_frames"]


@dataclasses.dataclass(frozen=True)
class FrameSpec:
  """Which axes of a parameter are the rows ``d`` and the columns ``r`` of its frames.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax import FrameSpec
    >>> kernel = jnp.zeros((128, 8, 16))          # (d_model, heads, head_dim)
    >>> FrameSpec().frame_shape(kernel.shape)     # 8 frames in St(128, 16)
    ((8,), 128, 16)
    >>> FrameSpec(col_axes=(-2, -1)).frame_shape(kernel.shape)  # one St(128, 128)
    ((), 128, 128)
    >>> FrameSpec(row_axis=1).frame_shape((2, 128, 8, 16))      # layer-stacked
    ((2, 8), 128, 16)

  Attributes:
    row_axis: the axis holding the ``d`` rows of each frame (negative counts from
      the end).
    col_axes: the axes whose product is the ``r`` columns, merged in the order
      given. Every axis that is neither a row nor a column axis is a batch axis.
  """

  row_axis: int = 0
  col_axes: tuple[int, ...] = (-1,)

  def __post_init__(self):
    col_axes = self.col_axes
    if isinstance(col_axes, int):
      col_axes = (col_axes,)
    col_axes = tuple(int(a) for a in col_axes)
    if not col_axes:
      raise ValueError("FrameSpec.col_axes must name at least one axis, got ().")
    object.__setattr__(self, "col_axes", col_axes)
    object.__setattr__(self, "row_axis", int(self.row_axis))

  def _axes(self, ndim: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """Normalized (row, cols, batch) axes for an array of rank ``ndim``."""
    named = (self.row_axis,) + self.col_axes
    for a in named:
      if not -ndim <= a < ndim:
        raise ValueError(
            f"{self} names axis {a}, which does not exist for an array of rank"
            f" {ndim}. Give a FrameSpec whose row_axis and col_axes lie in"
            f" [-{ndim}, {ndim - 1}] (pass frames=... to the transform)."
        )
    row = self.row_axis % ndim
    cols = tuple(a % ndim for a in self.col_axes)
    if len(set((row,) + cols)) != 1 + len(cols):
      raise ValueError(
          f"{self} uses an axis twice for an array of rank {ndim}: the row axis"
          " and the column axes must be distinct."
      )
    batch = tuple(a for a in range(ndim) if a != row and a not in cols)
    return row, cols, batch

  def frame_shape(self, shape: Sequence[int]) -> tuple[tuple[int, ...], int, int]:
    """Returns ``(batch_shape, d, r)`` for an array of the given shape.

    Raises:
      ValueError: if an axis does not exist, or if ``r > d`` (a frame cannot have
        more orthonormal columns than rows).
    """
    shape = tuple(shape)
    row, cols, batch = self._axes(len(shape))
    d = shape[row]
    r = math.prod(shape[a] for a in cols)
    if r > d:
      raise ValueError(
          f"A parameter of shape {shape} viewed with {self} has frames of"
          f" d={d} rows and r={r} columns, but a Stiefel frame needs r <= d."
          " Check row_axis/col_axes (block-orthogonal frames need"
          " heads * head_dim <= d_model), or keep this parameter off the manifold."
      )
    return tuple(shape[a] for a in batch), d, r

  def is_contiguous(self, ndim: int) -> bool:
    """Whether arrays of rank ``ndim`` already hold their frames as ``(..., d, r)``.

    Then :meth:`to_frames` is a reshape; otherwise it is a transpose.
    """
    row, cols, batch = self._axes(ndim)
    return batch + (row,) + cols == tuple(range(ndim))

  def to_frames(self, x: jax.Array) -> jax.Array:
    """Views ``x`` as a batch of frames of shape ``(*batch_shape, d, r)``."""
    batch_shape, d, r = self.frame_shape(x.shape)
    row, cols, batch = self._axes(x.ndim)
    perm = batch + (row,) + cols
    if perm != tuple(range(x.ndim)):
      x = jnp.transpose(x, perm)
    return x.reshape(batch_shape + (d, r))

  def from_frames(self, frames: jax.Array, shape: Sequence[int]) -> jax.Array:
    """Inverse of :meth:`to_frames`: back to the parameter layout ``shape``."""
    shape = tuple(shape)
    row, cols, batch = self._axes(len(shape))
    perm = batch + (row,) + cols
    x = frames.reshape(tuple(shape[a] for a in perm))
    if perm != tuple(range(len(shape))):
      x = jnp.transpose(x, _inverse_permutation(perm))
    return x

  def batch_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
    """The batch shape (one entry per frame) of a parameter of shape ``shape``."""
    return self.frame_shape(shape)[0]


def _inverse_permutation(perm: Sequence[int]) -> tuple[int, ...]:
  inv = [0] * len(perm)
  for i, p in enumerate(perm):
    inv[p] = i
  return tuple(inv)


#: A FrameSpec, or a callable ``(key_path, array) -> FrameSpec`` choosing one per leaf.
FramesLike = Union[FrameSpec, Callable[[Any, jax.Array], FrameSpec]]


def resolve_frames(frames: FramesLike, path: Any, leaf: Any) -> FrameSpec:
  """Returns the FrameSpec for one leaf.

  Args:
    frames: a :class:`FrameSpec`, or a callable ``(key_path, leaf) -> FrameSpec``.
    path: the leaf's key path (as given by ``jax.tree_util.tree_map_with_path``).
    leaf: the array.

  Returns:
    The :class:`FrameSpec` for this leaf.
  """
  if isinstance(frames, FrameSpec):
    return frames
  if callable(frames):
    spec = frames(path, leaf)
    if not isinstance(spec, FrameSpec):
      raise ValueError(
          f"frames callable returned {spec!r} for the leaf at"
          f" {jax.tree_util.keystr(path)}; it must return a stiefax.FrameSpec."
      )
    return spec
  raise ValueError(
      f"frames must be a stiefax.FrameSpec or a callable (path, leaf) -> FrameSpec,"
      f" got {frames!r}."
  )


def _where(path: Any) -> str:
  return jax.tree_util.keystr(tuple(path)) or "<root>"


def checked_frames(frames: FramesLike, path: Any, leaf: Any) -> FrameSpec:
  """The FrameSpec of one leaf that is to live on the Stiefel manifold, validated.

  As :func:`resolve_frames`, and the leaf must be a real floating-point array whose
  frames exist (``r <= d``) and are not empty. Every error names the leaf's path.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.frames import FrameSpec, checked_frames
    >>> checked_frames(FrameSpec(), (), jnp.zeros((8, 2, 4)))
    FrameSpec(row_axis=0, col_axes=(-1,))

  Args:
    frames: a :class:`FrameSpec`, or a callable ``(key_path, leaf) -> FrameSpec``.
    path: the leaf's key path.
    leaf: the array (or anything with ``shape`` and ``dtype``).

  Returns:
    The :class:`FrameSpec` for this leaf.

  Raises:
    ValueError: naming the path, for an integer, boolean or complex dtype (the
      geometry here is real: ``W^T W`` with the transpose), an axis the leaf lacks,
      ``r > d``, or a zero-size frame batch.
  """
  spec = resolve_frames(frames, path, leaf)
  dtype = getattr(leaf, "dtype", None)
  dtype = jnp.dtype(jnp.result_type(leaf) if dtype is None else dtype)
  shape = tuple(getattr(leaf, "shape", jnp.shape(leaf)))
  if not jnp.issubdtype(dtype, jnp.floating):
    kind = (
        "complex frames are not supported (the Stiefel geometry here is real:"
        " W^T W uses the transpose, so a complex W would leave the unitary manifold)"
        if jnp.issubdtype(dtype, jnp.complexfloating)
        else "only floating-point frames can be orthonormal and move continuously"
    )
    raise ValueError(
        f"The frame parameter at {_where(path)} (shape {shape}) has dtype {dtype}:"
        f" {kind}. Give it a real floating dtype (float32, bfloat16, float16,"
        " float64), or label it off the manifold ('adamw')."
    )
  if 0 in shape:
    raise ValueError(
        f"The frame parameter at {_where(path)} has shape {shape}, with a zero-size"
        " axis: it holds no frame (a frame needs 1 <= r <= d). Keep empty parameters"
        " off the manifold (label them 'adamw')."
    )
  try:
    spec.frame_shape(shape)
  except ValueError as e:
    msg = str(e)
    raise ValueError(f"The parameter at {_where(path)}: {msg[0].lower()}{msg[1:]}") from None
  return spec
