"""Label trees read leaf by leaf: :func:`label_mask` (the body of :mod:`stiefax.labels`)."""

from __future__ import annotations

import jax
import optax

from stiefax._layouts import STIEFEL_LABEL
from stiefax._resolve import LabelsLike
from stiefax._resolve import resolve_labels


def label_mask(
  params: optax.Params, labels: LabelsLike = None, label: str = STIEFEL_LABEL
) -> list[bool]:
  """Which leaves of ``params`` carry ``label``, in ``jax.tree.leaves`` order.

  ``labels`` is resolved by :func:`resolve_labels` (``None``: the query/key frames).

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.labels import label_mask
    >>> label_mask({"key": {"kernel": jnp.zeros((4, 1, 2))},
    ...             "value": {"kernel": jnp.zeros((4, 4))}})
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
