"""Label trees: which parameters are Stiefel frames, and what ``labels=`` means.

A *label tree* has the structure of the parameters and holds
:data:`stiefax.layouts.STIEFEL_LABEL` at every frame parameter and
:data:`stiefax.layouts.EUCLIDEAN_LABEL` everywhere else; it is what
``optax.partition`` routes on in :func:`stiefax.stiefel_adamw`, and what the Flax
helpers, diagnostics and covariance actions read to find the frames.

Every function of stiefax that takes ``labels=`` resolves it with
:func:`resolve_labels`, which gives ``labels=None`` one meaning throughout the
library: the query/key weights that :func:`stiefax.layouts.qk_labels` finds (a single
array passed as the whole parameter tree is one frame parameter).
"""

from __future__ import annotations

from stiefax._hyperball import HYPERBALL_LABEL
from stiefax._hyperball import matrix_labels
from stiefax._labels import label_mask
from stiefax._resolve import LabelsLike
from stiefax._resolve import checked_labels
from stiefax._resolve import resolve_labels

__all__ = [
  "LabelsLike",
  "resolve_labels",
  "label_mask",
  "checked_labels",
  "HYPERBALL_LABEL",
  "matrix_labels",
]
