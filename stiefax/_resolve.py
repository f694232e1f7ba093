"""What ``frames=`` and ``labels=`` take, and the one reading of each.

The vocabulary every function of stiefax shares: :data:`FramesLike`, the type of each
``frames=`` argument, and :data:`LabelsLike`, that of each ``labels=``; their readers
:func:`resolve_frames` and :func:`resolve_labels`, which give ``None`` its one meaning
(the query/key weights, read by name), and :func:`checked_frames` and
:func:`checked_labels`, which also refuse what cannot work, naming the parameter. The
public path of each name is :mod:`stiefax.layouts` (frames) or :mod:`stiefax.labels`
(labels).
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Mapping
from typing import Optional
from typing import Sequence
from typing import Union
import warnings

import jax
import jax.numpy as jnp
from jax.tree_util import KeyPath
import optax

from stiefax import _checks
from stiefax._frames import FrameSpec
from stiefax._layout_table import layout_of
from stiefax._layouts import EUCLIDEAN_LABEL
from stiefax._layouts import STIEFEL_LABEL
from stiefax._layouts import no_frames_message
from stiefax._layouts import path_names
from stiefax._layouts import qk_frames
from stiefax._layouts import qk_labels

__all__ = [
  "FramesLike",
  "LabelsLike",
  "resolve_frames",
  "checked_frames",
  "warn_one_dense_frame",
  "frames_argument",
  "resolve_labels",
  "checked_labels",
]

FramesLike = Optional[Union[FrameSpec, Callable[[KeyPath, jax.Array], FrameSpec]]]
"""What ``frames=`` takes: a :class:`stiefax.FrameSpec` for every leaf, a callable
``(key_path, leaf) -> FrameSpec`` choosing one per leaf (such as
:func:`stiefax.layouts.qk_frames`), or ``None``, which means ``qk_frames()`` (see
:func:`stiefax.layouts.resolve_frames`)."""

LabelTree = Union[str, Sequence["LabelTree"], Mapping[Any, "LabelTree"]]
"""A label tree: the structure of the params with a label (``"stiefel"``,
``"adamw"``) at each leaf; a single label for a single array."""

LabelsLike = Optional[Union[LabelTree, Callable[[optax.Params], LabelTree]]]
"""What ``labels=`` takes: a label tree, a callable ``params -> label tree`` (such as
:func:`stiefax.layouts.qk_labels`), or ``None``, the query/key weights that
``qk_labels`` finds (see :func:`stiefax.labels.resolve_labels`)."""

# ----------------------------------------------------------------------------
# frames=
# ----------------------------------------------------------------------------


def resolve_frames(frames: FramesLike, path: KeyPath, leaf: Any) -> FrameSpec:
  """The FrameSpec of one leaf: what ``frames=`` means everywhere in stiefax.

  * ``None``: :func:`qk_frames` with no head counts, which reads the layout of a
    query/key weight from its name and gives ``FrameSpec()`` to any other leaf
    (so a bare array, whose path is empty, gets ``FrameSpec()``).
  * a :class:`stiefax.FrameSpec`: that spec for every leaf.
  * a callable: ``frames(path, leaf)``, which must return a FrameSpec.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from stiefax.layouts import resolve_frames
    >>> path = (jax.tree_util.DictKey("q_einsum"), jax.tree_util.DictKey("w"))
    >>> resolve_frames(None, path, jnp.zeros((2, 8, 4)))
    FrameSpec(row_axis=1, col_axes=(-1,))

  Args:
    frames: ``None``, a :class:`stiefax.FrameSpec`, or a callable
      ``(key_path, leaf) -> FrameSpec``.
    path: the leaf's key path (as given by ``jax.tree_util.tree_map_with_path``).
    leaf: the array.

  Returns:
    The :class:`stiefax.FrameSpec` for this leaf.
  """
  if frames is None:
    frames = qk_frames()  # one reading of frames=None everywhere
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
    "frames must be None, a stiefax.FrameSpec or a callable (path, leaf) -> FrameSpec,"
    f" got {frames!r}."
  )


def _where(path: KeyPath) -> str:
  return jax.tree_util.keystr(tuple(path)) or "<root>"


def checked_frames(frames: FramesLike, path: KeyPath, leaf: Any) -> FrameSpec:
  """The FrameSpec of one leaf that is to live on the Stiefel manifold, validated.

  As :func:`resolve_frames`, and the leaf must be a real floating-point array whose
  frames exist (``r <= d``) and are not empty. Every error names the leaf's path.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax import FrameSpec
    >>> from stiefax.layouts import checked_frames
    >>> checked_frames(FrameSpec(), (), jnp.zeros((8, 2, 4)))
    FrameSpec(row_axis=0, col_axes=(-1,))

  Args:
    frames: ``None``, a :class:`stiefax.FrameSpec`, or a callable
      ``(key_path, leaf) -> FrameSpec`` (see :func:`resolve_frames`).
    path: the leaf's key path.
    leaf: the array (or anything with ``shape`` and ``dtype``).

  Returns:
    The :class:`stiefax.FrameSpec` for this leaf.

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


