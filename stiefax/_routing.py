"""Routing a pytree of frame parameters to the per-frame math of :mod:`stiefax.geometry`.

The helpers every frame transform shares: the error for a missing ``params``, the
checks of scalar hyperparameters (eager for Python numbers, in the update for traced
ones), mapping a per-leaf function that returns several trees, the dtype a frame's
update is computed in, per-frame masks and caps, and per-frame zeros sharded like the
params.
"""

from __future__ import annotations

import math
from typing import Any
from typing import Callable
from typing import Optional

import jax
import jax.numpy as jnp

from stiefax import geometry
from stiefax._frames import FrameSpec

PARAMS_REQUIRED = (
  "stiefax.{name} needs the current point W: call"
  " `tx.update(updates, state, params)`. The frame transforms (on the Stiefel"
  " manifold or on spheres) project onto the tangent space at W and retract from W,"
  " so they cannot run without params."
  " (With nnx.Optimizer and optax.partition the params are passed for you.)"
)


WRONG_SHAPE = (
  "stiefax.{name}: the update at {path} has shape {update} but its parameter has shape"
  " {param}. Pass updates with the structure and shapes of the params (gradients of"
  " the same tree the optimizer was initialized with)."
)


def require_params(name: str, params: Any, updates: Any = None) -> None:
  """Raises the one clear ValueError of a transform that needs ``params``.

  With ``updates``, also a ValueError naming the path and both shapes when an update's
  shape differs from its parameter's (shapes are static, so this holds under ``jit``).
  """
  if params is None:
    raise ValueError(PARAMS_REQUIRED.format(name=name))
  if updates is not None:
    check_shapes(name, updates, params)


def check_shapes(name: str, updates: Any, params: Any) -> None:
  """A ValueError naming the path and both shapes of the first mismatched update."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(updates)
  try:
    param_leaves = treedef.flatten_up_to(params)  # type: ignore[attr-defined]
  except (ValueError, TypeError):
    return  # a structure mismatch is reported by the tree map itself
  for (path, u), w in zip(flat, param_leaves):
    if u is None or w is None:
      continue
    us, ws = tuple(jnp.shape(u)), tuple(jnp.shape(getattr(w, "value", w)))
    if us != ws:
      raise ValueError(
        WRONG_SHAPE.format(
          name=name, path=jax.tree_util.keystr(path) or "<root>", update=us, param=ws
        )
      )


# The allowed range of each scalar hyperparameter: (its words, its test). A test uses
# only comparisons joined by ``&``, so it serves Python numbers and traced arrays alike.
_RANGES: dict[str, tuple[str, Callable[[Any], Any]]] = {
  "learning_rate": ("finite and >= 0", lambda v: v >= 0),
  "b1": ("in [0, 1)", lambda v: (v >= 0) & (v < 1)),
  "b2": ("in [0, 1)", lambda v: (v >= 0) & (v < 1)),
  "beta": ("in [0, 1)", lambda v: (v >= 0) & (v < 1)),
  "eps": ("finite and >= 0", lambda v: v >= 0),
  "weight_decay": ("finite and >= 0", lambda v: v >= 0),
  "max_norm": ("finite and > 0, or None", lambda v: v > 0),
  "step_bound": ("finite and > 0, or None", lambda v: v > 0),
  "init_tol": ("finite and >= 0, or None", lambda v: v >= 0),
  "radius": ("finite and > 0, or None", lambda v: v > 0),
  "iterations": ("an int >= 1", lambda v: v >= 1),
  "ns_iterations": ("an int >= 1", lambda v: v >= 1),
}
_INTEGERS = ("iterations", "ns_iterations")


def _static(value: Any) -> bool:
  """Whether ``value`` is a Python number (not a bool): checked when the optimizer is built."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_hyperparams(name: str, **values: Any) -> None:
  """A ValueError naming the argument and its range for a Python number out of range.

  ``values`` maps argument names (keys of the range table: ``learning_rate``, ``b1``,
  ``b2``, ``beta``, ``eps``, ``weight_decay``, ``max_norm``, ``step_bound``,
  ``init_tol``, ``radius``, ``iterations``, ``ns_iterations``) to what the caller
  passed. ``None``, arrays, tracers and schedules are left alone: they are checked in
  the update (:func:`hyperparams_ok`), where a bad value is a counted skip.
  """
  for arg, value in values.items():
    problem = hyperparam_problem(arg, value)
    if problem is not None:
      raise ValueError(f"stiefax.{name}: {arg} {problem}.")


