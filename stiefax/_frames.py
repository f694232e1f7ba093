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
from typing import Any
from typing import Optional
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["FrameSpec"]

#: ``(axis, indices, rest_indices)`` of a ``select``, normalized for one shape.
_Selection = tuple[int, tuple[int, ...], tuple[int, ...]]


@dataclasses.dataclass(frozen=True)
class FrameSpec:
  """Which axes of a parameter are the rows ``d`` and the columns ``r`` of its frames.

  Two optional steps come first, for weights that fuse several projections or heads
  into one axis. ``split=(axis, sizes)`` reshapes one axis into several (one size may
  be ``-1``): a Dense kernel ``(d, H * r)`` becomes ``(d, H, r)``. ``select=(axis,
  indices)`` keeps only some entries of one batch axis as frames: of a fused
  ``(3, H, D, r)`` query/key/value weight only the query and key slices ``(0, 1)``.
  ``row_axis`` and ``col_axes`` (and the ``select`` axis) count axes after the split.
  The entries outside the selection are not frames: :meth:`to_frames` leaves them
  out, :meth:`from_frames` fills them with zeros (or with ``rest``), and
  :func:`stiefax.stiefel_adamw` trains them with AdamW.

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
    >>> FrameSpec(split=(1, (8, -1))).frame_shape((128, 128))   # Dense (d, H * r)
    ((8,), 128, 16)
    >>> qk = FrameSpec(row_axis=2, select=(0, (0, 1)))          # fused (3, H, D, r)
    >>> qk.frame_shape((3, 8, 128, 16))                         # q and k heads
    ((2, 8), 128, 16)

  Attributes:
    row_axis: the axis holding the ``d`` rows of each frame (negative counts from
      the end).
    col_axes: the axes whose product is the ``r`` columns, merged in the order
      given. Every axis that is neither a row nor a column axis is a batch axis.
    split: ``None``, or ``(axis, sizes)``: reshape that axis of the parameter into
      ``sizes`` (row-major, one entry may be ``-1``) before viewing it.
    select: ``None``, or ``(axis, indices)``: only these entries of that batch axis
      (of the split array) are frames; the rest of the parameter is not.
  """

  row_axis: int = 0
  col_axes: tuple[int, ...] = (-1,)
  split: Optional[tuple[int, tuple[int, ...]]] = None
  select: Optional[tuple[int, tuple[int, ...]]] = None

  def __post_init__(self) -> None:
    col_axes = self.col_axes
    if isinstance(col_axes, int):
      col_axes = (col_axes,)
    col_axes = tuple(int(a) for a in col_axes)
    if not col_axes:
      raise ValueError("FrameSpec.col_axes must name at least one axis, got ().")
    object.__setattr__(self, "col_axes", col_axes)
    object.__setattr__(self, "row_axis", int(self.row_axis))
    if self.split is not None:
      axis, sizes = _pair("split", self.split)
      if sum(s == -1 for s in sizes) > 1 or any(s < 1 and s != -1 for s in sizes):
        raise ValueError(
          f"FrameSpec.split sizes must be positive with at most one -1, got {sizes}."
        )
      object.__setattr__(self, "split", (axis, sizes))
    if self.select is not None:
      axis, indices = _pair("select", self.select)
      if len(set(indices)) != len(indices) or min(indices) < 0:
        raise ValueError(
          f"FrameSpec.select indices must be distinct and non-negative, got {indices}."
        )
      object.__setattr__(self, "select", (axis, indices))

  def __repr__(self) -> str:
    extra = "".join(
      f", {name}={getattr(self, name)!r}"
      for name in ("split", "select")
      if getattr(self, name) is not None
    )
    return f"FrameSpec(row_axis={self.row_axis}, col_axes={self.col_axes}{extra})"

  def split_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
    """The parameter's shape after ``split`` (``shape`` itself without one).

    Example:
      >>> from stiefax import FrameSpec
      >>> FrameSpec(split=(1, (4, -1))).split_shape((16, 32))
      (16, 4, 8)
    """
    shape = tuple(shape)
    if self.split is None:
      return shape
    axis, sizes = self.split
    if not -len(shape) <= axis < len(shape):
      raise ValueError(
        f"{self} splits axis {axis}, which does not exist for a parameter of shape {shape}."
      )
    axis %= len(shape)
    known = math.prod(s for s in sizes if s != -1)
    n = shape[axis]
    if -1 in sizes:
      if known == 0 or n % known:
        raise ValueError(
          f"{self} cannot split axis {axis} of size {n} (shape {shape}) into"
          f" {sizes}: {n} is not a multiple of {known}."
        )
      sizes = tuple(n // known if s == -1 else s for s in sizes)
    elif known != n:
      raise ValueError(
        f"{self} cannot split axis {axis} of size {n} (shape {shape}) into {sizes}"
        f" (product {known})."
      )
    return shape[:axis] + sizes + shape[axis + 1 :]

  def _selection(self, split_shape: Sequence[int]) -> Optional[_Selection]:
    """``(axis, indices, rest_indices)`` of ``select`` for the split shape, or None."""
    if self.select is None:
      return None
    axis, indices = self.select
    ndim = len(split_shape)
    if not -ndim <= axis < ndim:
      raise ValueError(
        f"{self} selects along axis {axis}, which does not exist for an array of"
        f" shape {tuple(split_shape)}."
      )
    axis %= ndim
    n = split_shape[axis]
    if max(indices) >= n:
      raise ValueError(
        f"{self} selects entries {indices} of axis {axis}, which has size {n}"
        f" (shape {tuple(split_shape)})."
      )
    rest = tuple(i for i in range(n) if i not in indices)
    return axis, indices, rest

  def _view_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of the selected part, after the split."""
    split_shape = self.split_shape(shape)
    sel = self._selection(split_shape)
    if sel is None:
      return split_shape
    axis, indices, _ = sel
    return split_shape[:axis] + (len(indices),) + split_shape[axis + 1 :]

  def axes(self, ndim: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """Normalized ``(row, cols, batch)`` axes for an array of rank ``ndim`` (after the split).

    Example:
      >>> from stiefax import FrameSpec
      >>> FrameSpec().axes(3)
      (0, (2,), (1,))
    """
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

  def frame_axes(self, shape: Sequence[int]) -> tuple[int, ...]:
    """The axes of :meth:`view` that one frame spans (its rows and columns), sorted.

    For a parameter of shape ``shape``, reductions of ``self.view(x)`` over these
    axes give one value per frame, in the order of :meth:`batch_shape`; every other
    axis of the view is a batch axis. Without ``split`` and ``select`` the view is
    ``x`` itself. Unlike :meth:`frame_shape`, wide frames (``r > d``) are allowed.

    Example:
      >>> from stiefax import FrameSpec
      >>> FrameSpec().frame_axes((128, 8, 16))
      (0, 2)
      >>> FrameSpec(split=(1, (8, -1))).frame_axes((128, 128))   # view (128, 8, 16)
      (0, 2)
      >>> FrameSpec(row_axis=2, select=(0, (0, 1))).frame_axes((3, 8, 128, 16))
      (2, 3)

    Args:
      shape: the parameter's shape.

    Returns:
      A sorted tuple of axes of the view.

    Raises:
      ValueError: if an axis does not exist, the split does not fit, or the selection
        is not along a batch axis.
    """
    view = self._view_shape(shape)
    row, cols, batch = self.axes(len(view))
    self._check_select(len(view), batch)
    return tuple(sorted((row,) + cols))

  def _check_select(self, ndim: int, batch: tuple[int, ...]) -> None:
    """Raises unless ``select`` (if any) is along a batch axis of a rank-``ndim`` view."""
    if self.select is not None and self.select[0] % ndim not in batch:
      raise ValueError(
        f"{self} selects along axis {self.select[0]}, a row or column axis of its"
        " frames; select only along a batch axis (heads, layers, q/k/v)."
      )

  def frame_shape(self, shape: Sequence[int]) -> tuple[tuple[int, ...], int, int]:
    """Returns ``(batch_shape, d, r)`` for an array of the given shape.

    Example:
      >>> from stiefax import FrameSpec
      >>> FrameSpec().frame_shape((64, 4, 16))
      ((4,), 64, 16)

    Args:
      shape: the parameter's shape.

    Returns:
      The frames' batch shape (one entry per frame), rows ``d`` and columns ``r``.

    Raises:
      ValueError: if an axis does not exist, the split does not fit, the selection is
        not along a batch axis, or ``r > d`` (a frame cannot have more orthonormal
        columns than rows).
    """
    shape = tuple(shape)
    view = self._view_shape(shape)
    row, cols, batch = self.axes(len(view))
    self._check_select(len(view), batch)
    d = view[row]
    r = math.prod(view[a] for a in cols)
    if r > d:
      raise ValueError(
        f"A parameter of shape {shape} viewed with {self} has frames of"
        f" d={d} rows and r={r} columns, but a Stiefel frame needs r <= d."
        " Check row_axis/col_axes (block-orthogonal frames need"
        " heads * head_dim <= d_model), or keep this parameter off the manifold."
      )
    return tuple(view[a] for a in batch), d, r

  def is_contiguous(self, ndim: int) -> bool:
    """Whether arrays of rank ``ndim`` already hold their frames as ``(..., d, r)``.

    Then :meth:`to_frames` is a reshape; otherwise it is a transpose (or, with
    ``select``, a slice).

    Example:
      >>> from stiefax import FrameSpec
      >>> FrameSpec().is_contiguous(2), FrameSpec().is_contiguous(3)
      (True, False)

    Args:
      ndim: the parameter's rank.

    Returns:
      A bool.
    """
    if self.split is not None or self.select is not None:
      return False
    row, cols, batch = self.axes(ndim)
    return batch + (row,) + cols == tuple(range(ndim))

  def view(self, x: jax.Array) -> jax.Array:
    """The selected part of ``x`` in the split layout (``x`` itself by default).

    Example:
      >>> import jax.numpy as jnp
      >>> from stiefax import FrameSpec
      >>> FrameSpec(row_axis=2, select=(0, (0, 1))).view(
      ...     jnp.zeros((3, 2, 8, 4))).shape
      (2, 2, 8, 4)
    """
    split_shape = self.split_shape(x.shape)
    if split_shape != tuple(x.shape):
      x = x.reshape(split_shape)
    sel = self._selection(split_shape)
    return x if sel is None else _take(x, sel[1], sel[0])

  def to_frames(self, x: jax.Array) -> jax.Array:
    """Views ``x`` as a batch of frames of shape ``(*batch_shape, d, r)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from stiefax import FrameSpec
      >>> FrameSpec().to_frames(jnp.zeros((64, 4, 16))).shape
      (4, 64, 16)

    Args:
      x: an array of the parameter's shape.

    Returns:
      The selected frames, ``(*batch_shape, d, r)``.
    """
    batch_shape, d, r = self.frame_shape(x.shape)
    v = self.view(x)
    row, cols, batch = self.axes(v.ndim)
    perm = batch + (row,) + cols
    if perm != tuple(range(v.ndim)):
      v = jnp.transpose(v, perm)
    return v.reshape(batch_shape + (d, r))

  def from_frames(
    self, frames: jax.Array, shape: Sequence[int], rest: Optional[jax.Array] = None
  ) -> jax.Array:
    """Inverse of :meth:`to_frames`: back to the parameter layout ``shape``.

    Example:
      >>> import jax.numpy as jnp
      >>> from stiefax import FrameSpec
      >>> spec = FrameSpec(row_axis=2, select=(0, (0, 1)))
      >>> w = jnp.ones((3, 2, 8, 4))
      >>> back = spec.from_frames(spec.to_frames(w), w.shape)
      >>> float(back[:2].min()), float(back[2].max())   # the v slice is zero
      (1.0, 0.0)

    Args:
      frames: ``(*batch_shape, d, r)``, as given by :meth:`to_frames`.
      shape: the parameter's shape.
      rest: with ``select``, the entries outside the selection (as given by
        :meth:`rest`); zeros when ``None``.

    Returns:
      An array of shape ``shape``.
    """
    view = self._view_shape(shape)
    row, cols, batch = self.axes(len(view))
    perm = batch + (row,) + cols
    x = frames.reshape(tuple(view[a] for a in perm))
    if perm != tuple(range(len(view))):
      x = jnp.transpose(x, _inverse_permutation(perm))
    return self.from_view(x, shape, rest)

  def from_view(
    self, view: jax.Array, shape: Sequence[int], rest: Optional[jax.Array] = None
  ) -> jax.Array:
    """Inverse of :meth:`view`: back to the parameter layout ``shape``.

    Example:
      >>> import jax.numpy as jnp
      >>> from stiefax import FrameSpec
      >>> spec = FrameSpec(row_axis=2, select=(0, (0, 1)))
      >>> w = jnp.ones((3, 2, 8, 4))
      >>> back = spec.from_view(2 * spec.view(w), w.shape, spec.rest(w))
      >>> float(back[:2].min()), float(back[2].max())   # the rest kept as given
      (2.0, 1.0)

    Args:
      view: an array shaped like ``self.view(x)`` for ``x`` of shape ``shape``.
      shape: the parameter's shape.
      rest: with ``select``, the entries outside the selection (as given by
        :meth:`rest`); zeros when ``None``.

    Returns:
      An array of shape ``shape``.
    """
    shape = tuple(shape)
    split_shape = self.split_shape(shape)
    sel = self._selection(split_shape)
    x = view
    if sel is not None:
      x = self._assemble(x, rest, split_shape, sel)
    return x.reshape(shape)

  def rest(self, x: jax.Array) -> jax.Array:
    """The entries of ``x`` outside the selected frames (needs ``select``).

    Example:
      >>> import jax.numpy as jnp
      >>> from stiefax import FrameSpec
      >>> FrameSpec(row_axis=2, select=(0, (0, 1))).rest(
      ...     jnp.zeros((3, 2, 8, 4))).shape
      (1, 2, 8, 4)

    Args:
      x: an array of the parameter's shape.

    Returns:
      The split array's entries outside the selection, in the split layout.
    """
    split_shape = self.split_shape(x.shape)
    sel = self._selection(split_shape)
    if sel is None:
      raise ValueError(f"{self} selects no part of the parameter, so it has no rest.")
    return _take(x.reshape(split_shape), sel[2], sel[0])

  def _assemble(
    self,
    selected: jax.Array,
    rest: Optional[jax.Array],
    split_shape: tuple[int, ...],
    sel: _Selection,
  ) -> jax.Array:
    """The split array from its selected entries and its rest (zeros when None)."""
    axis, indices, rest_indices = sel
    if not rest_indices:
      parts = [selected]
    else:
      rest_shape = split_shape[:axis] + (len(rest_indices),) + split_shape[axis + 1 :]
      if rest is None:
        rest = jnp.zeros(rest_shape, selected.dtype)
      elif tuple(rest.shape) != rest_shape:
        raise ValueError(f"{self}: rest has shape {tuple(rest.shape)}, expected {rest_shape}.")
      parts = [selected, rest.astype(selected.dtype)]
    order = indices + rest_indices
    x = jnp.concatenate(parts, axis=axis) if len(parts) > 1 else parts[0]
    if order != tuple(range(len(order))):
      x = _take(x, _inverse_permutation(order), axis)
    return x

  def batch_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
    """The batch shape (one entry per frame) of a parameter of shape ``shape``.

    Example:
      >>> from stiefax import FrameSpec
      >>> FrameSpec().batch_shape((64, 4, 16))
      (4,)

    Args:
      shape: the parameter's shape.

    Returns:
      A tuple of ints.
    """
    return self.frame_shape(shape)[0]


def _pair(name: str, value: Any) -> tuple[int, tuple[int, ...]]:
  try:
    axis, items = value
    items = (items,) if isinstance(items, int) else tuple(int(i) for i in items)
    axis = int(axis)
  except (TypeError, ValueError):
    raise ValueError(f"FrameSpec.{name} must be (axis, (int, ...)), got {value!r}.") from None
  if not items:
    raise ValueError(f"FrameSpec.{name} needs at least one entry, got {value!r}.")
  return axis, items


def _take(x: jax.Array, indices: Sequence[int], axis: int) -> jax.Array:
  """``x`` at ``indices`` along ``axis``: a slice when they are a contiguous range."""
  indices = tuple(indices)
  start = indices[0]
  if indices == tuple(range(start, start + len(indices))):
    return jax.lax.slice_in_dim(x, start, start + len(indices), axis=axis)
  return jnp.take(x, np.asarray(indices), axis=axis)


def _inverse_permutation(perm: Sequence[int]) -> tuple[int, ...]:
  inv = [0] * len(perm)
  for i, p in enumerate(perm):
    inv[p] = i
  return tuple(inv)
