"""The readers of parameter names: what each parameter is, read from its name.

The implementation of :mod:`stiefax.layouts` (the label names, :func:`path_names`,
:func:`qk_labels`, :func:`qk_frames`, the hints of a tree without frames and
:func:`decay_mask`); the layouts they read are the rows of ``LAYOUTS``
(``stiefax/_layout_table.py``). It depends only on JAX, :class:`stiefax.FrameSpec` and
that table: the optimizers, the Flax helpers and the diagnostics import it, never the
other way round.
"""

from __future__ import annotations

import re
from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence

import jax
import jax.numpy as jnp

from stiefax import _layout_table
from stiefax._frames import FrameSpec
from stiefax._layout_table import Layout
from stiefax._layout_table import layout_of

__all__ = [
  "STIEFEL_LABEL",
  "EUCLIDEAN_LABEL",
  "path_names",
  "attention_like",
  "missing_frames_hint",
  "no_frames_message",
  "qk_labels",
  "qk_frames",
  "decay_mask",
]

#: The label of frame parameters: they are trained on ``St(d, r)``.
STIEFEL_LABEL = "stiefel"

#: The label of every other parameter. The value ``"adamw"`` names the optimizer that
#: :func:`stiefax.stiefel_adamw` gives these parameters (they are not frames: they stay
#: Euclidean); it is kept as written because users' label trees hold it.
EUCLIDEAN_LABEL = "adamw"

# Trailing attribute keys that nnx Variables add to a path (``.../kernel.value``).
_VARIABLE_ATTRS = ("value", "raw_value")


def path_names(path: Sequence[Any]) -> tuple[str, ...]:
  """The names along a key path, without the attribute keys of nnx Variables.

  ``('params', 'layer_0', 'query', 'kernel')`` for linen and nnx alike: at ``init``
  an ``nnx.Optimizer`` passes Variables (paths end in ``.value``), at ``update`` plain
  arrays.

  Example:
    >>> import jax
    >>> from stiefax.layouts import path_names
    >>> path = (jax.tree_util.DictKey("query"), jax.tree_util.DictKey("kernel"))
    >>> path_names(path)
    ('query', 'kernel')

  Args:
    path: a key path, as given by ``jax.tree_util.tree_map_with_path``.

  Returns:
    The tuple of names (strings) along the path, in order (dict keys, sequence
      indices and attribute names),
      trailing ``value`` / ``raw_value`` attribute keys dropped.
  """
  names = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      names.append(str(k.key))
    elif isinstance(k, jax.tree_util.SequenceKey):
      names.append(str(k.idx))
    elif isinstance(k, jax.tree_util.GetAttrKey):
      names.append(str(k.name))
    elif isinstance(k, jax.tree_util.FlattenedIndexKey):
      names.append(str(k.key))
    else:
      names.append(str(k))
  while names and names[-1] in _VARIABLE_ATTRS:
    names.pop()
  return tuple(names)


# Lower-case name tokens that mark a parameter as part of an attention layer.
_ATTENTION_TOKENS = frozenset(
  {"q", "k", "wq", "wk", "qk", "qkv", "kv", "query", "key", "queries", "keys"}
)
_ATTENTION_WORDS = ("attn", "attention")


def _looks_like_attention(names: Sequence[str]) -> bool:
  for name in names:
    low = name.lower()
    if any(w in low for w in _ATTENTION_WORDS):
      return True
    if _ATTENTION_TOKENS.intersection(re.split(r"[^a-z]+", low)):
      return True
  return False


def attention_like(params: Any) -> list[tuple[str, tuple[int, ...]]]:
  """``(path, shape)`` of every matrix-shaped leaf whose path looks like attention.

  A leaf of rank >= 2 is attention-like when an entry of its path contains ``attn`` or
  ``attention``, or has a name token (split at non-letters) such as ``q``, ``k``,
  ``wq``, ``query``, ``key``, ``qkv`` or ``kv``. :func:`qk_labels` and
  :func:`stiefax.stiefel_adamw` use it to refuse a model whose attention they would
  otherwise silently train as plain AdamW.

  Example:
    >>> import jax.numpy as jnp, stiefax
    >>> zeros = jnp.zeros((8, 8))
    >>> params = {"attn": {"q_lin": {"w": zeros}}, "mlp": {"w": zeros}}
    >>> stiefax.layouts.attention_like(params)
    [('attn/q_lin/w', (8, 8))]

  Args:
    params: a parameter tree.

  Returns:
    A list of ``(path, shape)``, the path's names joined by ``/``.
  """
  out = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = path_names(path)
    if jnp.ndim(leaf) >= 2 and _looks_like_attention(names):
      out.append(("/".join(names), tuple(jnp.shape(leaf))))
  return out


