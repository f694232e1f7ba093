"""Ready-made optimizers: chains of the transforms in :mod:`stiefax.transforms`."""

from __future__ import annotations

import math
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional
from typing import Union

import jax
import jax.numpy as jnp
import optax

from stiefax import geometry
from stiefax import transforms
from stiefax.flax import qk_frames
from stiefax.frames import FramesLike
from stiefax.frames import FrameSpec
from stiefax.frames import checked_frames
from stiefax.labels import EUCLIDEAN_LABEL
from stiefax.labels import STIEFEL_LABEL
from stiefax.labels import layout_of
from stiefax.labels import missing_frames_hint
from stiefax.labels import path_names
from stiefax.labels import resolve_labels

__all__ = ["MOMENTS", "FramesAndRestState", "riemannian_adam", "riemannian_sgd", "stiefel_adamw"]

#: Second-moment rules by name (``moment=`` of :func:`riemannian_adam`).
MOMENTS = ("scalar", "elementwise")

ScalarOrSchedule = Union[float, jax.Array, optax.Schedule]


def _projector(projector: str, frames: FramesLike) -> optax.GradientTransformation:
  transforms._check_projector(projector)
  return {
    "stiefel": transforms.stiefel_project,
    "grassmann": transforms.grassmann_project,
    "canonical": transforms.canonical_gradient,
  }[projector](frames)


