"""Query/key layouts: what each parameter is, read from its name.

The names that mark parameters (:data:`STIEFEL_LABEL`, :data:`EUCLIDEAN_LABEL`), the
query/key weight layouts of Flax, Gemma, Llama-style and GPT-2-style models
(:data:`LAYOUTS`), and the two readers of a parameter tree built on them:
:func:`qk_labels`, which labels the query/key weights as frames, and
:func:`qk_frames`, which gives each of them its :class:`stiefax.FrameSpec`. They are
what ``labels=None`` and ``frames=None`` mean everywhere in stiefax
(:func:`stiefax.labels.resolve_labels`, :func:`resolve_frames`), and
``FramesLike`` is what ``frames=`` takes: a :class:`stiefax.FrameSpec` for every leaf,
a callable ``(key_path, leaf) -> FrameSpec`` such as :func:`qk_frames`, or ``None``.
"""

from __future__ import annotations

from stiefax._hyperball import matrix_frames
from stiefax._hyperball import muon_dimension_numbers
from stiefax._layout_table import LAYOUTS
from stiefax._layout_table import Layout
from stiefax._layout_table import layout_of
from stiefax._layouts import EUCLIDEAN_LABEL
from stiefax._layouts import STIEFEL_LABEL
from stiefax._layouts import attention_like
from stiefax._layouts import decay_mask
from stiefax._layouts import missing_frames_hint
from stiefax._layouts import no_frames_message
from stiefax._layouts import path_names
from stiefax._layouts import qk_frames
from stiefax._layouts import qk_labels
from stiefax._resolve import FramesLike
from stiefax._resolve import checked_frames
from stiefax._resolve import resolve_frames

__all__ = [
  "STIEFEL_LABEL",
  "EUCLIDEAN_LABEL",
  "path_names",
  "Layout",
  "LAYOUTS",
  "layout_of",
  "attention_like",
  "missing_frames_hint",
  "no_frames_message",
  "qk_labels",
  "qk_frames",
  "FramesLike",
  "resolve_frames",
  "checked_frames",
  "decay_mask",
  "matrix_frames",
  "muon_dimension_numbers",
]
