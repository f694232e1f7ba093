"""Routing a pytree of frame parameters to the per-frame math of :mod:`stiefax.geometry`.

The per-frame helpers every frame transform shares: the stateless transform that maps
each update leaf with its parameter, mapping a per-leaf function that returns several
trees, the dtype a frame's update is computed in, per-frame caps
broadcast against the frames, and per-frame zeros sharded like the params. The checks
of their arguments are in :mod:`stiefax._checks`.
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Optional

import jax
import jax.numpy as jnp
import optax

from stiefax import _checks
from stiefax._frames import FrameSpec
from stiefax._matrix import compute_dtype


def map_with_params(
  name: str, leaf: Callable[[Any, jax.Array, jax.Array], jax.Array]
) -> optax.GradientTransformation:
  """A stateless transform whose ``update`` maps ``leaf(path, u, w)`` over the updates
  and the params; ``name`` is the transform's, for the error when params are missing."""

  def init_fn(params: optax.Params) -> optax.EmptyState:
    del params
    return optax.EmptyState()

  def update_fn(
    updates: optax.Updates, state: optax.EmptyState, params: Optional[optax.Params] = None
  ) -> tuple[optax.Updates, optax.EmptyState]:
    _checks.require_params(name, params, updates)
    return jax.tree_util.tree_map_with_path(leaf, updates, params), state

  return optax.GradientTransformation(init_fn, update_fn)


def per_leaf(fn: Callable[..., Any], n_out: int, tree: Any, *rest: Any) -> tuple[Any, ...]:
  """Maps ``fn(path, leaf, *rest_leaves) -> tuple`` and unzips ``n_out`` trees."""
  treedef = jax.tree_util.tree_structure(tree)
  outs = jax.tree_util.tree_map_with_path(fn, tree, *rest)
  flat = treedef.flatten_up_to(outs)  # type: ignore[attr-defined]  # PyTreeDef is opaque to mypy
  return tuple(treedef.unflatten([o[i] for o in flat]) for i in range(n_out))  # type: ignore[attr-defined]  # PyTreeDef is opaque to mypy


def update_dtype(u: Any, w: Any) -> jnp.dtype:
  """The dtype a frame's update is computed in: float32 or the wider of ``u`` and ``w``."""
  return compute_dtype(jnp.promote_types(u.dtype, w.dtype))


def expand(per_frame: jax.Array) -> jax.Array:
  """A per-frame array (batch shape) broadcastable against ``(..., d, r)`` frames."""
  return per_frame[..., None, None]


def cap_factor(norm: jax.Array, limit: Any) -> jax.Array:
  """``min(1, limit / norm)`` per frame, with 1 for a zero (or NaN) norm."""
  return jnp.where(norm > limit, limit / jnp.where(norm > 0, norm, 1), 1)


def zeros_per_frame(spec: FrameSpec, w: Any, dtype: Any) -> jax.Array:
  """Zeros of the frames' batch shape (one per frame), sharded like ``w``'s frames.

  Taken from entry ``(0, 0)`` of every frame, so that a state built outside ``jit``
  from sharded params is sharded along the same batch axes (heads, layers).
  """
  batch_shape = spec.batch_shape(w.shape)  # also validates the axes and r <= d
  view = spec.view(jnp.asarray(w))  # w itself unless the spec splits or selects
  row, cols, _ = spec.axes(view.ndim)
  index = tuple(0 if a == row or a in cols else slice(None) for a in range(view.ndim))
  first = view[index]
  assert first.shape == batch_shape, (first.shape, batch_shape)
  return jnp.zeros_like(first, dtype=dtype)
