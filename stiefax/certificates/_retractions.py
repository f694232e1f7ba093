"""Beyond the paper: the QR and Cayley retractions of :func:`stiefax.retract`."""

from __future__ import annotations

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


@jax.jit
def _retraction_jets(w: jax.Array, xi: jax.Array) -> list[tuple[jax.Array, jax.Array]]:
  """``R(0)`` and ``d/dt R(t xi)`` at 0 for polar, QR and Cayley (forward mode)."""
  fns = (
    lambda t: geometry.polar(w + t * xi),
    lambda t: geometry.qr_retract(w, t * xi),
    lambda t: geometry.cayley_retract(w, t * xi),
  )
  zero, one = jnp.zeros([], w.dtype), jnp.ones([], w.dtype)
  return [jax.jvp(f, (zero,), (one,)) for f in fns]


_qr_jit = jax.jit(geometry.qr_retract)
_cayley_jit = jax.jit(geometry.cayley_retract)


@jax.jit
def _uncorrected_cayley_jet(w: jax.Array, xi: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Cayley with Wen and Yin's generator ``xi W^T - W xi^T`` (no ``P``): ``R'(0) != xi``."""

  def curve(t: jax.Array) -> jax.Array:
    om = t * (xi @ jnp.swapaxes(w, -1, -2) - w @ jnp.swapaxes(xi, -1, -2))
    eye = jnp.broadcast_to(jnp.eye(w.shape[-2], dtype=w.dtype), om.shape)
    return jnp.linalg.solve(eye - om / 2, (eye + om / 2) @ w)

  return jax.jvp(curve, (jnp.zeros([], w.dtype),), (jnp.ones([], w.dtype),))


def _retraction_statistic(seed: int, salt: int, kind: str, control: bool) -> float:
  """Isometry after steps of norm ``1e-3 ... 10`` and the first-order jet vs polar."""
  rng = seeded_rng(seed, salt)
  w = haar(rng, (H, D, R))
  xi = project(rng.standard_normal(w.shape), w)
  xi = xi / norm(xi)[:, None, None]
  wj, xij = jnp.asarray(w), jnp.asarray(xi)
  if control:
    if kind == "qr":  # QR without the sign fix (LAPACK's Householder signs)
      q, _ = np.linalg.qr(w)
      return float(np.max(np.abs(q - w)))
    at0, deriv = _uncorrected_cayley_jet(wj, xij)
    return float(jnp.maximum(jnp.max(jnp.abs(at0 - wj)), jnp.max(jnp.abs(deriv - xij))))
  jets = _retraction_jets(wj, xij)
  polar_at0, polar_deriv = jets[0]
  at0, deriv = jets[1 if kind == "qr" else 2]
  worst = max(
    float(jnp.max(jnp.abs(at0 - polar_at0))), float(jnp.max(jnp.abs(deriv - polar_deriv)))
  )
  fn = _qr_jit if kind == "qr" else _cayley_jit
  for c in (1e-3, 1e-1, 1.0, 10.0):
    new = np.asarray(fn(wj, c * xij))
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
