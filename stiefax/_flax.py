"""The Flax helpers of :mod:`stiefax.flax`: initializer, projection, penalty, QK-norm."""

from __future__ import annotations

import math
from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence

import chex
from flax import nnx
import flax.linen as linen
import jax
import jax.numpy as jnp

from stiefax import _geometry as geometry
from stiefax._frames import FrameSpec
from stiefax._layouts import STIEFEL_LABEL
from stiefax._layouts import no_frames_message
from stiefax._matrix import compute_dtype
from stiefax._resolve import FramesLike
from stiefax._resolve import LabelsLike
from stiefax._resolve import checked_frames
from stiefax._resolve import resolve_frames
from stiefax._resolve import resolve_labels
from stiefax._resolve import warn_one_dense_frame


def _map_labelled(
  fn: Callable, params: Any, labels: LabelsLike, label: str, frames: FramesLike, who: str
) -> Any:
  tree = resolve_labels(params, labels)

  def leaf(path: Any, lab: Any, w: jax.Array) -> Optional[jax.Array]:
    if lab != label:
      return None
    warn_one_dense_frame(f"flax.{who}", frames, path, w)
    return fn(checked_frames(frames, path, w), w)

  return jax.tree_util.tree_map_with_path(leaf, tree, params)


def orthonormal_init(frames: FramesLike = None) -> Callable[..., chex.Array]:
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
    frames: how the parameters it initializes are viewed as frames: ``None``
      (default; at the root path of an initializer, ``FrameSpec()``), a
      :class:`stiefax.FrameSpec`, or a callable ``(path, leaf) -> FrameSpec`` called
      with the root path and a ``jax.ShapeDtypeStruct`` (see
      :func:`stiefax.layouts.resolve_frames`).

  Returns:
    ``init(key, shape, dtype=jnp.float32) -> array``.
  """
  if not (frames is None or isinstance(frames, FrameSpec) or callable(frames)):
    raise ValueError(
      "orthonormal_init: frames must be None, a stiefax.FrameSpec or a callable"
      f" (path, leaf) -> FrameSpec, got {frames!r}."
    )

  def init(
    key: jax.Array, shape: Sequence[int], dtype: jax.typing.DTypeLike = jnp.float32
  ) -> jax.Array:
    spec = resolve_frames(frames, (), jax.ShapeDtypeStruct(tuple(shape), dtype))
    spec.frame_shape(shape)  # validates the spec for this shape
    # With ``select`` every slice is drawn orthonormal, the unselected ones too.
    whole = FrameSpec(spec.row_axis, spec.col_axes)
    split_shape = spec.split_shape(shape)
    batch_shape, d, r = whole.frame_shape(split_shape)
    cd = jnp.promote_types(compute_dtype(dtype), jnp.float32)
    a = jax.random.normal(key, batch_shape + (d, r), cd)
    q, rr = jnp.linalg.qr(a)
    signs = jnp.where(jnp.diagonal(rr, axis1=-2, axis2=-1) < 0, -1, 1).astype(cd)
    q = q * signs[..., None, :]
    return whole.from_frames(q, split_shape).reshape(shape).astype(dtype)

  return init


def project_params(
  params: Any,
  labels: LabelsLike = None,
  frames: FramesLike = None,
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
    >>> params = stiefax.flax.project_params(params, stiefax.layouts.qk_labels)
    >>> bool(stiefax.diagnostics.isometry_error(
    ...     params, stiefax.layouts.qk_labels) < 1e-5)
    True

  Args:
    params: a parameter tree.
    labels: a label tree, a callable ``params -> labels``, or ``None`` (default: the
      query/key weights found by :func:`stiefax.layouts.qk_labels`; a single array is one frame
      parameter; see :func:`stiefax.labels.resolve_labels`).
    frames: how each labelled leaf is viewed as frames (``None``:
      :func:`stiefax.layouts.qk_frames`, which reads the layout from the name; see
      :func:`stiefax.layouts.resolve_frames`).
    label: the label that marks frames.
    method: the polar method (default ``"svd"``: exact for any full-rank input).

  Returns:
    ``params`` with every labelled leaf replaced by its polar factor.

  Raises:
    ValueError: if no leaf is labelled ``label`` (the message of
      :func:`stiefax.stiefel_adamw` for the same tree): the model is never returned
      unchanged by accident.
  """

  def snap(spec: FrameSpec, w: jax.Array) -> jax.Array:
    rest = None if spec.select is None else spec.rest(w)  # kept bit for bit
    return spec.from_frames(geometry.polar(spec.to_frames(w), method), w.shape, rest)

  snapped = _map_labelled(snap, params, labels, label, frames, "project_params")
  if all(s is None for s in jax.tree.leaves(snapped, is_leaf=lambda x: x is None)):
    raise ValueError(no_frames_message("project_params", params, label))
  return jax.tree.map(
    lambda s, w: w if s is None else s, snapped, params, is_leaf=lambda x: x is None
  )


