"""The checks every frame transform makes of its arguments.

The one error for a missing ``params``, the update shapes against the params', the
choice of a name among the valid ones, and the ranges of the scalar hyperparameters:
eager for Python numbers (:func:`check_hyperparams`), in the update for traced ones
(:func:`hyperparams_ok`, :func:`nan_unless`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
from typing import Any
from typing import Callable
from typing import Iterator
from typing import Optional

import jax
import jax.numpy as jnp
import optax

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


# The public function whose ``init`` is running: the outermost one, the function the
# user called (``stiefel_adamw`` rather than the ``polar_retract`` inside it).
_CALLER: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
  "stiefax_caller", default=None
)


@contextlib.contextmanager
def called_as(name: str) -> Iterator[None]:
  """Within it, :func:`caller` is ``name``, unless an outer public function set it."""
  token = _CALLER.set(name) if _CALLER.get() is None else None
  try:
    yield
  finally:
    if token is not None:
      _CALLER.reset(token)


def caller(default: str) -> str:
  """The public function whose ``init`` is running, else ``default``: errors name it."""
  return _CALLER.get() or default


def named_init(tx: optax.GradientTransformation, name: str) -> optax.GradientTransformation:
  """``tx`` whose ``init`` runs :func:`called_as` ``name``: its errors name ``name``."""
  init = tx.init

  def init_fn(params: optax.Params) -> optax.OptState:
    with called_as(name):
      return init(params)

  return tx._replace(init=init_fn)


# Modules whose frames a warning skips to reach the user's line.
_LIBRARY_PREFIXES = ("stiefax.", "jax.", "jaxlib.", "optax.", "flax.", "contextlib")


def refuse_zero_norms(
  name: str, what: str, path: Any, squared_norms: Any, why: str, fix: str
) -> None:
  """Raises one line where a norm in ``squared_norms`` (of the leaf at ``path``) is 0 at
  ``init``, so that it could never move: ``"{name}: {what} {path} has norm 0 at init
  and could never move ({why}); {fix}."``. Traced norms have no values to check."""
  if isinstance(squared_norms, jax.core.Tracer) or bool(jnp.all(squared_norms > 0)):
    return
  where = jax.tree_util.keystr(tuple(path)) or "<root>"
  raise ValueError(
    f"{name}: {what} {where} has norm 0 at init and could never move ({why}); {fix}."
  )


def user_stacklevel() -> int:
  """The ``stacklevel`` that attributes a warning to the first caller outside stiefax,
  JAX, Optax and Flax (the user's line), for a ``warnings.warn`` in the caller of this
  function; the experiment harness counts as a user."""
  frame = sys._getframe(1)
  level = 1
  while frame.f_back is not None:
    name = str(frame.f_globals.get("__name__", ""))
    library = name.startswith(_LIBRARY_PREFIXES) or name in ("stiefax", "jax", "optax")
    if not library or name.startswith("stiefax.experiments"):
      break
    frame = frame.f_back
    level += 1
  return level


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
    param_leaves = treedef.flatten_up_to(params)  # type: ignore[attr-defined]  # PyTreeDef is opaque to mypy
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


#: The largest rate, step cap or radius taken: a step's squared Frobenius norm must be
#: a float32 number (below ``3.4e38``, so the norm below ``1.8e19``), and an Adam
#: direction of a frame has a norm up to ``sqrt(d r)`` (``1e3`` and beyond for large
#: frames). A rate above this would overflow and skip, or not move, every step.
STEP_CEILING = 1e15

# The allowed range of each scalar hyperparameter: (its words, its test). A test uses
# only comparisons joined by ``&``, so it serves Python numbers and traced arrays alike.
_RANGES: dict[str, tuple[str, Callable[[Any], Any]]] = {
  "learning_rate": (
    "finite, >= 0 and <= 1e15 (a larger step overflows float32)",
    lambda v: (v >= 0) & (v <= STEP_CEILING),
  ),
  "b1": ("in [0, 1)", lambda v: (v >= 0) & (v < 1)),
  "b2": ("in [0, 1)", lambda v: (v >= 0) & (v < 1)),
  "beta": ("in [0, 1)", lambda v: (v >= 0) & (v < 1)),
  "eps": ("finite and >= 0", lambda v: v >= 0),
  "weight_decay": ("finite and >= 0", lambda v: v >= 0),
  "max_norm": ("finite, > 0 and <= 1e15, or None", lambda v: (v > 0) & (v <= STEP_CEILING)),
  "step_bound": ("finite, > 0 and <= 1e15, or None", lambda v: (v > 0) & (v <= STEP_CEILING)),
  "init_tol": ("finite and >= 0, or None", lambda v: v >= 0),
  "radius": ("finite, > 0 and <= 1e15, or None", lambda v: (v > 0) & (v <= STEP_CEILING)),
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


def check_name(kind: str, name: Any, valid: tuple[str, ...]) -> None:
  """A ValueError naming the valid choices when ``name`` is not one of them."""
  if name not in valid:
    raise ValueError(f"Unknown {kind} {name!r}; valid {kind}s are {valid}.")