def hyperparam_problem(arg: str, value: Any) -> Any:
  """``"must be <range>, got <value>"`` if the Python number ``value`` is out of range.

  ``None`` when it is in range, or not a Python number (see :func:`check_hyperparams`).
  The command line reuses it, so its flags have the ranges of the optimizers.
  """
  words, test = _RANGES[arg]
  if arg in _INTEGERS:
    bad = not isinstance(value, int) or isinstance(value, bool) or not test(value)
  elif not _static(value):
    return None
  else:
    bad = not (math.isfinite(value) and test(value))
  return f"must be {words}, got {value!r}" if bad else None


def hyperparams_ok(**values: Any) -> Any:
  """A traced bool: whether the traced hyperparameters in ``values`` are in range.

  ``None`` when every value is a Python number (checked already) or ``None``: the
  update's arithmetic is then left exactly as it was. A transform folds the result into
  its per-frame finiteness test, so a schedule or an injected hyperparameter that turns
  non-finite (or leaves its range) during training skips the step and is counted,
  like a non-finite gradient.
  """
  ok = None
  for arg, value in values.items():
    if value is None or _static(value) or callable(value):
      continue
    v = jnp.asarray(value)
    test = jnp.isfinite(v) & _RANGES[arg][1](v)
    ok = test if ok is None else ok & test
  return ok


def nan_unless(ok: Any, x: jax.Array) -> jax.Array:
  """``x`` where ``ok`` (from :func:`hyperparams_ok`; ``None``: always), else NaN.

  A step made NaN this way is skipped and counted by the retraction that follows.
  """
  return x if ok is None else jnp.where(ok, x, jnp.nan)


def per_leaf(fn: Callable[..., Any], n_out: int, tree: Any, *rest: Any) -> tuple[Any, ...]:
  """Maps ``fn(path, leaf, *rest_leaves) -> tuple`` and unzips ``n_out`` trees."""
  treedef = jax.tree_util.tree_structure(tree)
  outs = jax.tree_util.tree_map_with_path(fn, tree, *rest)
  flat = treedef.flatten_up_to(outs)  # type: ignore[attr-defined]
  return tuple(treedef.unflatten([o[i] for o in flat]) for i in range(n_out))  # type: ignore[attr-defined]


def update_dtype(u: Any, w: Any) -> jnp.dtype:
  """The dtype a frame's update is computed in: float32 or the wider of ``u`` and ``w``."""
  return geometry.compute_dtype(jnp.promote_types(u.dtype, w.dtype))


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


def check_name(kind: str, name: Any, valid: tuple[str, ...]) -> None:
  """A ValueError naming the valid choices when ``name`` is not one of them."""
  if name not in valid:
    raise ValueError(f"Unknown {kind} {name!r}; valid {kind}s are {valid}.")


def _at(rate: Any, count: Any) -> Any:
  return rate(count) if callable(rate) else rate


def rate_for(learning_rate: Any, scale: Any, peak: Any) -> Any:
  """``scale(t) * learning_rate(t) / peak`` as a float, an array or a schedule."""
  if callable(learning_rate) or callable(scale):
    return lambda count: _at(scale, count) * _at(learning_rate, count) / peak
  return scale * learning_rate / peak


def frame_rate(
  learning_rate: Any,
  stiefel_learning_rate: Optional[Any],
  peak_learning_rate: Optional[Any],
  who: str = "stiefel_adamw",
) -> Any:
  """The frames' Riemannian rate of :func:`stiefax.stiefel_adamw` (the rule is there)."""
  scale = 1.0 if stiefel_learning_rate is None else stiefel_learning_rate
  if peak_learning_rate is None:
    if isinstance(learning_rate, (int, float)):
      # A constant rate: the frames run at their own rate (zero when it is zero).
      return scale if learning_rate != 0 else 0.0
    kind = "a schedule" if callable(learning_rate) else "an array"
    raise ValueError(
      f"stiefax.{who}: learning_rate is {kind}, so the frames' rate"
      " stiefel_learning_rate * learning_rate(t) / peak_learning_rate needs"
      " peak_learning_rate (the largest value of learning_rate, e.g. the peak_value of"
      " a warm-up schedule; optax.inject_hyperparams passes every rate as an array, so"
      " give it there too: inject_hyperparams(stiefel_adamw)(learning_rate=1e-3,"
      " peak_learning_rate=1e-3))."
    )
  if isinstance(peak_learning_rate, (int, float)) and not peak_learning_rate > 0:
    raise ValueError(
      f"stiefax.{who}: peak_learning_rate must be positive, got {peak_learning_rate!r}."
    )
  return rate_for(learning_rate, scale, peak_learning_rate)
