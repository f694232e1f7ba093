"""One optimizer for a whole model: :func:`stiefel_adamw`, Stiefel frames plus AdamW."""

from __future__ import annotations

import functools
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional
from typing import Union
import warnings

import chex
import jax
import jax.numpy as jnp
import optax

from stiefax import _checks
from stiefax._alias import riemannian_adam
from stiefax._frames import FrameSpec
from stiefax._layout_table import layout_of
from stiefax._layouts import EUCLIDEAN_LABEL
from stiefax._layouts import STIEFEL_LABEL
from stiefax._layouts import decay_mask
from stiefax._layouts import path_names
from stiefax._layouts import qk_frames
from stiefax._resolve import FramesLike
from stiefax._resolve import LabelsLike
from stiefax._resolve import checked_frames
from stiefax._resolve import checked_labels
from stiefax._resolve import resolve_frames

__all__ = ["FramesAndRestState", "stiefel_adamw"]


class FramesAndRestState(NamedTuple):
  """State of the frame part of :func:`stiefel_adamw` when some frames fill part of a leaf.

  Used when a frame parameter's FrameSpec selects only part of it (a fused
  query/key/value weight); otherwise the frame part keeps the frame transform's state.

  Attributes:
    frames: the state of the frame transform (on the whole frame parameters).
    rest: the AdamW state of their entries outside the frames (the value slices).
  """

  frames: Any
  rest: Any


def _frames_and_rest(
  stiefel: optax.GradientTransformation,
  rest_tx: optax.GradientTransformation,
  rest_spec: Callable[[Any, Any], Optional[FrameSpec]],
) -> optax.GradientTransformation:
  """``stiefel`` on the frame parameters, ``rest_tx`` on their unselected entries.

  ``rest_spec(path, param)`` is the FrameSpec of a parameter whose spec selects part
  of it (``None`` otherwise). ``stiefel`` leaves those entries unchanged (a zero
  update), and ``rest_tx`` updates them as a separate leaf in the split layout. Without
  such parameters the state is ``stiefel``'s own.
  """

  def specs(params: optax.Params) -> list[Optional[FrameSpec]]:
    return [rest_spec(p, w) for p, w in jax.tree_util.tree_flatten_with_path(params)[0]]

  def rest_tree(tree: Any, found: list[Optional[FrameSpec]]) -> Any:
    it = iter(found)

    def leaf(_: Any, x: jax.Array) -> Union[jax.Array, optax.MaskedNode]:
      spec = next(it)
      return optax.MaskedNode() if spec is None else spec.rest(x)

    return jax.tree_util.tree_map_with_path(leaf, tree)

  def init_fn(params: optax.Params) -> optax.OptState:
    found = specs(params)
    state = stiefel.init(params)
    if all(s is None for s in found):
      return state
    return FramesAndRestState(state, rest_tx.init(rest_tree(params, found)))

  def update_fn(
    updates: optax.Updates,
    state: Any,  # stiefel's own state, or a FramesAndRestState
    params: Optional[optax.Params] = None,
  ) -> tuple[optax.Updates, optax.OptState]:
    _checks.require_params("stiefel_adamw", params)
    found = specs(params)
    if all(s is None for s in found):
      return stiefel.update(updates, state, params)
    out, frames_state = stiefel.update(updates, state.frames, params)
    rest_u, rest_state = rest_tx.update(
      rest_tree(updates, found), state.rest, rest_tree(params, found)
    )
    it = iter(zip(found, _rest_leaves(rest_u, found)))

    def leaf(u: jax.Array) -> jax.Array:
      spec, r = next(it)
      if spec is None:
        return u
      # The frame update is zero on the rest; put the rest's own update there.
      return spec.from_frames(spec.to_frames(u), u.shape, r.astype(u.dtype))

    return jax.tree.map(leaf, out), FramesAndRestState(frames_state, rest_state)

  return optax.GradientTransformation(init_fn, update_fn)


