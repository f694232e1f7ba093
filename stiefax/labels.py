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

import jax
import optax

from stiefax._hyperball import HYPERBALL_LABEL
from stiefax._hyperball import matrix_labels
from stiefax._layouts import STIEFEL_LABEL
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


def label_mask(
  params: optax.Params, labels: LabelsLike = None, label: str = STIEFEL_LABEL
) -> list[bool]:
  """Which leaves of ``params`` carry ``label``, in ``jax.tree.leaves`` order.

  ``labels`` is resolved by :func:`resolve_labels` (``None``: the query/key frames).

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.labels import label_mask
    >>> label_mask({"key": {"kernel": jnp.zeros((4, 1, 2))}, "value": {"kernel": jnp.zeros((4, 4))}})
    [True, False]

  Args:
    params: a parameter tree.
    labels: ``None``, a label tree, or a callable ``params -> label tree``.
    label: the label of the leaves to select.

  Returns:
    One bool per leaf.

  Raises:
    ValueError: if the label tree does not have one label per leaf.
  """
  leaves = jax.tree.leaves(params)
  flat = jax.tree.leaves(resolve_labels(params, labels))
  if len(flat) != len(leaves):
    raise ValueError(
      f"labels has {len(flat)} leaves but params has {len(leaves)}; give a label"
      " tree with the structure of params (see stiefax.layouts.qk_labels)."
    )
  return [lab == label for lab in flat]
