"""Proposition 3: degree one and degree zero, and the Jensen bound of the remark after it.

Degree one: the fixed-step (Riemannian SGD) displacement; degree zero: the
scalar-moment Riemannian Adam at ``eps = 0``; the Jensen bound:
``||m_hat_t|| <= sqrt(v_hat_t)``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stiefax.certificates._core import Certificate
from stiefax.certificates._core import certificate
from stiefax.certificates._core import certify
from stiefax.certificates._optimizers import adam_tx
from stiefax.certificates._optimizers import moment_tx
from stiefax.certificates._optimizers import sgd_tx
from stiefax.certificates._problems import TAU
from stiefax.certificates._problems import D
from stiefax.certificates._problems import H
from stiefax.certificates._problems import R
from stiefax.certificates._problems import as_frames
from stiefax.certificates._problems import as_kernel
from stiefax.certificates._problems import gradient_at_point
from stiefax.certificates._problems import haar
from stiefax.certificates._problems import lift
from stiefax.certificates._problems import norm
from stiefax.certificates._problems import one_update
from stiefax.certificates._problems import project
from stiefax.certificates._problems import quadratic
from stiefax.certificates._problems import seeded_rng
from stiefax.certificates._problems import trajectory


def _first_step(tx: optax.GradientTransformation, w: np.ndarray, g: np.ndarray) -> np.ndarray:
  """The tangent step of the first update of ``tx``, lifted from its retraction."""
  return lift(w, w + one_update(tx, as_kernel(g), as_kernel(w)))


@certificate("3(i)")
def sgd_degree_one(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The fixed-step displacement is degree one: ``xi(c g) = c xi(g)`` (Proposition 3(i)).

  ``stiefax.riemannian_sgd(0.02)``; the tangent step is recovered from the retracted
  point (a Lyapunov equation, solved exactly); residual
  ``max_c ||xi(c g) - c xi(g)|| / ||c xi(g)||`` for ``c`` in ``{0.1, 10}``. Control: the
  scalar-moment Riemannian Adam (``eps = 0``, uncapped), which is degree zero.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.sgd_degree_one()
    >>> c.proposition, c.passed
    ('3(i)', True)

  Args:
    seed: the random draw.
    vacuous: certify the Riemannian Adam step instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    w, g = gradient_at_point(seed, 5)
    tx = adam_tx(0.02, eps=0.0, max_norm=None) if control else sgd_tx(0.02)
    base = _first_step(tx, w, g)
    worst = 0.0
    for c in (0.1, 10.0):
      scaled = _first_step(tx, w, c * g)
      worst = max(worst, np.max(norm(scaled - c * base) / norm(c * base)))
    return worst

  return certify(measure, vacuous)


@certificate("3(i)")
def sgd_step_norm(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``||xi_sgd||_F = eta ||Pi^h_W g||_F`` per frame (Proposition 3(i)).

  The lifted tangent step of ``stiefax.riemannian_sgd(0.02)`` (Grassmann projector);
  residual relative. Control: ``eta ||g||_F``, the ambient gradient norm.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.sgd_step_norm()
    >>> c.proposition, c.passed
    ('3(i)', True)

  Args:
    seed: the random draw.
    vacuous: compare with ``eta ||g||_F`` in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    w, g = gradient_at_point(seed, 6)
    lr = 0.02
    step = norm(_first_step(sgd_tx(lr), w, g))
    target = lr * (norm(g) if control else norm(project(g, w, "grassmann")))
    return np.max(np.abs(step - target) / target)

  return certify(measure, vacuous)


def _scale_free_residual(
  tx: optax.GradientTransformation, seed: int, salt: int, steps: int = 10
) -> float:
  """``max_c max|W_T(c g) - W_T(g)|`` over ``c`` in ``{1e-3, 1e3}``: trajectories."""
  a, w0, _ = quadratic(seed, salt)
  ref = trajectory(tx, w0, a, 1.0, 0.0, steps)
  return max(
    float(jnp.max(jnp.abs(trajectory(tx, w0, a, c, 0.0, steps) - ref))) for c in (1e-3, 1e3)
  )


@certificate("3(ii)")
def adam_degree_zero(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """Scaling every gradient by ``c`` leaves the Riemannian Adam iterates unchanged.

  ``stiefax.riemannian_adam(1.0, eps=0)`` (the cap binds) for 10 steps on
  ``f(W) = -tr(W^T A W)`` with gradients ``c * grad f``, ``c`` in ``{1e-3, 1e3}``;
  residual ``max|W_T(c) - W_T(1)|`` (Proposition 3(ii)). Control: ``eps = 1e-2``,
  above the tangent-gradient scale at ``c = 1e-3`` (Remark 5).

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.adam_degree_zero()
    >>> c.proposition, c.passed
    ('3(ii)', True)

  Args:
    seed: the random draw.
    vacuous: certify the ``eps = 1e-2`` update instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    return _scale_free_residual(adam_tx(1.0, eps=1e-2 if control else 0.0), seed, 7)

  return certify(measure, vacuous)


