"""Proposition 7: ``O(d)``-equivariance (Table 9)."""

from __future__ import annotations

from typing import Any
from typing import NamedTuple
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stiefax import _diagnostics as diagnostics
from stiefax import _geometry as geometry
from stiefax import _projections
from stiefax import _transforms
from stiefax._frames import FrameSpec
from stiefax.certificates._core import Certificate
from stiefax.certificates._core import certificate
from stiefax.certificates._core import certify
from stiefax.certificates._optimizers import adam_tx
from stiefax.certificates._optimizers import cached_tx
from stiefax.certificates._optimizers import cap_tx
from stiefax.certificates._optimizers import euclidean_adam_tx
from stiefax.certificates._optimizers import sgd_tx
from stiefax.certificates._problems import TAU
from stiefax.certificates._problems import D
from stiefax.certificates._problems import H
from stiefax.certificates._problems import R
from stiefax.certificates._problems import as_kernel
from stiefax.certificates._problems import haar
from stiefax.certificates._problems import mT
from stiefax.certificates._problems import one_update
from stiefax.certificates._problems import polar
from stiefax.certificates._problems import project
from stiefax.certificates._problems import seeded_rng


class _ColumnMomentState(NamedTuple):
  steps: jax.Array  # int32 scalar: updates taken (for the bias correction).
  mu: Any  # the first moment, shaped like the params.
  nu: Any  # the second moment, summed over ``axis`` of each frame.


def _column_moment(b1: float, b2: float, eps: float, axis: int) -> optax.GradientTransformation:
  """Riemannian Adam moment with ``v`` summed over ``axis`` of each frame.

  ``axis=-2`` (sum over rows): one ``v`` per column, constant down each column, so the
  update is ``O(d)``-equivariant (Proposition 7). ``axis=-1``: one ``v`` per row,
  varying down the columns: not equivariant (the converse of Proposition 7).
  """
  spec = FrameSpec()

  def init_fn(params: jax.Array) -> _ColumnMomentState:
    frames = spec.to_frames(params)
    nu = jnp.zeros_like(jnp.sum(frames, axis=axis, keepdims=True))
    return _ColumnMomentState(jnp.zeros([], jnp.int32), jnp.zeros_like(params), nu)

  def update_fn(
    updates: jax.Array, state: _ColumnMomentState, params: Optional[jax.Array] = None
  ) -> tuple[jax.Array, _ColumnMomentState]:
    w, xi = spec.to_frames(params), spec.to_frames(updates)  # type: ignore[arg-type]  # update is always given params
    steps = optax.safe_increment(state.steps)
    m = geometry.stiefel_tangent(w, b1 * spec.to_frames(state.mu) + (1 - b1) * xi)
    v = b2 * state.nu + (1 - b2) * jnp.sum(jnp.square(xi), axis=axis, keepdims=True)
    m_hat = optax.tree_utils.tree_bias_correction(m, b1, steps)
    v_hat = optax.tree_utils.tree_bias_correction(v, b2, steps)
    step = geometry.stiefel_tangent(w, m_hat / (jnp.sqrt(v_hat) + eps))
    return (
      spec.from_frames(step, updates.shape),
      _ColumnMomentState(steps, spec.from_frames(m, updates.shape), v),
    )

  return optax.GradientTransformation(init_fn, update_fn)


@cached_tx
def _column_adam(axis: int, lr: float) -> optax.GradientTransformation:
  return optax.chain(
    _projections.stiefel_project(),
    _column_moment(0.9, 0.999, 1e-8, axis),
    optax.scale_by_learning_rate(lr),
    _projections.step_norm_cap(TAU),
    _transforms.polar_retract(),
  )


def _violation(tx: optax.GradientTransformation, seed: int) -> float:
  return float(diagnostics.equivariance_violation(tx, key=jax.random.key(seed)))


