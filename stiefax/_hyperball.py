"""Hyperball: a wrapper that holds each matrix, and its step, at a constant norm.

Wen, Dang, Lyu, Ma and Liang (2026), "Fantastic Pretraining Optimizers and Where to
Find Them II: Hyperball Optimization", replace weight decay by an explicit constraint.
Given the update direction ``u_t`` of any base optimizer (Adam's, Muon's), each matrix
``W`` keeps the Frobenius norm ``R`` it had at initialization and takes a step of
fixed length ``eta_t R``:

    W_{t+1} = R Normalize(W_t - eta_t R Normalize(u_t)),    Normalize(X) = X / ||X||_F

(the paper's Hyperball update, its section 2). The step is applied first and the norm
restored after; the base optimizer is not told about the sphere (no tangent projection,
no transport of its moments): the published form, against the Riemannian one of
:func:`stiefax.sphere.sphere_adam`.

This module holds the wrapper and the matrices it holds by default
(:func:`matrix_frames`, :func:`matrix_labels`, :func:`muon_dimension_numbers`); the
ready optimizers AdamH and MuonH are in ``stiefax._hyperball_alias``.
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional

import chex
import jax
import jax.numpy as jnp
import optax

from stiefax import _checks
from stiefax import _geometry as geometry
from stiefax import _routing
from stiefax._frames import FrameSpec
from stiefax._layouts import path_names
from stiefax._matrix import compute_dtype

__all__ = [
  "HYPERBALL_LABEL",
  "HyperballState",
  "hyperball",
  "matrix_frames",
  "matrix_labels",
  "muon_dimension_numbers",
]

#: The label of the matrices :func:`stiefax.adamh` and :func:`stiefax.muonh` hold on
#: their spheres.
HYPERBALL_LABEL = "hyperball"
#: The label of the parameters that :func:`matrix_labels` leaves to AdamW.
REST_LABEL = "adamw"

#: Gemma-style weights whose first axis fuses several matrices (keys and values;
#: queries, keys and values; the gate and the up projection): one sphere per slice.
_FUSED = frozenset({("kv_einsum", "w"), ("qkv_einsum", "w"), ("gating_einsum", "w")})
#: Weights whose last axis is the model width ``d`` and whose other axes are the heads
#: and head size it reads from: ``(H, r, d)``, the matrix ``(H r) x d``.
_OUTPUT = frozenset({("attn_vec_einsum", "w"), ("out", "kernel")})
#: The query weight of Gemma's layout ``(H, d, r)``: the matrix ``d x (H r)``.
_ROW_SECOND = frozenset({("q_einsum", "w")})
#: Names (any path component, case ignored) of the embeddings and output heads, which
#: :func:`matrix_labels` leaves to AdamW.
_EMBEDDING_WORDS = ("embed", "wte", "wpe", "lm_head")
# A leaf with one of these names is a bias or a norm's gain whatever its rank: linen's
# attention biases are (heads, head_dim).
_VECTOR_NAMES = ("bias", "scale")


def matrix_frames() -> Callable[[Any, Any], FrameSpec]:
  """Each matrix of a parameter tree as one frame: what ``frames=None`` means here.

  A ``frames=`` callable ``(path, leaf) -> FrameSpec`` whose frame is a whole matrix:
  a rank-2 leaf is one matrix; a leaf whose first axis fuses several matrices
  (Gemma's ``kv_einsum/w (2, K, d, r)``, ``qkv_einsum/w (3, H, d, r)``,
  ``gating_einsum/w (2, d, f)``) is one matrix per slice of that axis; any other leaf
  is one matrix whose rows are the model width (``q_einsum/w (H, d, r)``: ``d x (H r)``;
  ``attn_vec_einsum/w`` and linen's attention ``out/kernel`` ``(H, r, d)``:
  ``(H r) x d``; otherwise the first axis). The rows matter to Muon's direction
  (:func:`stiefax.muonh`), not to the norm. Give your own ``frames=`` for other layouts
  (layer-stacked weights: ``FrameSpec(row_axis=1, col_axes=(2,))`` keeps axis 0 apart).

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from stiefax.layouts import matrix_frames
    >>> path = (jax.tree_util.DictKey("kv_einsum"), jax.tree_util.DictKey("w"))
    >>> matrix_frames()(path, jnp.zeros((2, 4, 64, 16)))     # keys and values apart
    FrameSpec(row_axis=2, col_axes=(1, 3))

  Returns:
    A callable ``(path, leaf) -> FrameSpec``.
  """

  def frames(path: Any, leaf: Any) -> FrameSpec:
    ndim = jnp.ndim(leaf)
    names = path_names(path)
    key = tuple(names[-2:])
    if ndim <= 2:
      return FrameSpec(row_axis=0, col_axes=(-1,))
    if key in _FUSED:  # (F, ..., d, ...): axis 0 apart, rows at the width axis
      row = 2 if ndim == 4 else 1
      return FrameSpec(row_axis=row, col_axes=tuple(a for a in range(1, ndim) if a != row))
    if key in _OUTPUT:
      return FrameSpec(row_axis=ndim - 1, col_axes=tuple(range(ndim - 1)))
    if key in _ROW_SECOND:
      return FrameSpec(row_axis=1, col_axes=tuple(a for a in range(ndim) if a != 1))
    return FrameSpec(row_axis=0, col_axes=tuple(range(1, ndim)))

  return frames


def matrix_labels(params: optax.Params) -> Any:
  """:data:`HYPERBALL_LABEL` on the hidden matrices, ``"adamw"`` elsewhere.

  A hidden matrix is a leaf of rank >= 2, not named ``bias`` or ``scale``, none of
  whose path names contains ``embed``, ``wte``, ``wpe`` or ``lm_head`` (any case): the
  projections of attention and of the MLP. Embeddings, output heads, biases (linen's
  attention biases are ``(heads, head_dim)`` too), norm scales, other vectors and
  scalars stay with AdamW, as in the paper's AdamH and MuonH.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.labels import matrix_labels
    >>> matrix_labels({"embedder": {"input_embedding": jnp.zeros((256, 8))},
    ...                "mlp": {"linear": {"w": jnp.zeros((16, 8))},
    ...                        "scale": jnp.zeros(8)}})
    {'embedder': {'input_embedding': 'adamw'},
     'mlp': {'linear': {'w': 'hyperball'}, 'scale': 'adamw'}}

  Args:
    params: a parameter tree.

  Returns:
    A label tree with the structure of ``params``.
  """

  def label(path: Any, leaf: Any) -> str:
    names = [n.lower() for n in path_names(path)]
    embedding = any(w in n for n in names for w in _EMBEDDING_WORDS)
    vector = bool(names) and names[-1] in _VECTOR_NAMES
    hidden = jnp.ndim(leaf) >= 2 and not embedding and not vector
    return HYPERBALL_LABEL if hidden else REST_LABEL

  return jax.tree_util.tree_map_with_path(label, params)


class HyperballState(NamedTuple):
  """State of :func:`hyperball`.

  Attributes:
    count: steps taken (the schedule's argument).
    radius: ``R`` of every sphere: per leaf, one value per matrix (the frames' batch
      shape), float32 or wider.
    skipped: per leaf, one int32 count per matrix of the steps it skipped (a
      non-finite gradient or base direction, or a step that cannot be represented).
    base: the base transformation's state.
  """

  count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as optax's states do
  radius: Any
  skipped: Any
  base: Any


def _cd(dtype: Any) -> Any:
  return jnp.promote_types(compute_dtype(dtype), jnp.float32)


def _leaf_spec(frames: Any, path: Any, w: Any) -> FrameSpec:
  if jnp.ndim(w) < 2:
    raise ValueError(
      f"stiefax.hyperball holds matrices: the parameter at"
      f" {'/'.join(path_names(path)) or '<root>'} has shape {tuple(jnp.shape(w))}. Give"
      " vectors and scalars another optimizer (optax.partition, or stiefax.adamh and"
      " stiefax.muonh, which route them to AdamW)."
    )
  spec = matrix_frames()(path, w) if frames is None else frames
  if callable(spec) and not isinstance(spec, FrameSpec):
    spec = spec(path, w)
  if not isinstance(spec, FrameSpec):
    raise ValueError(
      f"stiefax.hyperball: frames gave {spec!r} for the parameter at"
      f" {'/'.join(path_names(path)) or '<root>'}; give a FrameSpec or a callable"
      " (path, leaf) -> FrameSpec."
    )
  return spec


def _norm(x: jax.Array, axes: tuple[int, ...]) -> jax.Array:
  return jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=True))


def _squeeze(x: jax.Array, axes: tuple[int, ...]) -> jax.Array:
  return jnp.squeeze(x, axis=axes) if axes else x


def hyperball(
  base: optax.GradientTransformation,
  learning_rate: optax.ScalarOrSchedule,
  *,
  radius: Optional[chex.Numeric] = None,
  frames: Any = None,
) -> optax.GradientTransformation:
  r"""The published Hyperball: any base direction, each matrix at a constant norm.

  With ``u_t`` the update ``base`` gives for the gradient, per matrix ``W``::

      W_{t+1} = R Normalize(W_t - eta_t R Normalize(u_t)),  Normalize(X) = X / ||X||_F

  (Wen et al. 2026, section 2: the Hyperball update). ``R`` is the matrix's Frobenius
  norm at ``init`` (or ``radius``), ``eta_t = learning_rate(t)``. The step before the
  renormalization has length ``eta_t R`` whatever the gradient's scale, so ``eta`` is
  a relative rate: a direction orthogonal to ``W`` turns it by ``arctan(eta)``. Weight
  decay has no place here (the norm is fixed); give ``base`` none. The sign of ``u``
  is Optax's: ``base`` gives the direction to descend along, as
  ``optax.scale_by_adam()`` and ``optax.contrib.scale_by_muon()`` do; its scale is
  irrelevant.

  Which entries form one matrix: ``frames=None`` is :func:`stiefax.layouts.matrix_frames`
  (a rank-2 leaf; fused Gemma weights one matrix per slice); a
  :class:`stiefax.FrameSpec` or a callable ``(path, leaf) -> FrameSpec`` holds each
  frame of the view at its own norm instead (``qk_frames()`` gives one sphere per
  attention head). Entries outside a spec's ``select`` get a zero update.

  Every leaf given must have rank >= 2: vectors (biases, norm scales) and scalars are
  refused, and embeddings are matrices like any other, so route what should not be on
  a sphere elsewhere with ``optax.partition``, or use :func:`stiefax.adamh` /
  :func:`stiefax.muonh`, which hold the hidden matrices
  (:func:`stiefax.labels.matrix_labels`) and train embeddings, vectors and scalars with
  AdamW.

  A matrix whose gradient or base direction is not finite, or whose step cannot be
  represented, keeps its point and counts the step in ``skipped``; the base sees a
  zero gradient for it (its state stays finite). A matrix whose direction is zero
  keeps its point. A matrix of norm 0 at ``init`` (with ``radius=None``) is refused in
  one line naming it: its sphere would have radius 0 and it could never move (a
  zero-initialised output projection wants ``radius=`` or another transform).

  Example:
    >>> import jax, jax.numpy as jnp, optax, stiefax
    >>> w = {"w": jax.random.normal(jax.random.key(0), (8, 4))}
    >>> tx = stiefax.hyperball(optax.scale_by_adam(), 0.1)
    >>> state = tx.init(w)
    >>> g = {"w": jax.random.normal(jax.random.key(1), (8, 4))}
    >>> u, state = tx.update(g, state, w)
    >>> w2 = optax.apply_updates(w, u)
    >>> bool(jnp.allclose(jnp.linalg.norm(w2["w"]), jnp.linalg.norm(w["w"])))
    True

  Args:
    base: an ``optax.GradientTransformation`` whose output is the update direction.
    learning_rate: ``eta``, a float or an Optax schedule of the step count.
    radius: ``None`` (each matrix keeps its norm at ``init``) or ``R`` of every matrix
      (a matrix is put on that sphere by its first step).
    frames: which entries form one matrix (see above).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``; its state is
    a :class:`HyperballState`.
  """
  _checks.check_hyperparams("hyperball", learning_rate=learning_rate, radius=radius)
  if not isinstance(base, optax.GradientTransformation):
    raise TypeError(
      f"stiefax.hyperball: base must be an optax.GradientTransformation (such as"
      f" optax.scale_by_adam()), got {type(base).__name__}."
    )

  def spec_and_axes(path: Any, w: Any) -> tuple[FrameSpec, tuple[int, ...]]:
    spec = _leaf_spec(frames, path, w)
    return spec, spec.frame_axes(jnp.shape(w))

  def init_fn(params: optax.Params) -> HyperballState:
    def leaf(path: Any, w: Any) -> tuple[jax.Array, jax.Array]:
      w = jnp.asarray(w)
      spec, axes = spec_and_axes(path, w)
      view = spec.view(w).astype(_cd(w.dtype))
      if radius is None:
        r = _squeeze(_norm(view, axes), axes)
        _checks.refuse_zero_norms(
          _checks.caller("stiefax.hyperball"),
          "the matrix at",
          path,
          r,
          "its sphere has radius 0",
          "initialise it nonzero, give radius=, or label it for another transform",
        )
      else:
        batch = tuple(n for i, n in enumerate(view.shape) if i not in axes)
        r = jnp.broadcast_to(jnp.asarray(radius, view.dtype), batch)
      return r, jnp.zeros(r.shape, jnp.int32)

    radii, skipped = _routing.per_leaf(leaf, 2, params)
    return HyperballState(jnp.zeros([], jnp.int32), radii, skipped, base.init(params))

  def update_fn(
    updates: optax.Updates, state: HyperballState, params: Optional[optax.Params] = None
  ) -> tuple[optax.Updates, HyperballState]:
    _checks.require_params("hyperball", params, updates)
    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
    ok = _checks.hyperparams_ok(learning_rate=lr)

    def finite_of(path: Any, g: jax.Array, w: jax.Array) -> jax.Array:
      spec, axes = spec_and_axes(path, w)
      return jnp.all(jnp.isfinite(spec.view(g)), axis=axes, keepdims=True)

    def clean(path: Any, g: jax.Array, w: jax.Array) -> jax.Array:
      spec, _ = spec_and_axes(path, w)
      fin = finite_of(path, g, w)
      view = spec.view(g)
      rest = spec.rest(g) if spec.select is not None else None
      return spec.from_view(jnp.where(fin, view, jnp.zeros_like(view)), g.shape, rest)

    finite = jax.tree_util.tree_map_with_path(finite_of, updates, params)
    grads = jax.tree_util.tree_map_with_path(clean, updates, params)
    directions, base_state = base.update(grads, state.base, params)

    def leaf(
      path: Any, u: jax.Array, w: jax.Array, r: jax.Array, fin: jax.Array, skipped: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
      spec, axes = spec_and_axes(path, w)
      cd = jnp.promote_types(_cd(w.dtype), r.dtype)
      wv, uv = spec.view(w).astype(cd), spec.view(u).astype(cd)
      rad = jnp.expand_dims(r.astype(cd), axes) if axes else r.astype(cd)
      u_norm = _norm(uv, axes)
      a = wv - jnp.asarray(lr, cd) * rad * geometry.safe_divide(uv, u_norm)
      new = rad * geometry.safe_divide(a, _norm(a, axes))
      delta = new - wv
      good = fin & jnp.isfinite(u_norm) & jnp.all(jnp.isfinite(delta), axis=axes, keepdims=True)
      if ok is not None:
        good = good & ok
      move = good & (u_norm > 0) & (jnp.asarray(lr, cd) != 0)  # eta = 0: exactly still
      delta = jnp.where(move, delta, jnp.zeros_like(delta))
      out = spec.from_view(delta.astype(u.dtype), u.shape)
      return out, skipped + _squeeze(~good, axes).astype(jnp.int32)

    out, skipped = _routing.per_leaf(
      leaf, 2, directions, params, state.radius, finite, state.skipped
    )
    return out, HyperballState(optax.safe_increment(state.count), state.radius, skipped, base_state)

  return optax.GradientTransformation(init_fn, update_fn)


def muon_dimension_numbers(frames: Any = None) -> Callable[[optax.Params], Any]:
  """Muon's ``weight_dimension_numbers`` for the matrices ``frames`` names.

  A callable ``params -> tree of optax.contrib.MuonDimensionNumbers`` (what
  ``optax.contrib.scale_by_muon(weight_dimension_numbers=...)`` takes): each frame's
  rows are Muon's reduction axis, its columns the output axes, every other axis a batch
  axis. ``frames=None`` is :func:`matrix_frames`, so Muon orthogonalizes the matrices
  :func:`stiefax.hyperball` holds at their norms.

  Example:
    >>> import jax.numpy as jnp
    >>> from stiefax.layouts import muon_dimension_numbers
    >>> muon_dimension_numbers()({"kv_einsum": {"w": jnp.zeros((2, 4, 64, 16))}})
    {'kv_einsum': {'w': MuonDimensionNumbers(reduction_axis=2, output_axis=(1, 3))}}

  Args:
    frames: which entries form one matrix (``None``: :func:`matrix_frames`).

  Returns:
    A callable ``params -> tree of optax.contrib.MuonDimensionNumbers``.
  """

  def dims(params: optax.Params) -> Any:
    def leaf(path: Any, w: Any) -> Any:
      spec = _leaf_spec(frames, path, w)
      if spec.split is not None or spec.select is not None:
        raise ValueError(
          f"stiefax.muonh: frames gave {spec} for the parameter at"
          f" {'/'.join(path_names(path)) or '<root>'}; Muon's matrices cannot split or"
          " select axes: give a FrameSpec with row_axis and col_axes only."
        )
      ndim = jnp.ndim(w)
      row, cols, _ = spec.axes(ndim)
      return optax.contrib.MuonDimensionNumbers(reduction_axis=row, output_axis=cols)

    return jax.tree_util.tree_map_with_path(leaf, params)

  return dims
