"""The query/key layouts that stiefax knows by name: one :class:`Layout` row each.

A row says where a layout's weights are (``<module>/<param>`` ending a path), what
they look like (the model code, the shape, the rank) and how to read them as frames
(its ``frame_spec`` builder, and the head count the builder needs when the shape does
not show it). :func:`layout_of` finds the row of a path, and every reader of
:data:`LAYOUTS` (:func:`stiefax.layouts.qk_labels`, :func:`stiefax.layouts.qk_frames`,
the warnings and hints on Dense kernels, the documentation's table of layouts) goes
through it or the tuple itself: a new layout is one row here. It depends only on
:class:`stiefax.FrameSpec`.
"""

from __future__ import annotations

from typing import Callable
from typing import NamedTuple
from typing import Optional
from typing import Sequence

from stiefax._frames import FrameSpec

__all__ = ["Layout", "LAYOUTS", "layout_of"]

#: The split of a weight's head axis that a builder receives: ``(heads, -1)`` for a
#: known head count, ``(-1, head_dim)`` for a known head dimension, or ``None`` for a
#: layout whose shape shows its heads.
HeadSplit = Optional[tuple[int, int]]


class Layout(NamedTuple):
  """One query/key weight layout that :func:`qk_labels` and ``qk_frames`` know.

  Example:
    >>> from stiefax.layouts import layout_of
    >>> row = layout_of(("attn", "c_attn", "kernel"))
    >>> row.heads, row.partial
    ('num_heads', True)
    >>> spec = row.frame_spec((-1, 16))   # qk_frames(head_dim=16)
    >>> spec.split, spec.select
    ((1, (3, -1, 16)), (1, (0, 1)))

  Attributes:
    module: the module name, the path entry before ``param``.
    param: the parameter name, the last path entry.
    family: the model code that stores its weights this way.
    shape: the weight's shape, in words.
    rank: the weight's rank.
    frames: which slices are frames; the rest of the weight is not.
    frame_spec: the builder of the weight's :class:`stiefax.FrameSpec`, given the
      split of its head axis: ``(heads, -1)`` or ``(-1, head_dim)`` when ``heads`` is
      set, ``None`` otherwise.
    heads: ``None`` when the shape shows the heads, else the argument of ``qk_frames``
      that counts them (``"num_heads"`` or ``"num_kv_heads"``; ``head_dim`` serves
      every such layout).
  """

  module: str
  param: str
  family: str
  shape: str
  rank: int
  frames: str
  frame_spec: Callable[[HeadSplit], FrameSpec]
  heads: Optional[str] = None

  @property
  def partial(self) -> bool:
    """Whether only part of the weight is frames (a fused query/key/value weight)."""
    return self.frame_spec(None if self.heads is None else (1, -1)).select is not None


def _every_head(heads: HeadSplit) -> FrameSpec:
  return FrameSpec()


def _heads_first(heads: HeadSplit) -> FrameSpec:
  return FrameSpec(row_axis=1)


def _k_of_kv(heads: HeadSplit) -> FrameSpec:
  return FrameSpec(row_axis=2, select=(0, (0,)))


def _q_and_k_of_qkv(heads: HeadSplit) -> FrameSpec:
  return FrameSpec(row_axis=2, select=(0, (0, 1)))


def _given(heads: HeadSplit) -> tuple[int, int]:
  if heads is None:
    raise ValueError(
      "The FrameSpec of a Dense layout needs the split of its head axis,"
      " (heads, -1) or (-1, head_dim); got None."
    )
  return heads


def _dense_heads(heads: HeadSplit) -> FrameSpec:
  return FrameSpec(split=(1, _given(heads)))


def _q_and_k_thirds(heads: HeadSplit) -> FrameSpec:
  return FrameSpec(split=(1, (3, *_given(heads))), select=(1, (0, 1)))


_FLAX = "Flax MultiHeadDotProductAttention, nnx MultiHeadAttention"
_LLAMA = "Llama-style separate Dense projections"

LAYOUTS = (
  Layout("query", "kernel", _FLAX, "(d_model, heads, head_dim)", 3, "every head", _every_head),
  Layout("key", "kernel", _FLAX, "(d_model, heads, head_dim)", 3, "every head", _every_head),
  Layout(
    "q_einsum",
    "w",
    "Gemma (heads-first einsum weights)",
    "(heads, d_model, head_dim)",
    3,
    "every head",
    _heads_first,
  ),
  Layout(
    "kv_einsum",
    "w",
    "Gemma with grouped-query attention",
    "(2, kv_heads, d_model, head_dim)",
    4,
    "the k slice [0]; v [1] is not",
    _k_of_kv,
  ),
  Layout(
    "qkv_einsum",
    "w",
    "Gemma with as many kv heads as heads",
    "(3, heads, d_model, head_dim)",
    4,
    "the q and k slices [0, 1]; v [2] is not",
    _q_and_k_of_qkv,
  ),
  Layout(
    "q_proj",
    "kernel",
    _LLAMA,
    "(d_model, heads * head_dim)",
    2,
    "every head",
    _dense_heads,
    "num_heads",
  ),
  Layout(
    "k_proj",
    "kernel",
    _LLAMA,
    "(d_model, kv_heads * head_dim)",
    2,
    "every head",
    _dense_heads,
    "num_kv_heads",
  ),
  Layout(
    "c_attn",
    "kernel",
    "GPT-2-style fused Dense projection",
    "(d_model, 3 * heads * head_dim)",
    2,
    "the q and k thirds; v is not",
    _q_and_k_thirds,
    "num_heads",
  ),
)
"""The query/key layouts recognized by name (``<module>/<param>`` ending a path)."""


def layout_of(names: Sequence[str]) -> Optional[Layout]:
  """The :class:`Layout` whose ``<module>/<param>`` ends a path, or ``None``.

  Example:
    >>> from stiefax.layouts import layout_of
    >>> layout_of(("params", "attn", "qkv_einsum", "w")).partial
    True
    >>> layout_of(("mlp", "kernel")) is None
    True

  Args:
    names: the names along a path (see :func:`path_names`).

  Returns:
    The layout, or ``None`` when the path ends in no known query/key weight.
  """
  if len(names) < 2:
    return None
  end = (names[-2], names[-1])
  return next((row for row in LAYOUTS if (row.module, row.param) == end), None)