@certificate("7")
def scalar_moment_equivariance(
  seed: int = 0, *, tx: Optional[optax.GradientTransformation] = None, vacuous: bool = False
) -> Certificate:
  """The corrected Riemannian Adam is ``O(d)``-equivariant (Proposition 7, Table 9).

  :func:`stiefax.diagnostics.equivariance_violation` of ``stiefax.riemannian_adam(1.0)``
  (``d=24, r=6``, three heads, 15 steps, worst of 5 rotations). Control: the
  elementwise ("naive") Riemannian Adam, ``riemannian_adam(0.03, moment="elementwise")``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.scalar_moment_equivariance()
    >>> c.proposition, c.passed
    ('7', True)

  Args:
    seed: the random draw.
    tx: the transform to certify instead (e.g. the elementwise moment, which fails).
    vacuous: certify the elementwise moment.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    if control:
      return _violation(adam_tx(0.03, moment="elementwise"), seed)
    return _violation(adam_tx() if tx is None else tx, seed)

  return certify(measure, vacuous)


@certificate("7")
def per_column_equivariance(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """A per-column second moment is ``O(d)``-equivariant too (Proposition 7).

  Riemannian Adam whose ``v`` is one scalar per column of each frame (constant down
  the columns; ``xi -> xi D``). Control: one ``v`` per *row* (varying down the
  columns), which is not: the converse of Proposition 7.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.per_column_equivariance()
    >>> c.proposition, c.passed
    ('7', True)

  Args:
    seed: the random draw.
    vacuous: certify the per-row moment.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    return _violation(_column_adam(-1, 0.03) if control else _column_adam(-2, 1.0), seed)

  return certify(measure, vacuous)


@certificate("7")
def sgd_equivariance(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """Riemannian SGD (PA16) is ``O(d)``-equivariant (Proposition 7's ingredients).

  Control: Adam with zero decay (the "AdamW" row of Table 9), ``optax.adamw(1e-2,
  weight_decay=0)``, whose violation is of the order of ``W``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.sgd_equivariance()
    >>> c.proposition, c.passed
    ('7', True)

  Args:
    seed: the random draw.
    vacuous: certify Adam.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    return _violation(euclidean_adam_tx(1e-2) if control else sgd_tx(0.02), seed)

  return certify(measure, vacuous)


@certificate("7")
def equivariance_ingredients(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """Each ingredient commutes with ``W -> Q^T W`` (the proof of Proposition 7).

  For a random ``Q`` in ``O(d)``: ``Pi_{Q^T W}(Q^T g) = Q^T Pi_W g`` (shipped
  ``stiefel_project``), ``cap(Q^T eta) = Q^T cap(eta)`` (``step_norm_cap``),
  ``polar(Q^T A) = Q^T polar(A)`` (``geometry.polar``) and a per-column scaling
  ``(Q^T xi) D = Q^T (xi D)``; residual: the largest. Control: an entrywise scaling
  ``xi / sqrt(V)`` with ``V`` varying down the columns (the elementwise moment's form).

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.equivariance_ingredients()
    >>> c.proposition, c.passed
    ('7', True)

  Args:
    seed: the random draw.
    vacuous: use the entrywise scaling in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    rng = seeded_rng(seed, 16)
    w = haar(rng, (H, D, R))
    g = rng.standard_normal(w.shape)
    q = haar(rng, (D, D))
    rot = lambda x: mT(q)[None] @ x
    if control:
      v = rng.uniform(0.5, 2.0, (H, D, R))
      return np.max(np.abs(rot(g) / v - rot(g / v)))
    diffs = [
      project(rot(g), rot(w)) - rot(project(g, w)),
    ]
    cap = cap_tx()
    capped = lambda x: one_update(cap, as_kernel(x), as_kernel(w))
    diffs.append(capped(rot(g)) - rot(capped(g)))
    a = w + 0.5 * project(g, w)
    diffs.append(polar(rot(a)) - rot(polar(a)))
    scale = rng.uniform(0.5, 2.0, (H, 1, R))
    diffs.append(rot(g) * scale - rot(g * scale))
    return max(float(np.max(np.abs(x))) for x in diffs)

  return certify(measure, vacuous)