def _dense_layout(path: KeyPath, leaf: Any) -> Any:
  """The layout of a Dense query/key kernel (``q_proj``, ``k_proj``, ``c_attn``: a row
  with ``heads``) at ``path``, whose heads its shape does not show; ``None`` for any
  other leaf."""
  layout = layout_of(path_names(path))
  if layout is None or layout.heads is None or jnp.ndim(leaf) != layout.rank:
    return None
  return layout


def _same_view(a: FrameSpec, b: FrameSpec, shape: tuple[int, ...]) -> bool:
  """Whether two specs read a parameter of ``shape`` as the same frames (a split
  written with ``-1`` and one written in full are the same)."""
  try:
    split_a, split_b = a.split_shape(shape), b.split_shape(shape)
  except ValueError:
    return False

  def split_axis(spec: FrameSpec) -> Optional[int]:
    return None if spec.split is None else spec.split[0] % len(shape)

  same_axes = (a.row_axis, a.col_axes, a.select) == (b.row_axis, b.col_axes, b.select)
  return split_a == split_b and split_axis(a) == split_axis(b) and same_axes


def warn_one_dense_frame(who: str, frames: FramesLike, path: KeyPath, leaf: Any) -> None:
  """A one-line UserWarning when ``frames`` views a Dense per-head kernel as one frame.

  A ``q_proj``, ``k_proj`` or ``c_attn`` kernel holds one frame per head side by side
  (``(d_model, heads * head_dim)``); an explicit :class:`stiefax.FrameSpec` without a
  ``split`` (``FrameSpec()``) makes all its columns one frame, which is right only for
  a single head. ``qk_frames(head_dim=...)`` reads it per head.

  Example:
    >>> import warnings, jax, jax.numpy as jnp, stiefax
    >>> from stiefax._resolve import warn_one_dense_frame
    >>> path = (jax.tree_util.DictKey("q_proj"), jax.tree_util.DictKey("kernel"))
    >>> with warnings.catch_warnings(record=True) as caught:
    ...   warnings.simplefilter("always")
    ...   warn_one_dense_frame("f", stiefax.FrameSpec(), path, jnp.zeros((8, 8)))
    >>> str(caught[0].message)
    'stiefax.f: frames=stiefax.FrameSpec(row_axis=0, col_axes=(-1,)) makes the kernel at ...'

  Args:
    who: the public function that warns (``stiefel_adamw``, ``project_params``, ...).
    frames: the ``frames=`` argument.
    path: the leaf's key path.
    leaf: the array.
  """
  layout = _dense_layout(path, leaf)
  if layout is None or frames is None:
    return
  spec = resolve_frames(frames, path, leaf)
  if spec.split is not None:
    return
  given = f"stiefax.{frames!r}" if isinstance(frames, FrameSpec) else f"a callable giving {spec!r}"
  warnings.warn(
    f"stiefax.{who}: frames={given} makes the kernel at {'/'.join(path_names(path))}"
    f" (shape {tuple(jnp.shape(leaf))}, {layout.shape} of {layout.family}) one frame of"
    f" all its columns, not one frame per head; pass"
    " frames=stiefax.layouts.qk_frames(head_dim=...) (num_heads=1 for a single head).",
    UserWarning,
    stacklevel=_checks.user_stacklevel(),
  )


def frames_argument(frames: FramesLike, path: KeyPath, leaf: Any, spec: FrameSpec) -> str:
  """``, frames=...``: the argument that reads ``leaf`` as ``spec``, for a hint.

  Empty when ``frames=None`` reads it so; ``qk_frames(head_dim=<r>)`` for a Dense
  query/key kernel read per head; the spec itself when ``frames`` is one; otherwise a
  pointer to the ``frames=`` that was given.

  Example:
    >>> import jax, jax.numpy as jnp, stiefax
    >>> from stiefax._resolve import frames_argument
    >>> path = (jax.tree_util.DictKey("q_proj"), jax.tree_util.DictKey("kernel"))
    >>> frames = stiefax.layouts.qk_frames(num_heads=4)
    >>> w = jnp.zeros((64, 64))
    >>> frames_argument(frames, path, w, frames(path, w))
    ', frames=stiefax.layouts.qk_frames(head_dim=16)'

  Args:
    frames: the ``frames=`` argument that gave ``spec``.
    path: the leaf's key path.
    leaf: the array (or anything with a shape).
    spec: the leaf's :class:`stiefax.FrameSpec`.

  Returns:
    The text, starting with ``", frames="``, or ``""``.
  """
  shape = tuple(jnp.shape(leaf))
  if _dense_layout(path, leaf) is not None:
    head_dim = spec.frame_shape(shape)[2]
    if _same_view(qk_frames(head_dim=head_dim)(path, leaf), spec, shape):
      return f", frames=stiefax.layouts.qk_frames(head_dim={head_dim})"
  try:
    if _same_view(resolve_frames(None, path, leaf), spec, shape):
      return ""
  except ValueError:
    pass
  if isinstance(frames, FrameSpec):
    return f", frames=stiefax.{frames!r}"
  return ", frames=<the frames= given to the optimizer>"