def _rest_leaves(rest_tree: Any, found: list) -> list:
  """The rest updates in leaf order, ``None`` where a parameter has no rest."""
  leaves = iter(jax.tree.leaves(rest_tree))
  return [None if spec is None else next(leaves) for spec in found]


def _keeps_own_frames(
  stiefel: optax.GradientTransformation, frames: FramesLike
) -> optax.GradientTransformation:
  """``stiefel``, whose ``init`` refuses ``frames`` that differ from the default reading.

  A ready transform keeps the frames it was built with, which cannot be read back: if
  ``frames`` reads a frame parameter otherwise than ``frames=None`` does, the two may
  disagree, and the frames would be trained in another view than the one asked for.
  """

  def init_fn(params: optax.Params) -> optax.OptState:
    for path, w in jax.tree_util.tree_flatten_with_path(params)[0]:
      spec = checked_frames(frames, path, w)
      try:
        default = resolve_frames(None, path, w)
      except ValueError:
        default = None
      if spec != default:
        where = "/".join(path_names(path)) or "<root>"
        raise ValueError(
          f"stiefax.stiefel_adamw: frames= reads the parameter at {where} as"
          f" {spec!r}, but stiefel= is a ready transform, which keeps its own frames"
          " (they are not passed on to it); pass a factory instead, e.g."
          " stiefel=functools.partial(stiefax.riemannian_adam, eps=1e-3), which is"
          " called with these frames."
        )
    return stiefel.init(params)

  return optax.GradientTransformation(init_fn, stiefel.update)


class _FramesReading(NamedTuple):
  """``frames=`` of :func:`stiefel_adamw`, read once.

  Attributes:
    rule: the frames a factory ``stiefel`` is called with: ``frames``, or
      :func:`stiefax.layouts.qk_frames` for ``None``.
    rest: ``(path, param) -> FrameSpec or None``: the spec of a frame parameter that
      it selects only part of (AdamW trains the other entries), else ``None``. For
      ``None`` only the fused layouts known by name are read, since a ready
      ``stiefel`` keeps frames of its own that ``stiefel_adamw`` cannot read.
    ready: what a ready ``stiefel`` becomes: for given ``frames``, a transform whose
      ``init`` refuses frames that read a parameter otherwise than ``frames=None``
      does (:func:`_keeps_own_frames`); for ``None``, itself.
  """

  rule: FramesLike
  rest: Callable[[Any, Any], Optional[FrameSpec]]
  ready: Callable[[optax.GradientTransformation], optax.GradientTransformation]


def _read_frames(frames: FramesLike) -> _FramesReading:
  """The one reading of ``frames=`` (and of ``frames=None``) in :func:`stiefel_adamw`."""
  if frames is not None:
    return _FramesReading(
      frames,
      functools.partial(_partly_selected, frames),
      functools.partial(_keeps_own_frames, frames=frames),
    )
  named = qk_frames()

  def rest(path: Any, w: Any) -> Optional[FrameSpec]:
    layout = layout_of(path_names(path))
    if layout is None or not layout.partial:
      return None
    return _partly_selected(named, path, w)

  return _FramesReading(named, rest, lambda stiefel: stiefel)


def _partly_selected(frames: FramesLike, path: Any, w: Any) -> Optional[FrameSpec]:
  """The FrameSpec of ``w`` if it selects part of it, else ``None``."""
  spec = checked_frames(frames, path, w)
  return None if spec.select is None else spec


def _at(rate: Any, count: Any) -> Any:
  return rate(count) if callable(rate) else rate


def _rate_for(learning_rate: Any, scale: Any, peak: Any) -> Any:
  """``scale(t) * learning_rate(t) / peak`` as a float, an array or a schedule."""
  if callable(learning_rate) or callable(scale):
    return lambda count: _at(scale, count) * _at(learning_rate, count) / peak
  return scale * learning_rate / peak


