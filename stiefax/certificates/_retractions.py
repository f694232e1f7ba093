"""Beyond the paper: the QR and Cayley retractions of :func:`stiefax.retract`.

Each certificate reads its retraction from the table
:data:`stiefax.geometry.RETRACTION_TABLE` by name and compares it with the polar row;
its control (a retraction that must fail) is its own.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from stiefax import _geometry as geometry
from stiefax.certificates._core import Certificate
from stiefax.certificates._core import certificate
from stiefax.certificates._core import certify
from stiefax.certificates._problems import D
from stiefax.certificates._problems import H
from stiefax.certificates._problems import R
from stiefax.certificates._problems import haar
from stiefax.certificates._problems import mT
from stiefax.certificates._problems import norm
from stiefax.certificates._problems import project
from stiefax.certificates._problems import seeded_rng


def _curve(name: str, w: jax.Array, xi: jax.Array) -> Callable[[jax.Array], jax.Array]:
  """``t -> R_W(t xi)`` for the row ``name`` of the retraction table."""
  retract = geometry.retraction_by_name(name).retract

  def curve(t: jax.Array) -> jax.Array:
    eta = t * xi
    return retract(w, eta, method="auto", step_bound=None, sq_norm=geometry.frame_sq_norm(eta))

  return curve


@functools.partial(jax.jit, static_argnames="name")
def _jet(name: str, w: jax.Array, xi: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``R_W(0)`` and ``d/dt R_W(t xi)`` at 0 (forward mode)."""
  zero, one = jnp.zeros([], w.dtype), jnp.ones([], w.dtype)
  return jax.jvp(_curve(name, w, xi), (zero,), (one,))


@functools.partial(jax.jit, static_argnames="name")
def _retracted(name: str, w: jax.Array, xi: jax.Array) -> jax.Array:
  """``R_W(xi)`` for the row ``name`` of the retraction table."""
  return _curve(name, w, xi)(jnp.ones([], w.dtype))


@jax.jit
def _uncorrected_cayley_jet(w: jax.Array, xi: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Cayley with Wen and Yin's generator ``xi W^T - W xi^T`` (no ``P``): ``R'(0) != xi``."""

  def curve(t: jax.Array) -> jax.Array:
    om = t * (xi @ jnp.swapaxes(w, -1, -2) - w @ jnp.swapaxes(xi, -1, -2))
    eye = jnp.broadcast_to(jnp.eye(w.shape[-2], dtype=w.dtype), om.shape)
    return jnp.linalg.solve(eye - om / 2, (eye + om / 2) @ w)

  return jax.jvp(curve, (jnp.zeros([], w.dtype),), (jnp.ones([], w.dtype),))


def _retraction_statistic(seed: int, salt: int, name: str, control: bool) -> float:
  """Isometry after steps of norm ``1e-3 ... 10`` and the first-order jet vs polar."""
  rng = seeded_rng(seed, salt)
  w = haar(rng, (H, D, R))
  xi = project(rng.standard_normal(w.shape), w)
  xi = xi / norm(xi)[:, None, None]
  wj, xij = jnp.asarray(w), jnp.asarray(xi)
  if control:
    if name == "qr":  # QR without the sign fix (LAPACK's Householder signs)
      q, _ = np.linalg.qr(w)
      return float(np.max(np.abs(q - w)))
    at0, deriv = _uncorrected_cayley_jet(wj, xij)
    return float(jnp.maximum(jnp.max(jnp.abs(at0 - wj)), jnp.max(jnp.abs(deriv - xij))))
  polar_at0, polar_deriv = _jet("polar", wj, xij)
  at0, deriv = _jet(name, wj, xij)
  worst = max(
    float(jnp.max(jnp.abs(at0 - polar_at0))), float(jnp.max(jnp.abs(deriv - polar_deriv)))
  )
  for c in (1e-3, 1e-1, 1.0, 10.0):
    new = np.asarray(_retracted(name, wj, c * xij))
    worst = max(worst, float(np.max(np.abs(mT(new) @ new - np.eye(R)))))
  return worst


@certificate("retraction")
def qr_retraction(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The sign-fixed QR retraction lands on ``St(d, r)`` and agrees with polar to O(t^2).

  :func:`stiefax.geometry.qr_retract`: residual the largest of
  ``max|R^T R - I|`` after tangent steps of norm ``1e-3 ... 10`` and, by forward-mode
  differentiation, ``|qf(W) - polar(W)|`` and ``|d/dt qf(W + t xi) - d/dt polar(W + t
  xi)|`` at ``t = 0`` (equal value and first derivative: the two retractions differ by
  ``O(t^2)``). Control: QR without the sign fix (LAPACK's Householder signs), which
  does not even return ``W`` at ``t = 0``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.qr_retraction()
    >>> c.proposition, c.passed
    ('retraction', True)

  Args:
    seed: the random draw.
    vacuous: certify the unfixed QR.

  Returns:
    A :class:`Certificate`.
  """
  return certify(lambda control: _retraction_statistic(seed, 33, "qr", control), vacuous)


@certificate("retraction")
def cayley_retraction(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The Cayley retraction lands on ``St(d, r)`` and agrees with polar to O(t^2).

  :func:`stiefax.geometry.cayley_retract` with ``Omega = P xi W^T - W xi^T P``: as
  :func:`qr_retraction`. Control: Wen and Yin's generator ``xi W^T - W xi^T`` without
  ``P = I - W W^T / 2``, whose curve has derivative ``xi + W (W^T xi) != xi``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.cayley_retraction()
    >>> c.proposition, c.passed
    ('retraction', True)

  Args:
    seed: the random draw.
    vacuous: certify the uncorrected generator.

  Returns:
    A :class:`Certificate`.
  """
  return certify(lambda control: _retraction_statistic(seed, 34, "cayley", control), vacuous)