# ----------------------------------------------------------------------------
# labels=
# ----------------------------------------------------------------------------


def resolve_labels(params: optax.Params, labels: LabelsLike = None) -> LabelTree:
  """The label tree of ``params``: what ``labels=`` means everywhere in stiefax.

  * ``None``: the query/key weights found by :func:`stiefax.layouts.qk_labels` (the attention frames
    of Flax, Gemma, Llama-style and GPT-2-style models); a ``params`` that is a single
    array (not a tree of several leaves) is one frame parameter, so
    ``isometry_error(w)`` measures ``w``.
  * a callable: ``labels(params)`` (for example :func:`stiefax.layouts.qk_labels` with ``modules=``;
    a callable sees the tree it is given, so it works at ``init`` and ``update``).
  * anything else: the label tree itself.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.labels import resolve_labels
    >>> params = {"query": {"kernel": jnp.zeros((4, 1, 2))},
    ...           "mlp": {"kernel": jnp.zeros((4, 4))}}
    >>> resolve_labels(params)
    {'mlp': {'kernel': 'adamw'}, 'query': {'kernel': 'stiefel'}}
    >>> resolve_labels(jnp.zeros((4, 2)))
    'stiefel'

  Args:
    params: a parameter tree (or a single array).
    labels: ``None``, a label tree, or a callable ``params -> label tree``.

  Returns:
    A tree of labels (normally with the structure of ``params``).
  """
  if labels is None:
    if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(params)):
      return STIEFEL_LABEL
    return qk_labels(params)
  return labels(params) if callable(labels) else labels


def _top_keys(tree: object) -> Optional[tuple[str, ...]]:
  keys = getattr(tree, "keys", None)
  return tuple(sorted(map(str, keys()))) if callable(keys) else None


def _structure_message(labels: LabelTree, params: optax.Params, who: str) -> str:
  """Why a label tree does not match the params, with the common case spelled out."""
  lk, pk = _top_keys(labels), _top_keys(params)
  if pk is not None and "params" in pk and (lk is None or "params" not in lk):
    hint = (
      " The params have a top 'params' level that the labels lack: build the labels"
      " from the tree you pass to tx.init (labels=stiefax.layouts.qk_labels as a"
      " callable does), or wrap them as {'params': labels}."
    )
  elif lk is not None and "params" in lk and (pk is None or "params" not in pk):
    hint = (
      " The labels have a top 'params' level that the params lack: pass"
      " labels['params'], or build the labels from the tree you pass to tx.init."
    )
  else:
    hint = " Build the labels from the same tree you pass to tx.init."
  return (
    f"{who}: the label tree does not have the structure of the params"
    f" (top-level keys {lk} vs {pk}).{hint}"
  )


def checked_labels(
  labels: LabelsLike = None, who: str = "stiefel_adamw"
) -> Callable[[optax.Params], LabelTree]:
  """``params -> label tree`` for ``optax.partition``, refusing label trees that cannot work.

  The tree is :func:`resolve_labels` of ``labels``; a ValueError (starting with
  ``who``) names the problem when it holds a label other than
  :data:`stiefax.layouts.STIEFEL_LABEL` and :data:`stiefax.layouts.EUCLIDEAN_LABEL`, does not have the structure of the params (with the
  common mistake, a missing or extra top ``params`` level, spelled out), or labels no
  parameter a frame.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.labels import checked_labels
    >>> fn = checked_labels({"w": "stiefel", "b": "sgd"})
    >>> fn({"w": jnp.zeros((4, 2)), "b": jnp.zeros(2)})
    Traceback (most recent call last):
    ...
    ValueError: stiefel_adamw: the label tree holds ["'sgd'"], ...

  Args:
    labels: ``None``, a label tree, or a callable ``params -> label tree``.
    who: the name that starts the error messages.

  Returns:
    A callable ``params -> label tree``.
  """
  valid = {STIEFEL_LABEL, EUCLIDEAN_LABEL}

  def fn(params: optax.Params) -> LabelTree:
    tree = resolve_labels(params, labels)
    found = set(jax.tree.leaves(tree))
    if not found <= valid:
      raise ValueError(
        f"{who}: the label tree holds {sorted(map(repr, found - valid))}, but"
        f" the only transforms are {sorted(valid)}. Label frame parameters"
        f" {STIEFEL_LABEL!r} and everything else {EUCLIDEAN_LABEL!r} (see"
        " stiefax.layouts.qk_labels)."
      )
    n_params, n_labels = len(jax.tree.leaves(params)), len(jax.tree.leaves(tree))
    if n_params != n_labels:
      raise ValueError(
        f"{who}: the label tree has {n_labels} leaves but the params have"
        f" {n_params}; give one label per parameter (the same tree structure)."
      )
    try:
      jax.tree.map(lambda *_: None, tree, params)
    except (ValueError, TypeError) as e:
      raise ValueError(_structure_message(tree, params, who)) from e
    if STIEFEL_LABEL not in found:
      raise ValueError(no_frames_message(who, params))
    return tree

  return fn