def _frame_rate(
  learning_rate: Any,
  stiefel_learning_rate: Optional[Any],
  peak_learning_rate: Optional[Any],
  who: str = "stiefel_adamw",
) -> Any:
  """The frames' Riemannian rate of :func:`stiefel_adamw`, by the rule of its docstring."""
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
  return _rate_for(learning_rate, scale, peak_learning_rate)


#: The one-line warning of a ready ``stiefel=`` next to a schedule ``learning_rate``.
_READY_WITH_SCHEDULE = (
  "stiefax.stiefel_adamw: stiefel= is a ready transform, so its frames will not follow"
  " the learning_rate schedule (they keep the rate they were built with); pass the"
  " factory and the frames' peak rate instead, e.g. stiefel=stiefax.manifold_muon,"
  " stiefel_learning_rate=0.05, peak_learning_rate=<the schedule's peak>."
)


def stiefel_adamw(
  learning_rate: optax.ScalarOrSchedule,
  *,
  weight_decay: chex.Numeric = 1e-4,
  b1: chex.Numeric = 0.9,
  b2: chex.Numeric = 0.999,
  eps: chex.Numeric = 1e-8,
  stiefel: Union[optax.GradientTransformation, Callable[..., Any], None] = None,
  labels: LabelsLike = None,
  frames: FramesLike = None,
  stiefel_learning_rate: Optional[optax.ScalarOrSchedule] = None,
  peak_learning_rate: Optional[float] = None,
  mask: Union[Any, Callable[[optax.Params], Any], None] = None,
  nesterov: bool = False,
) -> optax.GradientTransformation:
  """One optimizer for a whole model: Stiefel frames plus AdamW for the rest.

  ``optax.partition`` (formerly ``optax.multi_transform``) of

  * ``"stiefel"``: ``stiefel`` (default :func:`riemannian_adam`, the paper's B2) on
    the labelled frames (by default the query/key weights found by
    :func:`stiefax.layouts.qk_labels`, viewed as frames by
    :func:`stiefax.layouts.qk_frames`);
  * ``"adamw"``: ``optax.adamw(learning_rate, b1, b2, eps, weight_decay, mask,
    nesterov=nesterov)`` on every other parameter, by default with decay on tensors of
    rank >= 2 only (:func:`stiefax.layouts.decay_mask`).

  The frames' rate follows ``learning_rate`` in shape, at its own scale::

      frame_rate(t) = stiefel_learning_rate * learning_rate(t) / peak_learning_rate

  ``stiefel_learning_rate`` (default 1.0, the paper's ``eta_R``) is the frames' rate
  at the peak of ``learning_rate``: a warm-up, a decay, or a rate lowered through
  ``optax.inject_hyperparams`` reaches the frames in proportion, while the frames'
  step keeps its own, scale-free size (degree zero in the gradient, capped at
  ``tau sqrt(r)``; Propositions 3 and 6) instead of AdamW's ``1e-3``. For a constant
  ``learning_rate`` the peak is that number, so the frames run at
  ``stiefel_learning_rate``. For a schedule, or an array (as
  ``optax.inject_hyperparams`` passes every rate), give ``peak_learning_rate``.
  The rule builds the frame transform: the default :func:`riemannian_adam`, or
  ``stiefel`` when it is a factory (called as ``stiefel(frame_rate, frames=...)``,
  e.g. ``functools.partial(stiefax.riemannian_adam, eps=1e-3)``, or
  ``stiefax.manifold_muon`` with ``stiefel_learning_rate=0.05``; every frame rule of
  stiefax is such a factory). A ready transform given as ``stiefel`` keeps the rate it
  was built with; given next to a schedule ``learning_rate``, it draws a one-line
  ``UserWarning`` saying that its frames will not follow the schedule.

  A frame parameter whose :class:`stiefax.FrameSpec` selects only part of it (the
  query/key slices of a fused ``qkv_einsum``, ``kv_einsum`` or ``c_attn`` weight)
  has its other entries (the value slice) trained by the same AdamW, as a separate
  leaf in the split layout; its state is then a :class:`FramesAndRestState`.

  A label tree that selects no frame raises a ValueError naming the attention-like
  parameters it found: the optimizer never falls back to plain AdamW silently.

  Weight decay is never applied to frames: its Riemannian gradient is zero
  (Proposition 8). The layout follows ``optax.contrib.muon``.

  Example:
    >>> import jax, jax.numpy as jnp, optax, stiefax
    >>> import flax.linen as nn
    >>> model = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)
    >>> x = jnp.ones((1, 3, 8))
    >>> params = stiefax.flax.project_params(
    ...     model.init(jax.random.key(0), x), stiefax.layouts.qk_labels)
    >>> tx = stiefax.stiefel_adamw(1e-3, weight_decay=0.05)
    >>> state = tx.init(params)
    >>> grads = jax.grad(lambda p: jnp.sum(model.apply(p, x) ** 2))(params)
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optax.apply_updates(params, updates)

  Args:
    learning_rate: AdamW's rate (a float or an Optax schedule).
    weight_decay: AdamW's decoupled decay of the non-frame tensors that ``mask``
      selects.
    b1: AdamW's first-moment decay.
    b2: AdamW's second-moment decay.
    eps: AdamW's epsilon.
    stiefel: the frame rule: ``None`` (``riemannian_adam(frame_rate,
      frames=frames)``), a factory called as ``stiefel(frame_rate, frames=frames)``,
      or a ready ``optax.GradientTransformation``, which keeps its own rate (a
      ``UserWarning`` when ``learning_rate`` is a schedule) and its own frames: ``frames`` is not passed on to it, and ``init`` raises a ValueError
      where ``frames`` reads a frame parameter otherwise than ``frames=None`` does.
    labels: a tree of ``"stiefel"`` / ``"adamw"`` labels matching the params, a
      callable ``params -> labels``, or ``None`` (default: the query/key weights
      found by :func:`stiefax.layouts.qk_labels`; a single array is one frame
      parameter; see :func:`stiefax.labels.resolve_labels`).
    frames: how each frame parameter is viewed as frames (default
      :func:`stiefax.layouts.qk_frames`, which reads each layout from its name; Dense
      layouts need ``qk_frames(head_dim=...)``). It also decides which entries of a
      partly selected parameter AdamW trains.
    stiefel_learning_rate: the frames' rate at the peak of ``learning_rate``
      (default 1.0); a float or an Optax schedule, multiplied by the rule above.
    peak_learning_rate: the value of ``learning_rate`` at which the frames run at
      ``stiefel_learning_rate`` (default: ``learning_rate`` when it is a number;
      required for a schedule or an array).
    mask: which non-frame parameters AdamW decays, as ``optax.adamw(mask=...)``
      takes it: a tree of bools like the params, or a callable ``params -> tree``.
      ``None`` (default) is :func:`stiefax.layouts.decay_mask`, tensors of rank >= 2,
      so embeddings are decayed and norm scales and biases are not; decaying every
      one is ``mask=lambda p: jax.tree.map(lambda _: True, p)``. (The default is not
      the callable itself because ``optax.inject_hyperparams`` would take a callable
      argument for a schedule; give a callable mask there through ``static_args``,
      as for ``optax.adamw``.) Frames are never decayed.
    nesterov: AdamW's Nesterov momentum, as ``optax.adamw(nesterov=...)``.

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  _checks.check_hyperparams(
    "stiefel_adamw",
    learning_rate=learning_rate,
    weight_decay=weight_decay,
    b1=b1,
    b2=b2,
    eps=eps,
  )
  if not isinstance(nesterov, bool):
    raise ValueError(f"stiefax.stiefel_adamw: nesterov must be a bool, got {nesterov!r}.")
  reading = _read_frames(frames)
  if isinstance(stiefel, optax.GradientTransformation):
    if stiefel_learning_rate is not None or peak_learning_rate is not None:
      raise ValueError(
        "stiefax.stiefel_adamw: stiefel_learning_rate and peak_learning_rate set the"
        " rate of the frame transform that stiefel_adamw builds, but stiefel= is a"
        " ready transform with its own rate. Pass a factory instead, e.g."
        " stiefel=stiefax.manifold_muon, stiefel_learning_rate=0.05."
      )
    if callable(learning_rate):
      warnings.warn(_READY_WITH_SCHEDULE, UserWarning, stacklevel=2)
    stiefel = reading.ready(stiefel)
  else:
    rate = _frame_rate(learning_rate, stiefel_learning_rate, peak_learning_rate)
    if stiefel is None:
      stiefel = riemannian_adam(rate, frames=reading.rule)
    elif callable(stiefel):
      stiefel = stiefel(rate, frames=reading.rule)
    else:
      raise TypeError(
        "stiefax.stiefel_adamw: stiefel= must be None, an optax.GradientTransformation"
        f" or a factory (learning_rate, frames=...) -> transform; got {stiefel!r}."
      )

  def euclidean() -> optax.GradientTransformation:
    return optax.adamw(
      learning_rate,
      b1=b1,
      b2=b2,
      eps=eps,
      weight_decay=weight_decay,
      mask=decay_mask if mask is None else _checked_mask(mask),
      nesterov=nesterov,
    )

  inner = optax.partition(
    {
      STIEFEL_LABEL: _frames_and_rest(stiefel, euclidean(), reading.rest),
      EUCLIDEAN_LABEL: euclidean(),
    },
    checked_labels(labels, "stiefel_adamw"),
  )

  def init_fn(params: optax.Params) -> optax.OptState:
    if not jax.tree.leaves(params):
      raise ValueError(
        "stiefax.stiefel_adamw: init was given no parameters (an empty tree); pass the"
        " model's parameters, with its query/key frames."
      )
    with _checks.called_as("stiefel_adamw"):
      return inner.init(params)

  def update_fn(
    updates: optax.Updates,
    state: optax.OptState,
    params: Optional[optax.Params] = None,
    **extra_args: Any,
  ) -> tuple[optax.Updates, optax.OptState]:
    if params is not None:
      _checks.check_shapes("stiefel_adamw", updates, params)
    updates, state = inner.update(updates, state, params, **extra_args)
    if params is not None:  # integer and other non-float parameters are left unchanged
      updates = jax.tree.map(_zero_unless_float, updates, params, is_leaf=_is_none)
    return updates, state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _is_none(x: Any) -> bool:
  return x is None


def _zero_unless_float(update: Any, param: Any) -> Any:
  """``update``, or zeros where ``param`` is not a float (a step counter, a mask)."""
  if update is None or jnp.issubdtype(jnp.result_type(param), jnp.inexact):
    return update
  return jnp.zeros(jnp.shape(update), jnp.result_type(param))


def _checked_mask(mask: Any) -> Any:
  """``mask`` of :func:`stiefel_adamw`; a callable one is checked when called: a tree
  that is not a prefix of the params AdamW is given is a ValueError naming ``mask``."""
  if not callable(mask):
    return mask

  def checked(params: optax.Params) -> Any:
    tree = mask(params)
    try:
      jax.tree.map(lambda _m, _p: None, tree, params)
    except (ValueError, TypeError):
      raise ValueError(
        "stiefax.stiefel_adamw: mask= returned a tree of structure"
        f" {jax.tree.structure(tree)}, but it must have the structure of the params it"
        f" is given, {jax.tree.structure(params)} (frames appear as empty MaskedNode"
        " entries; e.g. mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))."
      ) from None
    return tree

  return checked
