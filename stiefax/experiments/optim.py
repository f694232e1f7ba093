"""The optimizer of an arm: one factory for every experiment command.

:func:`make_optimizer` is ``optax.adamw`` on the whole model for the arms whose frames
are ordinary AdamW parameters, else ``stiefax.stiefel_adamw`` with the arm's frame rule
(:func:`frame_factory`) on W_Q, W_K and AdamW on the rest. The rates, betas, decay and
the Riemannian Adam settings are a :class:`Hyper`; the arm's ``options`` override them.

The frame rate is ``Hyper.frame_lr``, the ``stiefel_learning_rate`` of
``stiefax.stiefel_adamw``, and reaches the frames by that optimizer's own rule: they run
at ``frame_lr * adamw_lr(t) / peak_lr`` (:func:`frame_rate`), so a warm-up or a decay
of the AdamW rate reaches them in proportion. No command builds a frame schedule.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Optional
from typing import Union

import jax
import optax

import stiefax
from stiefax import layouts
from stiefax.experiments import attention
from stiefax.experiments.arms import Arm

__all__ = ["Hyper", "decay_mask", "frame_rate", "frame_factory", "frame_rule", "make_optimizer"]

Rate = Union[float, Any]  # a float or an Optax schedule


@dataclasses.dataclass(frozen=True)
class Hyper:
  """The hyperparameters an optimizer is built from (besides the arm).

  Attributes:
    adamw_lr: AdamW's rate for the non-frame parameters (a float or a schedule).
    frame_lr: the frames' rate at the peak of ``adamw_lr`` (``stiefel_learning_rate``
      of ``stiefax.stiefel_adamw``); the frames follow ``adamw_lr`` in shape
      (:func:`frame_rate`).
    peak_lr: the largest value of ``adamw_lr`` when it is a schedule (its
      ``peak_learning_rate``); ``None`` for a float ``adamw_lr``.
    weight_decay: AdamW's decoupled decay (tensors of rank >= 2 only).
    b1: first-moment decay of AdamW, Adam and the Riemannian Adam.
    b2: second-moment decay of the same.
    eps: the Riemannian Adam's eps.
    max_norm: the Riemannian Adam's step cap tau.
    polar: the polar retraction method of the Riemannian rules.
    adamw_eps: AdamW's eps.
    frames: the ``frames=`` of the frame rule and of ``stiefel_adamw`` (``None``: the
      one default of both, each leaf read by its name, :func:`stiefax.layouts.resolve_frames`).
    matrix_lr: the rate of the arm's matrix rule (``Arm.matrices``), a float or a
      schedule; unused by the arms whose hidden matrices train with AdamW.
  """

  adamw_lr: Rate = 1e-3
  frame_lr: float = 1.0
  peak_lr: Optional[float] = None
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  max_norm: Optional[float] = 0.1
  polar: str = "auto"
  adamw_eps: float = 1e-8
  frames: Any = None
  matrix_lr: Rate = 0.0


def decay_mask(params: Any) -> Any:
  """True on the tensors of rank >= 2: :func:`stiefax.layouts.decay_mask`."""
  return layouts.decay_mask(params)


def frame_rate(h: Hyper) -> Rate:
  """The frames' rate, by the rule of ``stiefax.stiefel_adamw``: ``frame_lr * adamw_lr(t)
  / peak_lr`` for a schedule, ``frame_lr`` for a float rate (0 where it is 0). A zero
  ``frame_lr`` is the constant 0.0, the same rate, whose transform keeps no schedule
  state (as the checkpoints of frozen-frame runs hold it)."""
  if not callable(h.adamw_lr) or h.frame_lr == 0:
    return h.frame_lr if h.adamw_lr != 0 else 0.0
  if h.peak_lr is None or not h.peak_lr > 0:
    raise ValueError(f"Hyper.peak_lr={h.peak_lr!r}: a schedule adamw_lr needs its peak, > 0")
  lr, scale, peak = h.adamw_lr, h.frame_lr, h.peak_lr
  return lambda count: scale * lr(count) / peak


def frame_factory(arm: Arm, h: Hyper) -> Any:
  """The arm's frame rule as ``stiefax.stiefel_adamw`` takes a factory: called as
  ``factory(rate, frames=...)``, it returns the transform for W_Q, W_K."""
  rule, opts = arm.frames, dict(arm.options)

  def where(frames: Any) -> dict:
    return {} if frames is None else {"frames": frames}

  if rule == "riemannian_adam":
    kw: dict = dict(b1=h.b1, b2=h.b2, eps=h.eps, max_norm=h.max_norm, method=h.polar)
    return lambda rate, frames=None: stiefax.riemannian_adam(
      rate, **{**kw, **where(frames), **opts}
    )
  if rule == "riemannian_sgd":
    return lambda rate, frames=None: stiefax.riemannian_sgd(
      rate, **{"method": h.polar, **where(frames), **opts}
    )
  if rule == "manifold_muon":
    return lambda rate, frames=None: stiefax.manifold_muon(rate, **{**where(frames), **opts})
  if rule == "muon":
    # W_Q, W_K are (d, heads, r) kernels: reduce over d, one matrix per head.
    dims = optax.contrib.MuonDimensionNumbers(reduction_axis=0, output_axis=2)
    return lambda rate, frames=None: optax.contrib.muon(
      rate,
      weight_decay=h.weight_decay,
      muon_weight_dimension_numbers=lambda p: jax.tree.map(lambda _: dims, p),
      **opts,
    )
  if rule == "adam":
    return lambda rate, frames=None: optax.adam(rate, b1=h.b1, b2=h.b2, **opts)
  if rule == "zero":
    return lambda rate, frames=None: optax.set_to_zero()
  raise ValueError(f"arm {arm.name!r}: frames={rule!r} is trained by AdamW, not a frame rule")


def frame_rule(arm: Arm, h: Hyper) -> optax.GradientTransformation:
  """The arm's transform for W_Q, W_K at :func:`frame_rate` (``Hyper.frames``)."""
  return frame_factory(arm, h)(frame_rate(h), frames=h.frames)