def riemannian_adam(
  learning_rate: ScalarOrSchedule = 1.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  max_norm: Optional[float] = 0.1,
  *,
  projector: str = "stiefel",
  moment: str = "scalar",
  polar: str = "auto",
  retraction: str = "polar",
  frames: FramesLike = FrameSpec(),
  mu_dtype: Any = None,
  fused: bool = True,
  init_tol: Optional[float] = None,
) -> optax.GradientTransformation:
  r"""The corrected Riemannian Adam on ``St(d, r)`` (the paper's B2; section 3.2).

  Per frame ``W`` with Euclidean gradient ``g_t``::

      xi_t  = Pi_W(g_t)                                     # tangent projection, eq. (3)
      m_t   = Pi_W(b1 m_{t-1} + (1 - b1) xi_t)              # moment transport
      v_t   = b2 v_{t-1} + (1 - b2) ||xi_t||_F^2            # one scalar per frame
      eta_t = -lr * m_hat_t / (sqrt(v_hat_t) + eps)
      eta_t = eta_t * min(1, tau sqrt(r) / ||eta_t||_F)     # step cap, tau = max_norm
      W    <- polar(W + eta_t)                              # polar retraction
                                                            # (or QR / Cayley)

  It is steepest descent in the embedded metric (Proposition 2), degree zero in the
  gradient at ``eps = 0`` (Proposition 3(ii)), keeps ``sigma_min(W + eta) >= 1`` and
  rotates each frame by at most ``arctan(tau sqrt(r))`` (Proposition 6), and is
  ``O(d)``-equivariant (Proposition 7). The paper's arms:

  * B2: ``riemannian_adam()`` (image task) or ``riemannian_adam(eps=1e-3)`` (grokking).
  * Grassmann-projector R-Adam: ``riemannian_adam(projector="grassmann")``.
  * elementwise ablation: ``riemannian_adam(0.03, moment="elementwise")``.
  * B2m: ``riemannian_adam(1e-3, moment="elementwise", max_norm=None)``; B2m-can adds
    ``projector="canonical"``.
  * frozen: ``riemannian_adam(0.0)`` (frames keep their initial point exactly).

  With the scalar moment the transform is the chain
  ``projector -> scalar_moment -> scale_by_learning_rate -> step_norm_cap ->
  polar_retract`` of :mod:`stiefax.transforms`, with the chain's state, computed in
  one pass per frame (``fused=True``): the projection of the gradient and the
  transport of the first moment are linear in their argument, so both come from one
  product ``W^T [g | m_{t-1}]`` and one ``W [N_g | N_m]``
  (``xi = g - W N_g``, ``m_t = b1 m_{t-1} + (1 - b1) g - W N_m``; ``N_g = sym(W^T g)``
  for eq. (3)), the cap is a per-frame scalar on ``m_t``, and no intermediate step is
  rounded to the parameter dtype between transforms. The result equals the chain's to
  rounding (checked in float64 to 1e-11); ``fused=False`` returns the chain itself.

  Example:
    >>> import jax, jax.numpy as jnp, optax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (16, 2, 4))
    >>> tx = stiefax.riemannian_adam()
    >>> state = tx.init(w)
    >>> g = jax.random.normal(jax.random.key(1), w.shape)
    >>> updates, state = tx.update(g, state, w)
    >>> w = optax.apply_updates(w, updates)
    >>> bool(stiefax.diagnostics.isometry_error(w) < 1e-5)
    True

  Args:
    learning_rate: the Riemannian rate ``eta_R`` (a float or an Optax schedule).
    b1: first-moment decay.
    b2: second-moment decay.
    eps: added to ``sqrt(v_hat)``; choose it as the tangent-gradient scale below
      which frames should stop moving (Remark 5).
    max_norm: ``tau`` of the step cap ``||eta||_F <= tau sqrt(r)``; ``None`` drops
      the cap.
    projector: ``"stiefel"`` (eq. 3), ``"grassmann"`` (horizontal) or
      ``"canonical"`` (eq. 4).
    moment: ``"scalar"`` (one ``v`` per frame) or ``"elementwise"``.
    polar: the retraction's method, see :func:`stiefax.polar_retract`.
    retraction: ``"polar"`` (the paper's), ``"qr"`` or ``"cayley"``; see
      :func:`stiefax.retract`.
    frames: how each leaf is viewed as frames.
    mu_dtype: dtype of the first moment (default: the parameter's).
    fused: compute the scalar-moment update in one pass per frame (default), or
      return the literal ``optax.chain`` of the transforms (``False``; same state,
      same result to rounding). The elementwise moment always runs as the chain.
    init_tol: the largest ``max|W^T W - I|`` that ``init`` accepts (default
      ``max(1e-3, 4 eps)`` of each frame's dtype; see :func:`stiefax.polar_retract`).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  if moment not in MOMENTS:
    raise ValueError(f"Unknown moment {moment!r}; valid moments are {MOMENTS}.")
  moment_fn = transforms.scalar_moment if moment == "scalar" else transforms.elementwise_moment
  transport = "grassmann" if projector == "grassmann" else "stiefel"
  parts = [
    _projector(projector, frames),
    moment_fn(b1, b2, eps, frames, projector=transport, mu_dtype=mu_dtype),
    optax.scale_by_learning_rate(learning_rate),
  ]
  if max_norm is not None:
    parts.append(transforms.step_norm_cap(max_norm, frames))
  # A static cap bounds the singular values of W + eta (Proposition 6), which fixes the
  # Newton-Schulz iteration count; a traced or absent cap iterates to convergence.
  bound = float(max_norm) if isinstance(max_norm, (int, float)) else None
  parts.append(_retraction(frames, retraction, polar, bound, init_tol))
  chain = optax.chain(*parts)
  if not fused or moment != "scalar":
    return chain
  return _fused_scalar_adam(
    chain, parts[2], b1, b2, eps, max_norm, projector, polar, bound, frames, retraction
  )


def _retraction(
  frames, retraction, polar, bound=None, init_tol=None
) -> optax.GradientTransformation:
  transforms._check_retraction(retraction)
  name = "polar_retract" if retraction == "polar" else "retract"
  return transforms.retract(
    frames, retraction, polar, step_bound=bound, name=name, init_tol=init_tol
  )


def _fused_moment(w, g, m_prev, b1, projector, concat):
  """``xi = Pi(g)`` and ``m = Pi_W(b1 m_prev + (1 - b1) xi)`` from shared products.

  Every projector here has the form ``Pi(x) = x - W N(W^T x)`` with ``N`` linear
  (``sym`` for eq. (3), the identity for the horizontal projector, the transpose for
  the canonical gradient (eq. 4), whose output is already tangent and whose moment is
  transported with eq. (3)). So the products ``W^T [g | m_prev]`` give both ``N``
  arguments and ``W [N_g | b1 N_m + (1 - b1) N_g]`` gives ``xi`` and ``m``. With
  ``concat`` each pair is one matrix product; without, two (for frames viewed through a
  transpose, where XLA folds the transpose into separate products but must copy it
  into a concatenation).
  """
  r = w.shape[-1]
  mT, sym = geometry.mT, geometry.sym
  if concat:
    p = mT(w) @ jnp.concatenate([g, m_prev], axis=-1)
    a, b = p[..., :r], p[..., r:]
  else:
    a, b = mT(w) @ g, mT(w) @ m_prev
  n_g = {"stiefel": sym, "grassmann": lambda x: x, "canonical": mT}[projector](a)
  n_m = b if projector == "grassmann" else sym(b)
  n_mix = b1 * n_m + (1 - b1) * n_g
  if concat:
    q = w @ jnp.concatenate([n_g, n_mix], axis=-1)
    wn_g, wn_mix = q[..., :r], q[..., r:]
  else:
    wn_g, wn_mix = w @ n_g, w @ n_mix
  return g - wn_g, b1 * m_prev + (1 - b1) * g - wn_mix


def _fused_scalar_adam(
  chain, lr_tx, b1, b2, eps, max_norm, projector, polar, step_bound, frames, retraction
) -> optax.GradientTransformation:
  """:func:`riemannian_adam` with the scalar moment, one pass per frame (same state)."""

  def update_fn(updates, state, params=None):
    transforms._require_params("riemannian_adam", params)
    states = list(state)
    moment_state, retract_state = states[1], states[-1]
    count = optax.safe_increment(moment_state.count)
    # The learning rate (or schedule) acts through its own transform and state.
    ones = jax.tree.map(lambda w: jnp.ones([], geometry.compute_dtype(w.dtype)), params)
    neg_lr, states[2] = lr_tx.update(ones, states[2])

    def leaf(path, g, w, mu, nu, m_skipped, r_skipped, neg_lr):
      spec = checked_frames(frames, path, w)
      cd = jnp.promote_types(transforms._compute_dtype(g, w), nu.dtype)
      wf = spec.to_frames(w).astype(cd)
      m_prev = spec.to_frames(mu).astype(cd)
      xi, m = _fused_moment(
        wf,
        spec.to_frames(g).astype(cd),
        m_prev,
        b1,
        projector,
        concat=spec.is_contiguous(w.ndim),
      )
      sq_norm = geometry.frame_sq_norm(xi)
      finite = jnp.isfinite(sq_norm)
      m = jnp.where(transforms._expand(finite), m, m_prev)  # a skipped frame keeps m
      v = b2 * nu.astype(cd) + (1 - b2) * jnp.where(finite, sq_norm, 0)
      t = count.astype(cd)
      den = jnp.sqrt(v / (1 - jnp.asarray(b2, cd) ** t)) + eps
      ok = finite & (den > 0)  # v_hat = 0 (and eps = 0) is a zero step, not 0/0.
      coef = jnp.where(ok, 1 / ((1 - jnp.asarray(b1, cd) ** t) * jnp.where(ok, den, 1)), 0)
      coef = coef * neg_lr.astype(cd)  # eta = coef * m, before the cap
      m_sq = geometry.frame_sq_norm(m)
      if max_norm is not None:
        norm = jnp.abs(coef) * jnp.sqrt(m_sq)
        limit = jnp.asarray(max_norm, cd) * math.sqrt(wf.shape[-1])
        coef = coef * transforms._cap_factor(norm, limit)
      delta, eta_finite = transforms._retract_frames(
        wf,
        transforms._expand(coef) * m,
        polar,
        step_bound,
        sq_norm=coef * coef * m_sq,
        retraction=retraction,
      )
      return (
        spec.from_frames(delta, g.shape).astype(w.dtype),
        spec.from_frames(m, w.shape).astype(mu.dtype),
        jnp.where(finite, v, nu).astype(nu.dtype),
        m_skipped + (~finite).astype(jnp.int32),
        r_skipped + (~eta_finite).astype(jnp.int32),
      )

    out, mu, nu, m_skipped, r_skipped = transforms._per_leaf(
      leaf,
      5,
      updates,
      params,
      moment_state.mu,
      moment_state.nu,
      moment_state.skipped,
      retract_state.skipped,
      neg_lr,
    )
    states[1] = moment_state._replace(count=count, mu=mu, nu=nu, skipped=m_skipped)
    states[-1] = retract_state._replace(skipped=r_skipped)
    return out, tuple(states)

  return optax.GradientTransformation(chain.init, update_fn)


def riemannian_sgd(
  learning_rate: ScalarOrSchedule = 0.02,
  *,
  projector: str = "grassmann",
  polar: str = "auto",
  retraction: str = "polar",
  frames: FramesLike = FrameSpec(),
  init_tol: Optional[float] = None,
) -> optax.GradientTransformation:
  """Fixed-step Riemannian SGD on ``St(d, r)``: PA16 / B2-SGD (Bonnabel 2013).

  ``W <- polar(W - lr * Pi^h_W(g))`` with the Grassmann horizontal projector by
  default. The displacement is degree one in the gradient (Proposition 3(i)), so the
  frames barely move once gradients are small.

  Example:
    >>> import jax, optax, stiefax
    >>> w = stiefax.flax.orthonormal_init()(jax.random.key(0), (16, 4))
    >>> tx = stiefax.riemannian_sgd()
    >>> u, _ = tx.update(jax.random.normal(jax.random.key(1), w.shape), tx.init(w), w)
    >>> bool(stiefax.diagnostics.isometry_error(optax.apply_updates(w, u)) < 1e-5)
    True

  Args:
    learning_rate: the fixed step ``eta`` (a float or an Optax schedule).
    projector: ``"grassmann"`` (PA16), ``"stiefel"`` or ``"canonical"``.
    polar: the retraction's method, see :func:`stiefax.polar_retract`.
    retraction: ``"polar"``, ``"qr"`` or ``"cayley"``; see :func:`stiefax.retract`.
    frames: how each leaf is viewed as frames.
    init_tol: the largest ``max|W^T W - I|`` that ``init`` accepts (default
      ``max(1e-3, 4 eps)`` of each frame's dtype).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  return optax.chain(
    _projector(projector, frames),
    optax.scale_by_learning_rate(learning_rate),
    _retraction(frames, retraction, polar, init_tol=init_tol),
  )