def _nothing_selected_message(found: Sequence[tuple[str, tuple[int, ...]]]) -> str:
  """How to select frames, given the attention-like leaves that were found."""
  shown = ", ".join(f"{p} {s}" for p, s in found[:6])
  more = f" (and {len(found) - 6} more)" if len(found) > 6 else ""
  modules: list[str] = []
  for p, _ in found:
    names = p.split("/")
    if len(names) >= 2 and names[-1] == "kernel" and names[-2] not in modules:
      modules.append(names[-2])
  hint = (
    f" If {tuple(modules[:4])} hold queries and keys of shape (d_model, heads,"
    f" head_dim), select them with labels=lambda p: stiefax.layouts.qk_labels(p,"
    f" modules={tuple(m for m in modules[:4])}); otherwise"
    if modules
    else " Select the query/key kernels with"
  )
  return (
    f"it found attention-like parameters: {shown}{more}.{hint} a labels= tree or"
    " callable marking them 'stiefel' (with frames= for their layout; see the"
    " docs page 'Use it with your model')."
  )


def missing_frames_hint(params: Any) -> str:
  """Why nothing in ``params`` is a frame, and how to select the frames: one sentence.

  Used in the errors of functions that refuse a label tree without frames.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.layouts import missing_frames_hint
    >>> missing_frames_hint({"mlp": {"kernel": jnp.zeros((4, 4))}})
    'the params hold no attention-like parameter either.'

  Args:
    params: a parameter tree.

  Returns:
    The attention-like parameters found and how to label them, or a note that there
      are none.
  """
  found = attention_like(params)
  if not found:
    return "the params hold no attention-like parameter either."
  return _nothing_selected_message(found)


def no_frames_message(who: str, params: Any, label: str = STIEFEL_LABEL) -> str:
  """The error of every function that finds no frame in ``params``: one message.

  :func:`stiefax.stiefel_adamw` and :func:`stiefax.flax.project_params` refuse a
  label tree without frames with it, rather than train or return the model unchanged.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.layouts import no_frames_message
    >>> no_frames_message("project_params", {"mlp": {"kernel": jnp.zeros((4, 4))}})
    "project_params: no parameter is labelled 'stiefel', ...

  Args:
    who: the name that starts the message.
    params: the parameter tree.
    label: the label that marks frames.

  Returns:
    The message: what was found, and how to select the frames.
  """
  return (
    f"{who}: no parameter is labelled {label!r}, so no parameter is a frame"
    " (stiefel_adamw would train every parameter as plain AdamW; use optax.adamw for"
    " that); " + missing_frames_hint(params)
  )


def qk_labels(
  params: Any,
  *,
  modules: Optional[Sequence[str]] = None,
  stiefel_label: str = STIEFEL_LABEL,
  other_label: str = EUCLIDEAN_LABEL,
) -> Any:
  """Labels the query/key weights ``stiefel`` and every other leaf ``adamw``.

  By default a leaf is a frame when its path ends in the ``<module>/<param>`` of a
  row of :data:`LAYOUTS` (``query/kernel``, ``key/kernel`` of Flax attention,
  ``q_einsum/w``, ``kv_einsum/w``, ``qkv_einsum/w`` of Gemma, ``q_proj/kernel``,
  ``k_proj/kernel``, ``c_attn/kernel`` of Dense projections, ...); fused weights
  are labelled whole, and :func:`stiefax.layouts.qk_frames` (the default ``frames`` of
  :func:`stiefax.stiefel_adamw`) selects their query/key slices. With ``modules``
  a leaf is a frame when its path ends in ``<module>/kernel`` for a name in
  ``modules``. Names match whole path entries, so ``value/kernel``, ``key/bias`` and
  ``my_query/kernel`` stay Euclidean. Works for linen variable dicts, nnx ``State``
  of Variables (``init``) and of plain arrays (``update``). It is what ``labels=None``
  means everywhere in stiefax (see :func:`resolve_labels`).

  A tree in which nothing is selected but some parameters look like attention (see
  :func:`attention_like`) raises a ValueError that lists them: a model is never
  trained as plain AdamW by accident.

  Example:
    >>> import jax, jax.numpy as jnp, flax.linen as nn, stiefax
    >>> attn = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)
    >>> params = attn.init(jax.random.key(0), jnp.ones((1, 3, 8)))
    >>> labels = stiefax.layouts.qk_labels(params)
    >>> labels["params"]["query"]["kernel"], labels["params"]["value"]["kernel"]
    ('stiefel', 'adamw')

  Args:
    params: a parameter tree.
    modules: ``None`` (the known layouts), or module names whose ``kernel`` is a
      frame.
    stiefel_label: label for frames.
    other_label: label for everything else.

  Returns:
    A tree of labels with the structure of ``params``.

  Raises:
    ValueError: if no leaf is selected and some look like attention.
  """
  if modules is not None:
    modules = (modules,) if isinstance(modules, str) else tuple(modules)

  def is_frame(names: tuple[str, ...]) -> bool:
    if len(names) < 2:
      return False
    if modules is None:
      return layout_of(names) is not None
    return names[-1] == "kernel" and names[-2] in modules

  def label(path: Sequence[Any], _: Any) -> str:
    return stiefel_label if is_frame(path_names(path)) else other_label

  labels = jax.tree_util.tree_map_with_path(label, params)
  if stiefel_label not in jax.tree.leaves(labels):
    found = attention_like(params)
    if found:
      rule = (
        "one of " + ", ".join(f"{l.module}/{l.param}" for l in _layout_table.LAYOUTS)
        if modules is None
        else f"<module>/kernel for a module in {modules}"
      )
      raise ValueError(
        f"qk_labels(modules={modules}) selects no frame (no path ends in {rule}),"
        " but " + _nothing_selected_message(found)
      )
  return labels