def make_optimizer(arm: Arm, h: Hyper) -> optax.GradientTransformation:
  """The arm's optimizer for a whole model (an ``optax.GradientTransformation``).

  A σReparam arm's variables hold a non-trained state collection, which the optimizer
  leaves unchanged (:func:`stiefax.experiments.attention.freeze_state`).
  """
  tx = _make_optimizer(arm, h)
  if arm.attention == "sigma":
    return attention.freeze_state(tx)
  return tx


def _make_optimizer(arm: Arm, h: Hyper) -> optax.GradientTransformation:
  if arm.matrices != "adamw":
    return _matrix_optimizer(arm, h)
  if not arm.apart:
    return _rest(h)
  return stiefax.stiefel_adamw(
    h.adamw_lr,
    **_adamw_settings(h),
    stiefel=_constant_if_zero(frame_factory(arm, h), h.frame_lr),
    stiefel_learning_rate=h.frame_lr,
    peak_learning_rate=h.peak_lr if callable(h.adamw_lr) else None,
    **({} if h.frames is None else {"frames": h.frames}),
  )


def _constant_if_zero(factory: Any, frame_lr: float) -> Any:
  """``factory``, called with the constant 0.0 where ``frame_lr`` is 0 (the rate
  ``stiefel_adamw`` passes is then 0 at every step): see :func:`frame_rate`."""
  if frame_lr != 0:
    return factory
  return lambda rate, frames=None: factory(0.0, frames=frames)


# ----------------------------------------------------------------------------------
# Matrix rules (``Arm.matrices``): the hidden matrices of ``stiefax lm``.
# ----------------------------------------------------------------------------------

_MATRIX = stiefax.labels.HYPERBALL_LABEL
_REST = "adamw"
_FRAMES = "frames"
_MIXED = "frames+matrix"  # a fused weight holding frames and a matrix (kv_einsum)


def _adamw_settings(h: Hyper) -> dict:
  """AdamW's moments, epsilon and decay, as ``optax.adamw`` and ``stiefel_adamw`` take them."""
  return {"b1": h.b1, "b2": h.b2, "eps": h.adamw_eps, "weight_decay": h.weight_decay}