@certificate("3(ii)")
def adam_degree_zero_uncapped(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """Degree zero without the cap: ``riemannian_adam(0.05, eps=0, max_norm=None)``.

  As :func:`adam_degree_zero` with the step cap removed (Proposition 3(ii) does not
  need it). Control: ``stiefax.riemannian_sgd(0.05)``, which is degree one.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.adam_degree_zero_uncapped()
    >>> c.proposition, c.passed
    ('3(ii)', True)

  Args:
    seed: the random draw.
    vacuous: certify the fixed-step rule instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    tx = sgd_tx(0.05) if control else adam_tx(0.05, eps=0.0, max_norm=None)
    return _scale_free_residual(tx, seed, 8)

  return certify(measure, vacuous)


@certificate("3(ii)")
def adam_first_step(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The first step of Riemannian Adam at ``eps = 0`` has length ``min(eta, tau sqrt(r))``.

  Whatever the gradient scale (``c`` in ``{1e-6, 1, 1e6}``) and for ``eta`` in
  ``{0.1, 1}`` (uncapped and capped at ``r = 6``): ``m_hat_1 = xi_1``,
  ``sqrt(v_hat_1) = ||xi_1||``, so the displacement is independent of ``||g||``
  (Proposition 3(ii) and the remark after it). Residual relative, on the lifted
  tangent step. Control: ``stiefax.riemannian_sgd(eta)``, whose length follows ``||g||``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.adam_first_step()
    >>> c.proposition, c.passed
    ('3(ii)', True)

  Args:
    seed: the random draw.
    vacuous: certify the fixed-step rule instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    w, g = gradient_at_point(seed, 9)
    worst = 0.0
    for lr in (0.1, 1.0):
      tx = sgd_tx(lr) if control else adam_tx(lr, eps=0.0)
      target = min(lr, TAU * math.sqrt(R))
      for c in (1e-6, 1.0, 1e6):
        length = norm(_first_step(tx, w, c * g))
        worst = max(worst, float(np.max(np.abs(length - target) / target)))
    return worst

  return certify(measure, vacuous)


# ----------------------------------------------------------------------------
# The Jensen bound ||m_hat_t|| <= sqrt(v_hat_t).
# ----------------------------------------------------------------------------


def _moment_ratio(
  tx: optax.GradientTransformation, seed: int, growth: float, steps: int = 60
) -> float:
  """``max_t ||m_hat_t|| / sqrt(v_hat_t) - 1`` for a moment at ``eps = 0``.

  The output of the shipped moment at ``eps = 0`` is ``m_hat_t / sqrt(v_hat_t)``, so
  its frame norm is the ratio. The gradients share one direction per frame (the worst
  case for cancellation) with norms ``growth**t`` times a random jitter in [0.5, 1].
  A non-increasing sequence uses ``growth < 1`` and sorts the jitter.
  """
  rng = seeded_rng(seed, 10)
  w = haar(rng, (H, D, R))
  direction = project(rng.standard_normal(w.shape), w)
  jitter = rng.uniform(0.5, 1.0, steps)
  if growth <= 1:
    jitter = np.sort(jitter)[::-1]
  wk = as_kernel(w)
  state = tx.init(wk)
  update = jax.jit(tx.update)
  worst = -np.inf
  for t in range(steps):
    g = as_kernel(direction * (growth**t * jitter[t]))
    out, state = update(g, state, wk)
    worst = max(worst, float(np.max(norm(as_frames(out)))))
  return max(worst - 1.0, 0.0)


@certificate("3 (Jensen)")
def jensen_equal_betas(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``||m_hat_t|| <= sqrt(v_hat_t)`` for every gradient sequence when ``b1 = b2``.

  ``stiefax.scalar_moment(0.9, 0.9, eps=0)`` on a growing sequence (norms ``1.1**t``):
  with equal weights, ``||m_hat_t|| <= sum_s w_s ||xi_s|| <= sqrt(sum_s w_s
  ||xi_s||^2)`` (the projection is non-expansive; Jensen). Residual: the largest excess
  of ``||m_hat_t|| / sqrt(v_hat_t)`` over 1. Control: the default ``b2 = 0.999`` on the
  same sequence, where the bound stated after Proposition 3 fails.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.jensen_equal_betas()
    >>> c.proposition, c.passed
    ('3 (Jensen)', True)

  Args:
    seed: the random draw.
    vacuous: certify the default betas instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    return _moment_ratio(moment_tx(0.9, 0.999 if control else 0.9), seed, 1.1)

  return certify(measure, vacuous)


@certificate("3 (Jensen)")
def jensen_nonincreasing(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``||m_hat_t|| <= sqrt(v_hat_t)`` at the default betas when gradients do not grow.

  ``stiefax.scalar_moment(0.9, 0.999, eps=0)`` on a sequence of non-increasing norms
  (``0.97**t`` times sorted jitter): for ``b1 <= b2`` the first-moment weights favour
  recent (smaller) gradients, so ``sum_s w_s a_s <= sum_s u_s a_s <= sqrt(sum_s u_s
  a_s^2)`` (Chebyshev, then Jensen): the bound of the remark after Proposition 3.
  Control: a growing sequence (``1.1**t``).

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.jensen_nonincreasing()
    >>> c.proposition, c.passed
    ('3 (Jensen)', True)

  Args:
    seed: the random draw.
    vacuous: certify the growing sequence instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    return _moment_ratio(moment_tx(0.9, 0.999), seed, 1.1 if control else 0.97)

  return certify(measure, vacuous)
