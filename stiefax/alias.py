"""Ready-made optimizers: chains of the transforms in :mod:`stiefax.transforms`."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import jax
import optax

from stiefax import transforms
from stiefax.frames import FrameSpec, FramesLike

__all__ = ["MOMENTS", "riemannian_adam", "riemannian_sgd", "stiefel_adamw"]

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
    frames: FramesLike = FrameSpec(),
    mu_dtype: Any = None,
) -> optax.GradientTransformation:
  r"""The corrected Riemannian Adam on ``St(d, r)`` (the paper's B2; section 3.2).

  Per frame ``W`` with Euclidean gradient ``g_t``::

      xi_t  = Pi_W(g_t)                                     # tangent projection, eq. (3)
      m_t   = Pi_W(b1 m_{t-1} + (1 - b1) xi_t)              # moment transport
      v_t   = b2 v_{t-1} + (1 - b2) ||xi_t||_F^2            # one scalar per frame
      eta_t = -lr * m_hat_t / (sqrt(v_hat_t) + eps)
      eta_t = eta_t * min(1, tau sqrt(r) / ||eta_t||_F)     # step cap, tau = max_norm
      W    <- polar(W + eta_t)                              # polar retraction

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
    frames: how each leaf is viewed as frames.
    mu_dtype: dtype of the first moment (default: the parameter's).

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
  parts.append(transforms.polar_retract(frames, polar, step_bound=bound))
  return optax.chain(*parts)


def riemannian_sgd(
    learning_rate: ScalarOrSchedule = 0.02,
    *,
    projector: str = "grassmann",
    polar: str = "auto",
    frames: FramesLike = FrameSpec(),
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
    frames: how each leaf is viewed as frames.

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  return optax.chain(
      _projector(projector, frames),
      optax.scale_by_learning_rate(learning_rate),
      transforms.polar_retract(frames, polar),
  )


STIEFEL_LABEL = "stiefel"
EUCLIDEAN_LABEL = "adamw"


def _decay_mask(params):
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def _checked_labels(labels: Any) -> Callable[[Any], Any]:
  valid = {STIEFEL_LABEL, EUCLIDEAN_LABEL}

  def fn(params):
    tree = labels(params) if callable(labels) else labels
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
    return tree

  return fn


def stiefel_adamw(
    learning_rate: ScalarOrSchedule,
    weight_decay: float = 1e-4,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    stiefel: Optional[optax.GradientTransformation] = None,
    labels: Any = None,
) -> optax.GradientTransformation:
  """One optimizer for a whole model: Stiefel frames plus AdamW for the rest.

  ``optax.partition`` (formerly ``optax.multi_transform``) of

  * ``"stiefel"``: ``stiefel`` (default :func:`riemannian_adam`, the paper's B2) on
    the labelled frames (by default the query/key kernels found by
    :func:`stiefax.flax.qk_labels`);
  * ``"adamw"``: ``optax.adamw(learning_rate, b1, b2, eps, weight_decay)`` on every
    other parameter, with decay on tensors of rank >= 2 only.

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
    stiefel: the transform for the frames (default ``riemannian_adam()``).
    labels: a tree of ``"stiefel"`` / ``"adamw"`` labels matching the params, or a
      callable ``params -> labels`` (default :func:`stiefax.flax.qk_labels`).

  Returns:
    An ``optax.GradientTransformation`` whose ``update`` needs ``params``.
  """
  if stiefel is None:
    stiefel = riemannian_adam()
  if labels is None:
    from stiefax.flax import qk_labels  # pylint: disable=g-import-not-at-top

    labels = qk_labels
  euclidean = optax.adamw(
      learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=_decay_mask
  )
  return optax.partition(
      {STIEFEL_LABEL: stiefel, EUCLIDEAN_LABEL: euclidean}, _checked_labels(labels)
  )