def _rest(h: Hyper) -> optax.GradientTransformation:
  """``optax.adamw`` at the AdamW rate, decay on the tensors of rank >= 2."""
  return optax.adamw(h.adamw_lr, **_adamw_settings(h), mask=decay_mask)


def matrix_rule(arm: Arm, h: Hyper, frames: Any = None) -> optax.GradientTransformation:
  """The transform of the arm's matrix rule on the leaves labelled hidden matrices.

  ``frames`` (default :func:`stiefax.layouts.matrix_frames`) says which entries form
  one matrix.
  """
  rule = arm.matrices
  if rule == "adamh":
    base = optax.scale_by_adam(b1=h.b1, b2=h.b2, eps=h.adamw_eps)
    return stiefax.hyperball(base, h.matrix_lr, frames=frames)
  dims = layouts.muon_dimension_numbers(frames)
  if rule == "muonh":
    return stiefax.hyperball(
      optax.contrib.scale_by_muon(weight_dimension_numbers=dims), h.matrix_lr, frames=frames
    )
  if rule == "muon":  # Optax's Muon as it is: every leaf here is one of its matrices
    return optax.contrib.muon(
      h.matrix_lr, weight_decay=h.weight_decay, muon_weight_dimension_numbers=dims
    )
  if rule == "sphere_adam":
    return stiefax.sphere.sphere_adam(
      h.matrix_lr,
      b1=h.b1,
      b2=h.b2,
      eps=h.eps,
      max_norm=h.max_norm,
      frames=layouts.matrix_frames() if frames is None else frames,
    )
  raise ValueError(f"arm {arm.name!r}: matrices={rule!r} is AdamW, not a matrix rule")


def _both(
  a: optax.GradientTransformation, b: optax.GradientTransformation
) -> optax.GradientTransformation:
  """The sum of two transforms' updates of one leaf whose entries they split (each
  gives zero outside its own entries), with both states."""

  def init_fn(params: optax.Params) -> tuple:
    return a.init(params), b.init(params)

  def update_fn(updates: Any, state: tuple, params: Any = None) -> tuple:
    ua, sa = a.update(updates, state[0], params)
    ub, sb = b.update(updates, state[1], params)
    return jax.tree.map(lambda x, y: x + y, ua, ub), (sa, sb)

  return optax.GradientTransformation(init_fn, update_fn)


def _value_slice(path: Any, leaf: Any) -> stiefax.FrameSpec:
  """The value slice of a fused key/value weight as one matrix (B2-H's matrix part)."""
  spec = layouts.matrix_frames()(path, leaf)
  return stiefax.FrameSpec(spec.row_axis, spec.col_axes, select=(0, (1,)))


def _matrix_optimizer(arm: Arm, h: Hyper) -> optax.GradientTransformation:
  """The matrix rule on every hidden matrix (``stiefax.labels.matrix_labels``) and AdamW
  on the rest; with a frame rule (B2-H) the frames keep it, and a weight fusing frames
  and a matrix (``kv_einsum``: keys and values) gets both, each on its own entries."""
  if not arm.apart:
    return optax.partition(
      {_MATRIX: matrix_rule(arm, h), _REST: _rest(h)}, stiefax.labels.matrix_labels
    )

  def labels(params: Any) -> Any:
    qk = layouts.qk_labels(params)
    hidden = stiefax.labels.matrix_labels(params)

    def one(path: Any, q: str, m: str) -> str:
      if q != layouts.STIEFEL_LABEL:
        return m
      layout = layouts.layout_of(layouts.path_names(path))
      return _MIXED if layout is not None and layout.partial else _FRAMES

    return jax.tree_util.tree_map_with_path(one, qk, hidden)

  frames = frame_rule(arm, h)
  mixed = _both(frame_rule(arm, h), matrix_rule(arm, h, frames=_value_slice))
  return optax.partition(
    {_FRAMES: frames, _MIXED: mixed, _MATRIX: matrix_rule(arm, h), _REST: _rest(h)}, labels
  )