def orthogonality_penalty(
  params: Any,
  labels: LabelsLike = None,
  frames: FramesLike = None,
  *,
  label: str = STIEFEL_LABEL,
) -> chex.Array:
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
      query/key weights found by :func:`stiefax.layouts.qk_labels`; a single array is one frame
      parameter; see :func:`stiefax.labels.resolve_labels`).
    frames: how each labelled leaf is viewed as frames (``None``:
      :func:`stiefax.layouts.qk_frames`, which reads the layout from the name; see
      :func:`stiefax.layouts.resolve_frames`).
    label: the label that marks frames.

  Returns:
    A scalar.
  """

  def penalty(spec: FrameSpec, w: jax.Array) -> jax.Array:
    wf = spec.to_frames(w)
    gram = geometry.mT(wf) @ wf
    return jnp.sum(jnp.square(gram - geometry.eye_like(gram)))

  terms = jax.tree.leaves(
    _map_labelled(penalty, params, labels, label, frames, "orthogonality_penalty")
  )
  return sum(terms, jnp.zeros([], jnp.float32))


# ----------------------------------------------------------------------------------
# QK-norm: the attention building block docs/lm.md recommends for language models.
# ----------------------------------------------------------------------------------


class QKNorm(linen.Module):
  """QK-norm for a Flax linen attention layer: a LayerNorm on each head's q and k.

  Per head, over its ``r`` features, without bias, with a learned scale of shape
  ``(r,)`` shared by the heads, one for the queries (``query_ln``) and one for the
  keys (``key_ln``), init 1::

      q <- (q - mean(q)) / sqrt(var(q) + epsilon) * gamma_q
      k <- (k - mean(k)) / sqrt(var(k) + epsilon) * gamma_k

  applied before RoPE and the logits ``q·k / sqrt(r)``. This is the QK-layernorm of
  Dehghani et al. 2023 and Wortsman et al. 2023, the ``A2-qknorm`` arm of docs/lm.md
  (Flax's own ``LayerNorm(use_bias=False)``, as the arm uses it), and what Flax's
  ``MultiHeadDotProductAttention(normalize_qk=True)`` does inside its own attention:
  use this block where the attention is your own (Gemma-style einsums, grouped-query
  heads, where q and k have different head counts). With Stiefel frames it goes
  after them: ``q = x W_Q`` keeps W_Q on the manifold and the norm sets the logit
  scale. :class:`NnxQKNorm` is the same block for nnx.

  Example:
    >>> import jax, jax.numpy as jnp, stiefax
    >>> q = jax.random.normal(jax.random.key(0), (2, 5, 4, 16))   # (B, T, heads, r)
    >>> k = jax.random.normal(jax.random.key(1), (2, 5, 2, 16))  # 2 key heads (GQA)
    >>> norm = stiefax.flax.QKNorm()
    >>> variables = norm.init(jax.random.key(2), q, k)
    >>> jax.tree.map(jnp.shape, variables["params"])
    {'key_ln': {'scale': (16,)}, 'query_ln': {'scale': (16,)}}
    >>> qn, kn = norm.apply(variables, q, k)
    >>> bool(jnp.allclose(jnp.mean(qn, -1), 0, atol=1e-5)), kn.shape
    (True, (2, 5, 2, 16))

  Attributes:
    epsilon: added to the variance (Flax's ``LayerNorm`` default, 1e-6).
    dtype: the outputs' dtype (``None``: Flax's promotion of the input and the
      scale, so float32 scales give float32 outputs; ``jnp.bfloat16`` keeps bf16).
    param_dtype: the scales' dtype (float32).

  Returns:
    ``__call__(q, k) -> (q, k)`` normalized, with the inputs' shapes: any leading
    axes, the head size last (the same for both).
  """

  epsilon: float = 1e-6
  dtype: Any = None
  param_dtype: Any = "float32"

  @linen.compact
  def __call__(self, q: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    _check_epsilon("QKNorm", self.epsilon)
    _check_head_sizes(q, k)
    kw = dict(epsilon=self.epsilon, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype)
    return linen.LayerNorm(**kw, name="query_ln")(q), linen.LayerNorm(**kw, name="key_ln")(k)


class NnxQKNorm(nnx.Module):
  """QK-norm for a Flax nnx attention layer: :class:`QKNorm`'s formula and numbers.

  ``q <- LayerNorm(q) * gamma_q``, ``k <- LayerNorm(k) * gamma_k`` over each head's
  ``r`` features, no bias, scales ``(r,)`` init 1 (``query_ln.scale``,
  ``key_ln.scale``), before RoPE and the logits; see :class:`QKNorm` for where it
  goes and why.

  Example:
    >>> import jax, jax.numpy as jnp, stiefax
    >>> from flax import nnx
    >>> norm = stiefax.flax.NnxQKNorm(16, rngs=nnx.Rngs(0))
    >>> q = jax.random.normal(jax.random.key(0), (2, 5, 4, 16))
    >>> k = jax.random.normal(jax.random.key(1), (2, 5, 2, 16))
    >>> qn, kn = norm(q, k)
    >>> norm.query_ln.scale.shape, bool(jnp.allclose(jnp.std(kn, -1), 1, atol=1e-3))
    ((16,), True)

  Args:
    head_dim: ``r``, the head size.
    epsilon: added to the variance (Flax's default, 1e-6).
    dtype: the outputs' dtype (``None``: Flax's promotion of input and scale).
    param_dtype: the scales' dtype (float32).
    rngs: the module's ``nnx.Rngs`` (the scales start at 1 and draw nothing).

  Returns:
    ``__call__(q, k) -> (q, k)`` normalized, with the inputs' shapes.
  """

  def __init__(
    self,
    head_dim: int,
    *,
    epsilon: float = 1e-6,
    dtype: Any = None,
    param_dtype: Any = "float32",
    rngs: nnx.Rngs,
  ):
    _check_epsilon("NnxQKNorm", epsilon)
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 1:
      raise ValueError(f"NnxQKNorm: head_dim must be an int >= 1, got {head_dim!r}.")
    self.head_dim = head_dim
    kw = dict(epsilon=epsilon, use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.query_ln = nnx.LayerNorm(head_dim, **kw)
    self.key_ln = nnx.LayerNorm(head_dim, **kw)

  def __call__(self, q: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    _check_head_sizes(q, k, self.head_dim, "NnxQKNorm")
    return self.query_ln(q), self.key_ln(k)


def _check_epsilon(name: str, epsilon: Any) -> None:
  """A one-line ValueError unless ``epsilon`` is a finite number > 0 (a static one)."""
  if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
    return  # an array: left to the norm
  if not (math.isfinite(epsilon) and epsilon > 0):
    raise ValueError(f"{name}: epsilon must be finite and > 0, got {epsilon!r}.")


def _check_head_sizes(
  q: jax.Array, k: jax.Array, head_dim: Optional[int] = None, name: str = "QKNorm"
) -> None:
  """One-line ValueErrors for inputs without a head axis, or whose head sizes differ
  from each other (or from ``head_dim``, the size the scales were built for)."""
  for what, x in (("q", q), ("k", k)):
    if jnp.ndim(x) < 1:
      raise ValueError(
        f"{name}: {what} must have the head size as its last axis, got a 0-d {what}."
      )
  if q.shape[-1] != k.shape[-1]:
    raise ValueError(
      f"{name}: q and k must share the head size (their last axis), got q {q.shape}"
      f" and k {k.shape}."
    )
  if head_dim is not None and q.shape[-1] != head_dim:
    raise ValueError(
      f"{name}: the head size (the last axis of q and k) must be head_dim={head_dim},"
      f" got q {q.shape} and k {k.shape}."
    )
