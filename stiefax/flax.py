"""Flax integration: label trees, initializers, projection and the soft penalty.

Flax linen ``MultiHeadDotProductAttention`` and ``nnx.MultiHeadAttention`` keep the
query and key projections at paths ending in ``query/kernel`` and ``key/kernel`` with
shape ``(d_model, num_heads, head_dim)``: the default :class:`stiefax.FrameSpec` views
each as one ``St(d_model, head_dim)`` frame per head.

The three-line drop-in (linen params or ``nnx.Optimizer(model, tx, wrt=nnx.Param)``)::

    params = stiefax.flax.project_params(params, stiefax.flax.qk_labels)
    tx = stiefax.stiefel_adamw(1e-3, weight_decay=0.05)
    opt_state = tx.init(params)
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Optional

import jax
import jax.numpy as jnp

from stiefax import geometry
from stiefax.frames import FramesLike
from stiefax.frames import FrameSpec
from stiefax.frames import checked_frames
from stiefax.labels import LAYOUTS
from stiefax.labels import STIEFEL_LABEL
from stiefax.labels import Layout
from stiefax.labels import attention_like
from stiefax.labels import layout_of
from stiefax.labels import no_frames_message
from stiefax.labels import path_names
from stiefax.labels import qk_labels
from stiefax.labels import resolve_labels

# The label helpers live in stiefax.labels (a leaf module); they are re-exported here,
# their documented home for Flax users.
__all__ = [
  "LAYOUTS",
  "Layout",
  "qk_labels",
  "qk_frames",
  "attention_like",
  "orthonormal_init",
  "project_params",
  "orthogonality_penalty",
  "path_names",
]


def qk_frames(
  *,
  num_heads: Optional[int] = None,
  num_kv_heads: Optional[int] = None,
  head_dim: Optional[int] = None,
) -> Callable[[Any, Any], FrameSpec]:
  """The :class:`stiefax.FrameSpec` of each query/key weight, read from its name.

  A ``frames=`` callable ``(path, leaf) -> FrameSpec`` for the layouts in
  :data:`LAYOUTS` (one frame per head; value slices of fused weights are not
  frames), and ``FrameSpec()`` for any other path:

  | path ends in | shape | FrameSpec |
  |---|---|---|
  | ``query/kernel``, ``key/kernel`` | ``(d, H, r)`` | ``FrameSpec()`` |
  | ``q_einsum/w`` | ``(H, d, r)`` | ``FrameSpec(row_axis=1)`` |
  | ``kv_einsum/w`` | ``(2, K, d, r)`` | ``FrameSpec(row_axis=2, select=(0, (0,)))`` |
  | ``qkv_einsum/w`` | ``(3, H, d, r)`` | ``FrameSpec(row_axis=2, select=(0, (0, 1)))`` |
  | ``q_proj/kernel`` | ``(d, H r)`` | ``FrameSpec(split=(1, (H, -1)))`` |
  | ``k_proj/kernel`` | ``(d, K r)`` | ``FrameSpec(split=(1, (K, -1)))`` |
  | ``c_attn/kernel`` | ``(d, 3 H r)`` | ``FrameSpec(split=(1, (3, H, -1)), select=(1, (0, 1)))`` |

  The Dense layouts (``q_proj``, ``k_proj``, ``c_attn``) do not show their head count
  in their shape: give ``head_dim`` (one number for queries and keys, with or without
  grouped-query attention), or ``num_heads`` and, for ``k_proj``, ``num_kv_heads``.
  Without them those leaves raise a ValueError: the head count is never guessed.
  A recognized name with another rank (e.g. layer-stacked) raises too; give such
  weights your own ``FrameSpec``.

  Example:
    >>> import jax, jax.numpy as jnp, stiefax
    >>> frames = stiefax.flax.qk_frames(head_dim=16)
    >>> path = (jax.tree_util.DictKey("c_attn"), jax.tree_util.DictKey("kernel"))
    >>> frames(path, jnp.zeros((128, 3 * 128)))
    FrameSpec(row_axis=0, col_axes=(-1,), split=(1, (3, -1, 16)), select=(1, (0, 1)))

  Args:
    num_heads: query heads (``q_proj``, ``c_attn``).
    num_kv_heads: key/value heads (``k_proj``).
    head_dim: columns per head (all Dense layouts); overrides the head counts.

  Returns:
    A callable ``(path, leaf) -> FrameSpec`` to pass as ``frames=``.
  """
  for name, value in (
    ("num_heads", num_heads),
    ("num_kv_heads", num_kv_heads),
    ("head_dim", head_dim),
  ):
    if value is not None and (not isinstance(value, int) or value < 1):
      raise ValueError(f"qk_frames: {name} must be a positive int, got {value!r}.")

  def heads_split(layout, path, leaf, count, count_name):
    if head_dim is not None:
      return (-1, head_dim)
    if count is None:
      raise ValueError(
        f"The parameter at {_where(path)} (shape {tuple(jnp.shape(leaf))}) has the"
        f" layout {layout.shape} of {layout.family}: its head count cannot be"
        " read from its shape. Pass"
        f" frames=stiefax.flax.qk_frames(head_dim=...) (or {count_name}=...) to"
        " stiefel_adamw, project_params and isometry_error."
      )
    return (count, -1)

  def frames(path, leaf):
    names = path_names(path)
    layout = layout_of(names)
    if layout is None:
      return FrameSpec()
    key = (layout.module, layout.param)
    if jnp.ndim(leaf) != layout.rank:
      raise ValueError(
        f"The parameter at {_where(path)} is named like a weight of {layout.family},"
        f" {layout.shape}, but has shape {tuple(jnp.shape(leaf))}. Give its layout"
        " with frames=stiefax.FrameSpec(...) (or a callable choosing one per path)."
      )
    if key in {("query", "kernel"), ("key", "kernel")}:
      return FrameSpec()
    if key == ("q_einsum", "w"):
      return FrameSpec(row_axis=1)
    if key == ("kv_einsum", "w"):
      return FrameSpec(row_axis=2, select=(0, (0,)))
    if key == ("qkv_einsum", "w"):
      return FrameSpec(row_axis=2, select=(0, (0, 1)))
    if key == ("q_proj", "kernel"):
      return FrameSpec(split=(1, heads_split(layout, path, leaf, num_heads, "num_heads")))
    if key == ("k_proj", "kernel"):
      return FrameSpec(split=(1, heads_split(layout, path, leaf, num_kv_heads, "num_kv_heads")))
    return FrameSpec(  # c_attn
      split=(1, (3,) + heads_split(layout, path, leaf, num_heads, "num_heads")),
      select=(1, (0, 1)),
    )

  return frames


def _where(path: Any) -> str:
  return "/".join(path_names(path)) or "<root>"


def _map_labelled(fn: Callable, params: Any, labels: Any, label: str, frames: Optional[FramesLike]):
  tree = resolve_labels(params, labels)
  frames = qk_frames() if frames is None else frames

  def leaf(path, lab, w):
    if lab != label:
      return None
    return fn(checked_frames(frames, path, w), w)

  return jax.tree_util.tree_map_with_path(leaf, tree, params)


def orthonormal_init(frames: FrameSpec = FrameSpec()) -> Callable[..., jax.Array]:
  """A ``jax.nn.initializers`` initializer that draws every frame orthonormal.

  Each ``d x r`` frame is the Q factor of a Gaussian matrix with the signs of
  ``diag(R)`` fixed, i.e. Haar-distributed on ``St(d, r)`` (independently per head
  and layer, unlike ``jax.nn.initializers.orthogonal``, which orthogonalizes the
  flattened kernel).

  Example:
    >>> import jax, stiefax
    >>> init = stiefax.flax.orthonormal_init()
    >>> w = init(jax.random.key(0), (64, 4, 16))   # 4 heads in St(64, 16)
    >>> bool(stiefax.diagnostics.isometry_error(w) < 1e-5)
    True

  Args:
    frames: the :class:`stiefax.FrameSpec` of the parameters it initializes.

  Returns:
    ``init(key, shape, dtype=jnp.float32) -> array``.
  """
  if not isinstance(frames, FrameSpec):
    raise ValueError(f"orthonormal_init needs a stiefax.FrameSpec, got {frames!r}.")

  # With ``select`` every slice is drawn orthonormal, the unselected ones too.
  whole = FrameSpec(frames.row_axis, frames.col_axes)

  def init(key, shape, dtype=jnp.float32):
    frames.frame_shape(shape)  # validates the spec for this shape
    split_shape = frames.split_shape(shape)
    batch_shape, d, r = whole.frame_shape(split_shape)
    cd = jnp.promote_types(geometry.compute_dtype(dtype), jnp.float32)
    a = jax.random.normal(key, batch_shape + (d, r), cd)
    q, rr = jnp.linalg.qr(a)
    signs = jnp.where(jnp.diagonal(rr, axis1=-2, axis2=-1) < 0, -1, 1).astype(cd)
    q = q * signs[..., None, :]
    return whole.from_frames(q, split_shape).reshape(shape).astype(dtype)

  return init


def project_params(
  params: Any,
  labels: Any = None,
  frames: Optional[FramesLike] = None,
  *,
  label: str = STIEFEL_LABEL,
  method: str = "svd",
) -> Any:
  """Snaps the labelled frames onto the manifold: ``W -> polar(W)``.

  ``polar(W)`` is the nearest orthonormal frame in the Frobenius norm; use it on
  pretrained or Xavier-initialized weights before :func:`stiefax.stiefel_adamw`.

  Example:
    >>> import jax, jax.numpy as jnp, flax.linen as nn, stiefax
    >>> attn = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)
    >>> params = attn.init(jax.random.key(0), jnp.ones((1, 3, 8)))
    >>> params = stiefax.flax.project_params(params, stiefax.flax.qk_labels)
    >>> bool(stiefax.diagnostics.isometry_error(params, stiefax.flax.qk_labels) < 1e-5)
    True

  Args:
    params: a parameter tree.
    labels: a label tree, a callable ``params -> labels``, or ``None`` (default: the
      query/key weights found by :func:`qk_labels`; a single array is one frame
      parameter; see :func:`stiefax.labels.resolve_labels`).
    frames: how each labelled leaf is viewed as frames (default :func:`qk_frames`,
      which reads the layout from the name).
    label: the label that marks frames.
    method: the polar method (default ``"svd"``: exact for any full-rank input).

  Returns:
    ``params`` with every labelled leaf replaced by its polar factor.

  Raises:
    ValueError: if no leaf is labelled ``label`` (the message of
      :func:`stiefax.stiefel_adamw` for the same tree): the model is never returned
      unchanged by accident.
  """

  def snap(spec, w):
    rest = None if spec.select is None else spec.rest(w)  # kept bit for bit
    return spec.from_frames(geometry.polar(spec.to_frames(w), method), w.shape, rest)

  snapped = _map_labelled(snap, params, labels, label, frames)
  if all(s is None for s in jax.tree.leaves(snapped, is_leaf=lambda x: x is None)):
    raise ValueError(no_frames_message("project_params", params, label))
  return jax.tree.map(
    lambda s, w: w if s is None else s, snapped, params, is_leaf=lambda x: x is None
  )


def orthogonality_penalty(
  params: Any,
  labels: Any = None,
  frames: Optional[FramesLike] = None,
  *,
  label: str = STIEFEL_LABEL,
) -> jax.Array:
  """The soft-orthogonality penalty ``sum ||W^T W - I||_F^2`` (Bansal et al., 2018).

  Summed over the labelled frames: the paper's soft baseline (section 4.6), added to
  the loss as ``lambda * orthogonality_penalty(params, labels)`` with AdamW on every
  parameter.

  Example:
    >>> import jax.numpy as jnp, stiefax
    >>> w = {"query": {"kernel": 2.0 * jnp.eye(3)[:, None, :2]}}   # W^T W = 4 I
    >>> float(stiefax.flax.orthogonality_penalty(w))  # ||3 I_2||_F^2
    18.0

  Args:
    params: a parameter tree.
    labels: a label tree, a callable ``params -> labels``, or ``None`` (default: the
      query/key weights found by :func:`qk_labels`; a single array is one frame
      parameter; see :func:`stiefax.labels.resolve_labels`).
    frames: how each labelled leaf is viewed as frames (default :func:`qk_frames`,
      which reads the layout from the name).
    label: the label that marks frames.

  Returns:
    A scalar.
  """

  def penalty(spec, w):
    wf = spec.to_frames(w)
    gram = geometry.mT(wf) @ wf
    return jnp.sum(jnp.square(gram - geometry.eye_like(gram)))

  terms = jax.tree.leaves(_map_labelled(penalty, params, labels, label, frames))
  return sum(terms, jnp.zeros([], jnp.float32))
