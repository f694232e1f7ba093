"""Beyond the paper: manifold Muon (:func:`stiefax.manifold_muon`)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.linalg
import scipy.optimize

from stiefax import _muon as muon
from stiefax.certificates._core import OPTIMUM_TOLERANCE
from stiefax.certificates._core import Certificate
from stiefax.certificates._core import certificate
from stiefax.certificates._core import certify
from stiefax.certificates._optimizers import cached_tx
from stiefax.certificates._problems import D
from stiefax.certificates._problems import H
from stiefax.certificates._problems import R
from stiefax.certificates._problems import as_kernel
from stiefax.certificates._problems import haar
from stiefax.certificates._problems import lift
from stiefax.certificates._problems import mT
from stiefax.certificates._problems import norm
from stiefax.certificates._problems import one_update
from stiefax.certificates._problems import project
from stiefax.certificates._problems import seeded_rng
from stiefax.certificates._problems import sym

MUON_LR = 0.1


@cached_tx
def _mmuon() -> optax.GradientTransformation:
  return muon.manifold_muon(MUON_LR)


def _muon_steps(seed: int, salt: int, control: bool) -> tuple[np.ndarray, np.ndarray]:
  """Frames and the tangent step of ``manifold_muon`` (lifted from its retracted update).

  ``control``: the Euclidean Muon step ``-lr msign(G)`` of ``optax.contrib.muon``.
  """
  rng = seeded_rng(seed, salt)
  w = haar(rng, (H, D, R))
  g = rng.standard_normal(w.shape)
  if control:
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    return w, -MUON_LR * (u @ vt)
  return w, lift(w, w + one_update(_mmuon(), as_kernel(g), as_kernel(w)))


@certificate("mMuon")
def mmuon_tangent(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The manifold Muon step is tangent: ``W^T eta + eta^T W = 0``.

  One update of ``stiefax.manifold_muon(0.1)`` from a fresh state; its polar
  retraction is undone exactly (a Lyapunov equation) and the residual is
  ``max|W^T eta + eta^T W| / lr``. Control: the Euclidean Muon step
  ``-lr msign(G)`` (``optax.contrib.muon``), which is not tangent.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.mmuon_tangent()
    >>> c.proposition, c.passed
    ('mMuon', True)

  Args:
    seed: the random draw.
    vacuous: certify the Euclidean Muon step.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    w, eta = _muon_steps(seed, 30, control)
    t = mT(w) @ eta
    return np.max(np.abs(t + mT(t))) / MUON_LR

  return certify(measure, vacuous)


@certificate("mMuon")
def mmuon_spectral_norm(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The manifold Muon step has spectral norm at most the rate: ``||eta||_2 <= lr``.

  Residual ``max(max_h ||eta_h||_2 / lr - 1, 0)`` for the lifted step of
  :func:`mmuon_tangent`, over gradients scaled by ``1e-4, 1, 1e4``. Control: the
  tangent gradient scaled to the Frobenius ball of the same radius scale,
  ``||eta||_F = lr sqrt(r)`` (the shape of the Riemannian Adam cap), whose spectral
  norm exceeds ``lr`` unless all its singular values are equal.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.mmuon_spectral_norm()
    >>> c.proposition, c.passed
    ('mMuon', True)

  Args:
    seed: the random draw.
    vacuous: certify the Frobenius-ball step.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    rng = seeded_rng(seed, 31)
    w = haar(rng, (H, D, R))
    worst = 0.0
    for scale in (1e-4, 1.0, 1e4):
      g = scale * rng.standard_normal(w.shape)
      if control:
        xi = project(g, w)
        eta = MUON_LR * math.sqrt(R) * xi / norm(xi)[:, None, None]
      else:
        eta = lift(w, w + one_update(_mmuon(), as_kernel(g), as_kernel(w)))
      worst = max(worst, float(np.max(np.linalg.norm(eta, 2, axis=(-2, -1)))) / MUON_LR - 1)
    return max(worst, 0.0)

  return certify(measure, vacuous)


def scipy_spectral_step(w: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, Any]:
  """``max tr(G^T A)`` s.t. ``||A||_2 <= 1``, ``A`` tangent, by scipy's SLSQP.

  Independent of the dual solver: ``A = W Omega + W_perp K`` (``Omega`` skew) spans
  the tangent space, and the spectral ball is the smooth equality
  ``A^T A + L L^T = I`` with a lower-triangular slack ``L``; exact Jacobians. The
  returned direction is divided by ``max(1, ||A||_2)`` so that it is feasible.

  Returns:
    ``(A, result)``: the direction and scipy's ``OptimizeResult``.
  """
  d, r = w.shape
  w_perp = scipy.linalg.null_space(w.T)
  directions: list[np.ndarray] = []
  for i, j in zip(*np.triu_indices(r, 1)):
    om = np.zeros((r, r))
    om[i, j], om[j, i] = 1.0, -1.0
    directions.append(w @ om)
  for row in range(d - r):
    for col in range(r):
      e = np.zeros((d - r, r))
      e[row, col] = 1.0
      directions.append(w_perp @ e)
  basis = np.stack(directions)
  tril = np.tril_indices(r)
  low_basis = np.zeros((len(tril[0]), r, r))
  low_basis[np.arange(len(tril[0])), tril[0], tril[1]] = 1.0
  na, iu = len(basis), np.triu_indices(r)
  lin = np.einsum("kdr,dr->k", basis, g / np.linalg.norm(g))

  def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.einsum("k,kdr->dr", x[:na], basis), np.einsum("k,krs->rs", x[na:], low_basis)

  def eq(x: np.ndarray) -> np.ndarray:
    a, low = split(x)
    return (a.T @ a + low @ low.T - np.eye(r))[iu]

  def eq_jac(x: np.ndarray) -> np.ndarray:
    a, low = split(x)
    ja = np.einsum("kdr,ds->krs", basis, a)
    jl = np.einsum("krs,ts->krt", low_basis, low)
    ja, jl = ja + mT(ja), jl + mT(jl)
    return np.concatenate([ja[:, iu[0], iu[1]], jl[:, iu[0], iu[1]]]).T

  xi = g - w @ sym(w.T @ g)
  a0 = 0.5 * xi / np.linalg.norm(xi, 2)
  x0 = np.concatenate(
    [
      np.linalg.lstsq(basis.reshape(na, -1).T, a0.ravel(), rcond=None)[0],
      np.linalg.cholesky(np.eye(r) - a0.T @ a0)[tril],
    ]
  )
  zeros = np.zeros(len(x0) - na)
  out = scipy.optimize.minimize(
    lambda x: -lin @ x[:na],
    x0,
    jac=lambda x: -np.concatenate([lin, zeros]),
    constraints=[{"type": "eq", "fun": eq, "jac": eq_jac}],
    method="SLSQP",
    options={"ftol": 1e-15, "maxiter": 1000},
  )
  a, _ = split(out.x)
  return a / max(1.0, float(np.linalg.norm(a, 2))), out


_direction_jit = jax.jit(muon.spectral_tangent_direction, static_argnames=("iterations",))


@certificate("mMuon", tolerance=OPTIMUM_TOLERANCE)
def mmuon_optimum(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The manifold Muon direction attains the optimum of its subproblem (to 1e-6).

  ``max tr(G^T A)`` subject to ``||A||_2 <= 1`` and ``W^T A + A^T W = 0``, solved by
  :func:`stiefax.muon.spectral_tangent_direction` (40 dual iterations from a cold
  start) and independently by scipy's SLSQP on a smooth reformulation
  (:func:`scipy_spectral_step`), for three frames of ``St(10, 3)``; residual: the
  largest relative objective difference ``|f - f_scipy| / f_scipy``, tolerance
  ``1e-6``. Control: the tangent gradient scaled into the spectral ball, which is
  feasible but not optimal.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.mmuon_optimum()
    >>> c.proposition, c.passed, c.tolerance
    ('mMuon', True, 1e-06)

  Args:
    seed: the random draw.
    vacuous: certify the scaled tangent gradient.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    rng = seeded_rng(seed, 32)
    w = haar(rng, (3, 10, 3))
    g = rng.standard_normal(w.shape)
    if control:
      xi = project(g, w)  # (H, d, r) frames through the shipped projector
      a = xi / np.linalg.norm(xi, 2, axis=(-2, -1))[:, None, None]
    else:
      a = np.asarray(_direction_jit(jnp.asarray(w), jnp.asarray(g), iterations=40).direction)
    worst = 0.0
    for h in range(len(w)):
      ref = float(np.sum(g[h] * scipy_spectral_step(w[h], g[h])[0]))
      worst = max(worst, abs(float(np.sum(g[h] * a[h])) - ref) / abs(ref))
    return worst

  return certify(measure, vacuous)
