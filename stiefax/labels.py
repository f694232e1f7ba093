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

from typing import Any
from typing import Callable
from typing import Optional

import jax

from stiefax.layouts import EUCLIDEAN_LABEL
from stiefax.layouts import STIEFEL_LABEL
from stiefax.layouts import no_frames_message
from stiefax.layouts import qk_labels

__all__ = [
  "LabelsLike",
  "resolve_labels",
  "label_mask",
  "checked_labels",
]

# ----------------------------------------------------------------------------
# The one meaning of ``labels=``.
# ----------------------------------------------------------------------------

#: A label tree, or a callable ``params -> label tree``, or ``None`` (see
#: :func:`resolve_labels`).
LabelsLike = Any


def resolve_labels(params: Any, labels: LabelsLike = None) -> Any:
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
    >>> params = {"query": {"kernel": jnp.zeros((4, 1, 2))}, "mlp": {"kernel": jnp.zeros((4, 4))}}
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


def label_mask(params: Any, labels: LabelsLike = None, label: str = STIEFEL_LABEL) -> list[bool]:
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


def _top_keys(tree: Any) -> Optional[tuple[str, ...]]:
  keys = getattr(tree, "keys", None)
  return tuple(sorted(map(str, keys()))) if callable(keys) else None


def _structure_message(labels: Any, params: Any, who: str) -> str:
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


def checked_labels(labels: LabelsLike = None, who: str = "stiefel_adamw") -> Callable[[Any], Any]:
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

  def fn(params):
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