def qk_frames(
  *,
  num_heads: Optional[int] = None,
  num_kv_heads: Optional[int] = None,
  head_dim: Optional[int] = None,
) -> Callable[[Any, Any], FrameSpec]:
  """The :class:`stiefax.FrameSpec` of each query/key weight, read from its name.

  A ``frames=`` callable ``(path, leaf) -> FrameSpec`` for the layouts in
  :data:`LAYOUTS` (each row's ``frame_spec``: one frame per head; value slices of
  fused weights are not frames), and ``FrameSpec()`` for any other path:

  | path ends in | shape | FrameSpec |
  |---|---|---|
  | ``query/kernel``, ``key/kernel`` | ``(d, H, r)`` | ``FrameSpec()`` |
  | ``q_einsum/w`` | ``(H, d, r)`` | ``FrameSpec(row_axis=1)`` |
  | ``kv_einsum/w`` | ``(2, K, d, r)`` | ``FrameSpec(row_axis=2, select=(0, (0,)))`` |
  | ``qkv_einsum/w`` | ``(3, H, d, r)`` | ``FrameSpec(row_axis=2, select=(0, (0, 1)))`` |
  | ``q_proj/kernel`` | ``(d, H r)`` | ``FrameSpec(split=(1, (H, -1)))`` |
  | ``k_proj/kernel`` | ``(d, K r)`` | ``FrameSpec(split=(1, (K, -1)))`` |
  | ``c_attn/kernel`` | ``(d, 3 H r)`` | ``FrameSpec(split=(1, (3, H, -1)), select=(1, (0, 1)))`` |

  The Dense layouts (``q_proj``, ``k_proj``, ``c_attn``: the rows with ``heads``) do
  not show their head count in their shape: give ``head_dim`` (one number for queries
  and keys, with or without grouped-query attention), or ``num_heads`` and, for
  ``k_proj``, ``num_kv_heads``.
  Without them those leaves raise a ValueError: the head count is never guessed.
  A recognized name with another rank (e.g. layer-stacked) raises too; give such
  weights your own ``FrameSpec``.

  Example:
    >>> import jax, jax.numpy as jnp, stiefax
    >>> frames = stiefax.layouts.qk_frames(head_dim=16)
    >>> path = (jax.tree_util.DictKey("c_attn"), jax.tree_util.DictKey("kernel"))
    >>> spec = frames(path, jnp.zeros((128, 3 * 128)))
    >>> spec.split, spec.select
    ((1, (3, -1, 16)), (1, (0, 1)))

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

  counts = {"num_heads": num_heads, "num_kv_heads": num_kv_heads}

  def head_split(layout: Layout, path: Sequence[Any], leaf: Any) -> tuple[int, int]:
    if head_dim is not None:
      return (-1, head_dim)
    count = counts.get(layout.heads or "")
    if count is None:
      raise ValueError(
        f"The parameter at {_named(path)} (shape {tuple(jnp.shape(leaf))}) has the"
        f" layout {layout.shape} of {layout.family}: its head count cannot be"
        " read from its shape. Pass"
        f" frames=stiefax.layouts.qk_frames(head_dim=...) (or {layout.heads}=...)."
      )
    return (count, -1)

  def frames(path: Sequence[Any], leaf: jax.typing.ArrayLike) -> FrameSpec:
    layout = layout_of(path_names(path))
    if layout is None:
      return FrameSpec()
    if jnp.ndim(leaf) != layout.rank:
      raise ValueError(
        f"The parameter at {_named(path)} is named like a weight of {layout.family},"
        f" {layout.shape}, but has shape {tuple(jnp.shape(leaf))}. Give its layout"
        " with frames=stiefax.FrameSpec(...) (or a callable choosing one per path)."
      )
    heads = None if layout.heads is None else head_split(layout, path, leaf)
    return layout.frame_spec(heads)

  return frames


def _named(path: Any) -> str:
  return "/".join(path_names(path)) or "<root>"


def decay_mask(params: Any) -> Any:
  """The weight-decay mask of :func:`stiefax.stiefel_adamw`: True on tensors of rank >= 2.

  Matrices and kernels are decayed; biases, scales and other vectors are not (the
  usual AdamW convention, as in ``optax.adamw(mask=...)``).

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.layouts import decay_mask
    >>> decay_mask({"kernel": jnp.zeros((4, 4)), "bias": jnp.zeros(4)})
    {'bias': False, 'kernel': True}

  Args:
    params: a parameter tree.

  Returns:
    A tree of bools with the structure of ``params``.
  """
  return jax.tree.map(lambda p: p.ndim >= 2, params)