def _decay_mask(params):
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def _top_keys(tree: Any) -> Optional[tuple[str, ...]]:
  keys = getattr(tree, "keys", None)
  return tuple(sorted(map(str, keys()))) if callable(keys) else None


def _structure_message(labels: Any, params: Any) -> str:
  """Why a label tree does not match the params, with the common case spelled out."""
  lk, pk = _top_keys(labels), _top_keys(params)
  if pk is not None and "params" in pk and (lk is None or "params" not in lk):
    hint = (
      " The params have a top 'params' level that the labels lack: build the labels"
      " from the tree you pass to tx.init (labels=stiefax.flax.qk_labels as a"
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
    f"stiefel_adamw: the label tree does not have the structure of the params"
    f" (top-level keys {lk} vs {pk}).{hint}"
  )


def _checked_labels(labels: Any) -> Callable[[Any], Any]:
  valid = {STIEFEL_LABEL, EUCLIDEAN_LABEL}

  def fn(params):
    tree = resolve_labels(params, labels)
    found = set(jax.tree.leaves(tree))
    if not found <= valid:
      raise ValueError(
        f"stiefel_adamw: the label tree holds {sorted(map(repr, found - valid))}, but"
        f" the only transforms are {sorted(valid)}. Label frame parameters"
        f" {STIEFEL_LABEL!r} and everything else {EUCLIDEAN_LABEL!r} (see"
        " stiefax.flax.qk_labels)."
      )
    n_params, n_labels = len(jax.tree.leaves(params)), len(jax.tree.leaves(tree))
    if n_params != n_labels:
      raise ValueError(
        f"stiefel_adamw: the label tree has {n_labels} leaves but the params have"
        f" {n_params}; give one label per parameter (the same tree structure)."
      )
    try:
      jax.tree.map(lambda *_: None, tree, params)
    except (ValueError, TypeError) as e:
      raise ValueError(_structure_message(tree, params)) from e
    if STIEFEL_LABEL not in found:
      raise ValueError(
        f"stiefel_adamw: no parameter is labelled {STIEFEL_LABEL!r}, so every"
        " parameter would train as plain AdamW (use optax.adamw for that); "
        + missing_frames_hint(params)
      )
    return tree

  return fn


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

  def specs(params):
    return [rest_spec(p, w) for p, w in jax.tree_util.tree_flatten_with_path(params)[0]]

  def rest_tree(tree, found):
    it = iter(found)

    def leaf(_, x):
      spec = next(it)
      return optax.MaskedNode() if spec is None else spec.rest(x)

    return jax.tree_util.tree_map_with_path(leaf, tree)

  def init_fn(params):
    found = specs(params)
    state = stiefel.init(params)
    if all(s is None for s in found):
      return state
    return FramesAndRestState(state, rest_tx.init(rest_tree(params, found)))

  def update_fn(updates, state, params=None):
    transforms._require_params("stiefel_adamw", params)
    found = specs(params)
    if all(s is None for s in found):
      return stiefel.update(updates, state, params)
    out, frames_state = stiefel.update(updates, state.frames, params)
    rest_u, rest_state = rest_tx.update(
      rest_tree(updates, found), state.rest, rest_tree(params, found)
    )
    it = iter(zip(found, _rest_leaves(rest_u, found)))

    def leaf(u):
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


