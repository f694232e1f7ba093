"""The optimizer of an arm: one factory for every experiment command.

:func:`make_optimizer` is ``optax.adamw`` on the whole model for the arms whose frames
are ordinary AdamW parameters, else ``stiefax.stiefel_adamw`` with the arm's frame rule
(:func:`frame_rule`) on W_Q, W_K and AdamW on the rest. The rates, betas, decay and
the Riemannian Adam settings are a :class:`Hyper`; the arm's ``options`` override them.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Optional
from typing import Union
import warnings

import jax
import optax

import stiefax
from stiefax import layouts
from stiefax.experiments import attention
from stiefax.experiments.arms import Arm

__all__ = ["Hyper", "decay_mask", "frame_rule", "make_optimizer"]

Rate = Union[float, Any]  # a float or an Optax schedule


@dataclasses.dataclass(frozen=True)
class Hyper:
  """The hyperparameters an optimizer is built from (besides the arm).

  Attributes:
    adamw_lr: AdamW's rate for the non-frame parameters (a float or a schedule).
    frame_lr: the frame rule's rate.
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
  frame_lr: Rate = 1.0
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


def frame_rule(arm: Arm, h: Hyper) -> optax.GradientTransformation:
  """The arm's transform for W_Q, W_K (an ``optax.GradientTransformation``)."""
  rule, opts = arm.frames, dict(arm.options)
  where: dict = {} if h.frames is None else {"frames": h.frames}
  if rule == "riemannian_adam":
    kw: dict = dict(b1=h.b1, b2=h.b2, eps=h.eps, max_norm=h.max_norm, method=h.polar)
    return stiefax.riemannian_adam(h.frame_lr, **{**kw, **where, **opts})
  if rule == "riemannian_sgd":
    return stiefax.riemannian_sgd(h.frame_lr, **{"method": h.polar, **where, **opts})
  if rule == "manifold_muon":
    return stiefax.manifold_muon(h.frame_lr, **{**where, **opts})
  if rule == "muon":
    # W_Q, W_K are (d, heads, r) kernels: reduce over d, one matrix per head.
    dims = optax.contrib.MuonDimensionNumbers(reduction_axis=0, output_axis=2)
    return optax.contrib.muon(
      h.frame_lr,
      weight_decay=h.weight_decay,
      muon_weight_dimension_numbers=lambda p: jax.tree.map(lambda _: dims, p),
      **opts,
    )
  if rule == "adam":
    return optax.adam(h.frame_lr, b1=h.b1, b2=h.b2, **opts)
  if rule == "zero":
    return optax.set_to_zero()
  raise ValueError(f"arm {arm.name!r}: frames={rule!r} is trained by AdamW, not a frame rule")


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
    return optax.adamw(
      h.adamw_lr,
      b1=h.b1,
      b2=h.b2,
      eps=h.adamw_eps,
      weight_decay=h.weight_decay,
      mask=decay_mask,
    )
  with warnings.catch_warnings():
    # The frame rule carries its own schedule (Hyper.frame_lr), shaped as adamw_lr.
    warnings.filterwarnings("ignore", "stiefax.stiefel_adamw: stiefel= is a ready transform")
    return stiefax.stiefel_adamw(
      h.adamw_lr,
      weight_decay=h.weight_decay,
      b1=h.b1,
      b2=h.b2,
      eps=h.adamw_eps,
      stiefel=frame_rule(arm, h),
      **({} if h.frames is None else {"frames": h.frames}),
    )


# ----------------------------------------------------------------------------------
# Matrix rules (``Arm.matrices``): the hidden matrices of ``stiefax lm``.
# ----------------------------------------------------------------------------------

_MATRIX = stiefax.labels.HYPERBALL_LABEL
_REST = "adamw"
_FRAMES = "frames"
_MIXED = "frames+matrix"  # a fused weight holding frames and a matrix (kv_einsum)


def _rest(h: Hyper) -> optax.GradientTransformation:
  return optax.adamw(
    h.adamw_lr, b1=h.b1, b2=h.b2, eps=h.adamw_eps, weight_decay=h.weight_decay, mask=decay_mask
  )


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
