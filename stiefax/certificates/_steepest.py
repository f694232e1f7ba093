"""Proposition 2: steepest descent in the embedded metric; the Grassmann split (eq. 12)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from stiefax.certificates._core import Certificate
from stiefax.certificates._core import certificate
from stiefax.certificates._core import certify
from stiefax.certificates._problems import as_frames
from stiefax.certificates._problems import attention_grad
from stiefax.certificates._problems import attention_problem
from stiefax.certificates._problems import gradient_at_point
from stiefax.certificates._problems import inner
from stiefax.certificates._problems import mT
from stiefax.certificates._problems import norm
from stiefax.certificates._problems import project
from stiefax.certificates._problems import retraction_derivatives
from stiefax.certificates._problems import seeded_rng
from stiefax.certificates._problems import skew


@certificate("2")
def tangent_projection(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``stiefax.stiefel_project`` is the orthogonal projection onto ``T_W St`` (eq. 3).

  Residual: the largest of ``|W^T xi + xi^T W|``, ``|Pi(xi) - xi|`` (idempotence) and
  ``|<xi, g - xi>|`` (orthogonality), relative to ``||g||``, for ``xi = Pi_W g``: the
  embedded-metric Riemannian gradient (Proposition 2). Control: the canonical gradient
  ``g - W g^T W`` in place of ``Pi_W``: tangent, but not the orthogonal projection.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.tangent_projection()
    >>> c.proposition, c.passed
    ('2', True)

  Args:
    seed: the random draw.
    vacuous: certify the canonical gradient instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    w, g = gradient_at_point(seed, 2)
    kind = "canonical" if control else "stiefel"
    xi = project(g, w, kind)
    again = project(xi, w, kind)
    s = mT(w) @ xi
    scale = norm(g)[:, None, None]
    tangency = np.max(np.abs(s + mT(s)) / scale)
    idempotence = np.max(np.abs(again - xi) / scale)
    orthogonality = np.max(np.abs(inner(xi, g - xi)) / norm(g) ** 2)
    return max(tangency, idempotence, orthogonality)

  return certify(measure, vacuous)


@certificate("2")
def riemannian_gradient(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``Pi_W g`` is the Riemannian gradient: ``d/dt f(polar(W + t xi)) = <Pi_W g, xi>``.

  For random tangent directions ``xi`` the derivative of the loss along the retraction
  curve (forward mode through ``stiefax.geometry.polar``) equals the embedded-metric
  inner product with ``Pi_W g`` (Proposition 2); residual relative to
  ``||Pi_W g|| ||xi||``. Control: the canonical gradient in place of ``Pi_W g``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.riemannian_gradient()
    >>> c.proposition, c.passed
    ('2', True)

  Args:
    seed: the random draw.
    vacuous: use the canonical gradient in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    p, rng = attention_problem(seed + 2)
    w = as_frames(p.w_q)
    g = as_frames(attention_grad(p.x, p.w_v, p.target, p.w_q, p.w_k)[0])
    grad = project(g, w, "canonical" if control else "stiefel")
    xis = np.stack([project(rng.standard_normal(w.shape), w) for _ in range(3)])
    derivs = np.asarray(
      retraction_derivatives(p.x, p.w_v, p.target, jnp.asarray(w), p.w_k, jnp.asarray(xis))
    )
    scale = np.linalg.norm(project(g, w)) * np.sqrt(np.sum(xis**2, axis=(1, 2, 3)))
    return np.max(np.abs(derivs - np.sum(grad[None] * xis, axis=(1, 2, 3))) / scale)

  return certify(measure, vacuous)


@certificate("2")
def steepest_descent(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``Pi_W g / ||Pi_W g||`` is the steepest unit tangent direction (Proposition 2).

  Residual: ``|<g, xi*> - ||Pi_W g||| / ||Pi_W g||`` for ``xi* = Pi_W g / ||Pi_W g||``
  plus how much any of 512 random unit tangent directions (and perturbations of
  ``xi*``) beats ``xi*``. Control: the Grassmann direction ``Pi^h_W g / ||Pi^h_W g||``
  (PA16), whose decrease falls short by ``1 - sqrt(1 - rho^2)`` (eq. 12; about 3% at
  the paper's ``rho = 0.24``).

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.steepest_descent()
    >>> c.proposition, c.passed
    ('2', True)

  Args:
    seed: the random draw.
    vacuous: certify the Grassmann direction instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    w, g = gradient_at_point(seed, 3)
    rng = seeded_rng(seed, 3)
    best = project(g, w, "grassmann" if control else "stiefel")
    best = best / norm(best)[:, None, None]
    xi_norm = norm(project(g, w))
    value = inner(g, best)
    identity = np.max(np.abs(value - xi_norm) / xi_norm)
    # 256 random unit tangents and 256 small perturbations of the candidate, projected
    # at once through the shipped transform (as one kernel of K * H frames).
    noise = rng.standard_normal((512,) + w.shape)
    noise[256:] = best[None] + 1e-3 * noise[256:]
    flat = noise.reshape((-1,) + w.shape[-2:])
    proj = project(flat, np.broadcast_to(w[None], noise.shape).reshape(flat.shape))
    proj = proj.reshape(noise.shape)
    proj = proj / norm(proj)[..., None, None]
    beat = np.max((inner(proj, g[None]) - value[None]) / xi_norm[None])
    return max(identity, max(beat, 0.0))

  return certify(measure, vacuous)


@certificate("2 (eq. 12)")
def grassmann_split(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``||Pi_W g||^2 = ||Pi^h_W g||^2 + ||Pi_{G_W} g||^2`` (Proposition 2, eq. 12).

  ``Pi^h_W g = (I - W W^T) g`` (shipped ``grassmann_project``), ``Pi_{G_W} g = W
  skew(W^T g)`` (the per-frame gauge block); residual relative to ``||Pi_W g||^2``.
  Control: the whole vertical block ``W W^T g`` (normal part included) in place of
  ``Pi_{G_W} g``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.grassmann_split()
    >>> c.proposition, c.passed
    ('2 (eq. 12)', True)

  Args:
    seed: the random draw.
    vacuous: use the whole vertical block in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    w, g = gradient_at_point(seed, 4)
    tangent = norm(project(g, w)) ** 2
    horizontal = norm(project(g, w, "grassmann")) ** 2
    vertical = w @ (mT(w) @ g) if control else w @ skew(mT(w) @ g)
    return np.max(np.abs(tangent - horizontal - norm(vertical) ** 2) / tangent)

  return certify(measure, vacuous)