def stiefel_adamw(
  learning_rate: ScalarOrSchedule,
  weight_decay: float = 1e-4,
  *,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  stiefel: Optional[optax.GradientTransformation] = None,
  labels: Any = None,
  frames: Optional[FramesLike] = None,
) -> optax.GradientTransformation:
  """One optimizer for a whole model: Stiefel frames plus AdamW for the rest.

  ``optax.partition`` (formerly ``optax.multi_transform``) of

  * ``"stiefel"``: ``stiefel`` (default :func:`riemannian_adam`, the paper's B2) on
    the labelled frames (by default the query/key weights found by
    :func:`stiefax.flax.qk_labels`, viewed as frames by
    :func:`stiefax.flax.qk_frames`);
  * ``"adamw"``: ``optax.adamw(learning_rate, b1, b2, eps, weight_decay)`` on every
    other parameter, with decay on tensors of rank >= 2 only.

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
    ...     model.init(jax.random.key(0), x), stiefax.flax.qk_labels)
    >>> tx = stiefax.stiefel_adamw(1e-3, weight_decay=0.05)
    >>> state = tx.init(params)
    >>> grads = jax.grad(lambda p: jnp.sum(model.apply(p, x) ** 2))(params)
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optax.apply_updates(params, updates)

  Args:
    learning_rate: AdamW's rate (a float or an Optax schedule).
    weight_decay: AdamW's decoupled decay for rank >= 2 non-frame tensors.
    b1: AdamW's first-moment decay.
    b2: AdamW's second-moment decay.
    eps: AdamW's epsilon.
    stiefel: the transform for the frames (default
      ``riemannian_adam(frames=frames)``). When you give it, give it the same
      ``frames``.
    labels: a tree of ``"stiefel"`` / ``"adamw"`` labels matching the params, a
      callable ``params -> labels``, or ``None`` (default: the query/key weights
      found by :func:`stiefax.flax.qk_labels`; a single array is one frame
      parameter; see :func:`stiefax.labels.resolve_labels`).
    frames: how each frame parameter is viewed as frames (default
      :func:`stiefax.flax.qk_frames`, which reads each layout from its name; Dense
      layouts need ``qk_frames(head_dim=...)``). It also decides which entries of a
      partly selected parameter AdamW trains.

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  named = qk_frames()
  if stiefel is None:
    stiefel = riemannian_adam(frames=named if frames is None else frames)

  def rest_spec(path, w):
    # Without frames= and with a custom stiefel, only the fused layouts known by name
    # are consulted (stiefel was given their FrameSpecs, or it would reject them).
    if frames is None:
      layout = layout_of(path_names(path))
      if layout is None or not layout.partial:
        return None
    spec = checked_frames(named if frames is None else frames, path, w)
    return None if spec.select is None else spec

  def euclidean():
    return optax.adamw(
      learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=_decay_mask
    )

  return optax.partition(
    {
      STIEFEL_LABEL: _frames_and_rest(stiefel, euclidean(), rest_spec),
      EUCLIDEAN_LABEL: euclidean(),
    },
    _checked_labels(labels),
  )
