"""Proposition 1: gauge directions carry no gradient; the gauge is the joint ``O(r)``."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from stiefax.certificates._core import Certificate
from stiefax.certificates._core import certificate
from stiefax.certificates._core import certify
from stiefax.certificates._problems import D
from stiefax.certificates._problems import H
from stiefax.certificates._problems import R
from stiefax.certificates._problems import as_frames
from stiefax.certificates._problems import as_kernel
from stiefax.certificates._problems import attention_grad
from stiefax.certificates._problems import attention_jvp
from stiefax.certificates._problems import attention_problem
from stiefax.certificates._problems import gauge_content_jit
from stiefax.certificates._problems import haar
from stiefax.certificates._problems import scores_jit
from stiefax.certificates._problems import skew


@certificate("1")
def joint_action_invariance(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The joint action ``(W_Q R, W_K R)``, ``R`` in ``O(r)``, leaves the scores unchanged.

  Attention scores ``S = (X W_Q)(X W_K)^T / sqrt(r)`` per head; residual
  ``max|S(W_Q R, W_K R) - S| / max|S|`` with one random ``R`` per head (Proposition 1:
  the joint ``O(r)`` is the gauge of attention). Control: the per-frame action
  ``(W_Q R, W_K)``, which is not a symmetry.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.joint_action_invariance()
    >>> c.proposition, c.passed
    ('1', True)

  Args:
    seed: the random draw.
    vacuous: apply the per-frame action in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> jax.Array:
    p, rng = attention_problem(seed)
    rot = as_kernel(haar(rng, (H, R, R)))  # (r, H, r): one R per head
    rotate = lambda w: jnp.einsum("dhr,rhs->dhs", w, rot)
    s0 = scores_jit(p.x, p.w_q, p.w_k)
    s1 = scores_jit(p.x, rotate(p.w_q), p.w_k if control else rotate(p.w_k))
    return jnp.max(jnp.abs(s1 - s0)) / jnp.max(jnp.abs(s0))

  return certify(measure, vacuous)


@certificate("1")
def joint_gauge_gradient(
  seed: int = 0, *, grads: Optional[tuple] = None, vacuous: bool = False
) -> Certificate:
  """A true gradient has no component along the joint gauge orbit (Proposition 1).

  Residual: the largest ``joint`` fraction of :func:`stiefax.diagnostics.gauge_content`
  over heads, for ``jax.grad`` of a multi-head attention loss of ``(W_Q, W_K)``.
  Control: a random Gaussian tensor pair in place of the gradient.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.joint_gauge_gradient()
    >>> c.proposition, c.passed
    ('1', True)

  Args:
    seed: the random draw.
    grads: ``(g_Q, g_K)`` to certify instead of the true gradient (``(D, H, R)``
      kernels), e.g. a random pair, which fails.
    vacuous: feed the control's random pair to the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> jax.Array:
    p, rng = attention_problem(seed)
    if control:
      g_q, g_k = (jnp.asarray(rng.standard_normal((D, H, R))) for _ in range(2))
    elif grads is not None:
      g_q, g_k = (jnp.asarray(g, jnp.float64) for g in grads)
    else:
      g_q, g_k = attention_grad(p.x, p.w_v, p.target, p.w_q, p.w_k)
    return jnp.max(gauge_content_jit(p.w_q, p.w_k, g_q, g_k).joint)

  return certify(measure, vacuous)


@certificate("1")
def gauge_orbit_derivative(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The loss is flat along the joint orbit: ``d/dt L(W_Q e^{t Omega}, W_K e^{t Omega}) = 0``.

  The proof of Proposition 1, by forward-mode differentiation: the directional
  derivative along ``(W_Q Omega, W_K Omega)`` (``Omega`` skew, one per head), relative
  to ``||grad L|| ||(W_Q Omega, W_K Omega)||``. Control: the per-frame direction
  ``(W_Q Omega, 0)``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.gauge_orbit_derivative()
    >>> c.proposition, c.passed
    ('1', True)

  Args:
    seed: the random draw.
    vacuous: differentiate along the per-frame direction in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> jax.Array:
    p, rng = attention_problem(seed)
    omega = skew(rng.standard_normal((H, R, R)))
    t_q = as_kernel(as_frames(p.w_q) @ omega)
    t_k = jnp.zeros_like(p.w_k) if control else as_kernel(as_frames(p.w_k) @ omega)
    deriv = attention_jvp(p.x, p.w_v, p.target, p.w_q, p.w_k, t_q, t_k)
    g_q, g_k = attention_grad(p.x, p.w_v, p.target, p.w_q, p.w_k)
    g_norm = jnp.sqrt(jnp.sum(g_q**2) + jnp.sum(g_k**2))
    t_norm = jnp.sqrt(jnp.sum(t_q**2) + jnp.sum(t_k**2))
    return jnp.abs(deriv) / (g_norm * t_norm)

  return certify(measure, vacuous)
