"""Proposition 6: ``sigma_min(W + eta) >= 1``; the rotation bound ``arctan(tau sqrt(r))``."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from stiefax.certificates._core import Certificate
from stiefax.certificates._core import certificate
from stiefax.certificates._core import certify
from stiefax.certificates._optimizers import adam_tx
from stiefax.certificates._optimizers import retract_tx
from stiefax.certificates._problems import TAU
from stiefax.certificates._problems import D
from stiefax.certificates._problems import H
from stiefax.certificates._problems import R
from stiefax.certificates._problems import as_kernel
from stiefax.certificates._problems import haar
from stiefax.certificates._problems import max_angle
from stiefax.certificates._problems import mT
from stiefax.certificates._problems import norm
from stiefax.certificates._problems import one_update
from stiefax.certificates._problems import polar
from stiefax.certificates._problems import principal_tangents
from stiefax.certificates._problems import project
from stiefax.certificates._problems import seeded_rng
from stiefax.certificates._problems import skew
from stiefax.certificates._problems import sym


def _steps(seed: int, salt: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
  """A point and tangent steps of Frobenius norm 1e-3 ... 1e3 (plus a rank-1 step)."""
  rng = seeded_rng(seed, salt)
  w = haar(rng, (H, D, R))
  g = rng.standard_normal(w.shape)
  xi = project(g, w)
  unit = xi / norm(xi)[:, None, None]
  steps = [s * unit for s in (1e-3, 1e-1, 1.0, 10.0, 1e3)]
  u = project(rng.standard_normal(w.shape), w, "grassmann")[..., :1]  # horizontal
  v = rng.standard_normal((H, 1, R))
  rank1 = u @ v
  steps.append(3.0 * rank1 / norm(rank1)[:, None, None])
  return w, g, steps


@certificate("6(i)")
def sigma_min_tangent(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``sigma_min(W + eta) >= 1`` for every tangent step, capped or not (Proposition 6(i)).

  Tangent steps ``eta = Pi_W g`` (shipped ``stiefel_project``) rescaled to norms
  ``1e-3 ... 1e3``, plus a rank-1 step; residual ``max(0, 1 - sigma_min)``. Control:
  the normal part ``-s W sym(W^T g)`` of the same gradient (what the projection
  removes), scaled to halve the largest singular direction.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.sigma_min_tangent()
    >>> c.proposition, c.passed
    ('6(i)', True)

  Args:
    seed: the random draw.
    vacuous: use the normal step in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    w, g, steps = _steps(seed, 11)
    if control:
      s = sym(mT(w) @ g)
      top = np.max(np.linalg.eigvalsh(s), axis=-1)[:, None, None]
      steps = [-0.5 * w @ s / top]
    worst = 0.0
    for eta in steps:
      sig = np.linalg.svd(w + eta, compute_uv=False)
      worst = max(worst, float(np.max(1.0 - sig[..., -1])))
    return max(worst, 0.0)

  return certify(measure, vacuous)


@certificate("6(i)")
def gram_identity(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``(W + eta)^T (W + eta) = I + eta^T eta`` for tangent ``eta`` (proof of Prop. 6(i)).

  Residual ``max|(W + eta)^T (W + eta) - I - eta^T eta| / (1 + ||eta||^2)`` over the
  steps of :func:`sigma_min_tangent`. Control: the un-projected gradient step.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.gram_identity()
    >>> c.proposition, c.passed
    ('6(i)', True)

  Args:
    seed: the random draw.
    vacuous: use the un-projected step in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    w, g, steps = _steps(seed, 12)
    if control:
      steps = [g / norm(g)[:, None, None]]
    worst = 0.0
    for eta in steps:
      a = w + eta
      lhs = mT(a) @ a - np.eye(R) - mT(eta) @ eta
      worst = max(worst, float(np.max(np.abs(lhs) / (1.0 + norm(eta)[:, None, None] ** 2))))
    return worst

  return certify(measure, vacuous)


@certificate("6(ii)")
def angle_bound(
  seed: int = 0, *, max_norm: Optional[float] = TAU, vacuous: bool = False
) -> Certificate:
  """One capped Riemannian Adam step rotates a frame by at most ``arctan(tau sqrt(r))``.

  ``stiefax.riemannian_adam(1.0, max_norm=tau)`` (``tau = 0.1``) from random and
  worst-case rank-1 gradients at scales ``1e-4 ... 1e4``; the largest principal angle
  between ``col(W)`` and ``col(W_new)``; residual ``max(0, angle - arctan(tau
  sqrt(r)))`` in radians (Proposition 6(ii)). Control: the uncapped step of the same
  gradients (``max_norm=None``), which rotates by up to 45 degrees at ``eta = 1``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.angle_bound()
    >>> c.proposition, c.passed
    ('6(ii)', True)

  Args:
    seed: the random draw.
    max_norm: the cap of the update under test (``None``: uncapped, which fails); the
      bound is always ``arctan(0.1 sqrt(r))``.
    vacuous: certify the uncapped step.

  Returns:
    A :class:`Certificate`.
  """
  bound = math.atan(TAU * math.sqrt(R))

  def measure(control: bool) -> float:
    rng = seeded_rng(seed, 13)
    w = haar(rng, (H, D, R))
    horizontal = project(rng.standard_normal(w.shape), w, "grassmann")
    grads = [rng.standard_normal(w.shape), horizontal[..., :1] @ rng.standard_normal((H, 1, R))]
    tx = adam_tx(1.0, max_norm=None if control else max_norm)
    worst = 0.0
    for g in grads:
      for c in (1e-4, 1.0, 1e4):
        new = w + one_update(tx, as_kernel(c * g), as_kernel(w))
        worst = max(worst, max_angle(w, new))
    return max(worst - bound, 0.0)

  return certify(measure, vacuous)


@certificate("6(ii)")
def angle_tangents(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``tan theta_i = sigma_i(K (I + Omega)^{-1})`` for ``eta = W Omega + W_perp K``.

  The identity behind Proposition 6(ii): the tangents of the principal angles between
  ``col(W)`` and ``col(W + eta)`` (computed from the shipped ``polar``) are the
  singular values of ``K (I + Omega)^{-1}``; residual relative to the largest.
  Control: ``sigma_i(K)``, dropping ``(I + Omega)^{-1}``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.angle_tangents()
    >>> c.proposition, c.passed
    ('6(ii)', True)

  Args:
    seed: the random draw.
    vacuous: compare with ``sigma_i(K)`` in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    rng = seeded_rng(seed, 14)
    full = haar(rng, (H, D, D))
    w, w_perp = full[..., :R], full[..., R:]
    omega = skew(rng.standard_normal((H, R, R)))
    k = 0.3 * rng.standard_normal((H, D - R, R))
    eta = w @ omega + w_perp @ k
    u = polar(w + eta)
    measured = np.sort(principal_tangents(w, u), axis=-1)
    m = k if control else k @ np.linalg.inv(np.eye(R) + omega)
    expected = np.sort(np.linalg.svd(m, compute_uv=False), axis=-1)
    return np.max(np.abs(measured - expected)) / np.max(expected)

  return certify(measure, vacuous)


@certificate("6(i)")
def retraction_isometry(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``stiefax.polar_retract`` lands on ``St(d, r)`` for every tangent step (Prop. 6(i)).

  Since ``sigma_min(W + eta) >= 1`` the polar factor is unique and well conditioned,
  so the shipped matrix-product retraction (``method="auto"``) is exact to float64
  rounding for steps of norm ``1e-3 ... 1e3``; residual ``max|W_new^T W_new - I|``.
  Control: ``W + eta`` without the retraction.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.retraction_isometry()
    >>> c.proposition, c.passed
    ('6(i)', True)

  Args:
    seed: the random draw.
    vacuous: skip the retraction in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    w, _, steps = _steps(seed, 15)
    tx = retract_tx()
    worst = 0.0
    for eta in steps[:4]:
      new = w + eta if control else w + one_update(tx, as_kernel(eta), as_kernel(w))
      gram = mT(new) @ new
      worst = max(worst, float(np.max(np.abs(gram - np.eye(R)))))
    return worst

  return certify(measure, vacuous)
