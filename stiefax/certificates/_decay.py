"""Propositions 8 and 10: weight decay is normal, and the retraction absorbs it.

Proposition 8: ``Pi_W(lambda W) = 0``; Proposition 10: decoupled decay is absorbed by
the retraction at the price of a rescaled step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stiefax.certificates._core import Certificate
from stiefax.certificates._core import certificate
from stiefax.certificates._core import certify
from stiefax.certificates._optimizers import adam_tx
from stiefax.certificates._optimizers import euclidean_adam_tx
from stiefax.certificates._optimizers import retract_tx
from stiefax.certificates._optimizers import stiefel_adamw_tx
from stiefax.certificates._problems import D
from stiefax.certificates._problems import H
from stiefax.certificates._problems import R
from stiefax.certificates._problems import as_kernel
from stiefax.certificates._problems import haar
from stiefax.certificates._problems import norm
from stiefax.certificates._problems import one_update
from stiefax.certificates._problems import polar
from stiefax.certificates._problems import project
from stiefax.certificates._problems import quadratic
from stiefax.certificates._problems import seeded_rng
from stiefax.certificates._problems import trajectory


@certificate("8")
def decay_is_normal(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``Pi_W(lambda W) = 0``: weight decay has zero Riemannian gradient (Proposition 8).

  ``W = W I_r`` lies in the normal space ``{W S : S = S^T}``; residual
  ``max|Pi_W(lambda W)| / lambda`` through the shipped ``stiefel_project``. Control: a
  point off the manifold (``W + 0.05 N``), where ``W^T W != I``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.decay_is_normal()
    >>> c.proposition, c.passed
    ('8', True)

  Args:
    seed: the random draw.
    vacuous: certify the off-manifold point.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    rng = seeded_rng(seed, 17)
    w = haar(rng, (H, D, R))
    if control:
      w = w + 0.05 * rng.standard_normal(w.shape)
    lam = 0.05
    return np.max(np.abs(project(lam * w, w))) / lam

  return certify(measure, vacuous)


@certificate("8")
def adam_ignores_decay(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """Adding ``lambda W`` to every gradient leaves the Riemannian Adam trajectory unchanged.

  ``stiefax.riemannian_adam(1.0)`` for 10 steps on ``f(W) = -tr(W^T A W)`` with and
  without the coupled L2 gradient ``lambda W`` (``lambda = 0.5``); residual
  ``max|W_T(lambda) - W_T(0)|`` (Proposition 8). Control: Euclidean Adam
  (``optax.adamw(1e-2, weight_decay=0)``), which the term moves.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.adam_ignores_decay()
    >>> c.proposition, c.passed
    ('8', True)

  Args:
    seed: the random draw.
    vacuous: certify Euclidean Adam.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> jax.Array:
    tx = euclidean_adam_tx(1e-2) if control else adam_tx()
    a, w0, _ = quadratic(seed, 18)
    plain = trajectory(tx, w0, a, 1.0, 0.0, 10)
    decayed = trajectory(tx, w0, a, 1.0, 0.5, 10)
    return jnp.max(jnp.abs(decayed - plain))

  return certify(measure, vacuous)


@certificate("10")
def stiefel_adamw_exempts_frames(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``stiefax.stiefel_adamw`` never applies weight decay to frames (Props. 8, 10).

  Two updates of a query/key/value model with ``weight_decay=1.0`` and with 0: the
  query/key frames must agree exactly (the decay term is not formed for them; residual
  ``max|delta W_Q|, |delta W_K|``). Control: the value kernel, which AdamW decays.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.stiefel_adamw_exempts_frames()
    >>> c.proposition, c.passed
    ('10', True)

  Args:
    seed: the random draw.
    vacuous: compare the value kernel in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    rng = seeded_rng(seed, 19)
    params = {
      "query": {"kernel": as_kernel(haar(rng, (H, D, R)))},
      "key": {"kernel": as_kernel(haar(rng, (H, D, R)))},
      "value": {"kernel": jnp.asarray(rng.standard_normal((D, H, R)))},
    }
    grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape)), params)
    finals = []
    for decay in (0.0, 1.0):
      finals.append(_two_steps(stiefel_adamw_tx(decay), params, grads))
    names = ("value",) if control else ("query", "key")
    return max(
      float(jnp.max(jnp.abs(finals[1][n]["kernel"] - finals[0][n]["kernel"]))) for n in names
    )

  return certify(measure, vacuous)


@functools.partial(jax.jit, static_argnames=("tx",))
def _two_steps(
  tx: optax.GradientTransformation, params: optax.Params, grads: optax.Updates
) -> optax.Params:
  state = tx.init(params)
  for _ in range(2):
    u, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, u)
  return params


def _decay_problem(seed: int, salt: int) -> tuple[np.ndarray, np.ndarray, float]:
  rng = seeded_rng(seed, salt)
  w = haar(rng, (H, D, R))
  eta = project(rng.standard_normal(w.shape), w)
  eta = 0.3 * eta / norm(eta)[:, None, None]
  return w, eta, 0.1  # eta_lr * lambda


@certificate("10")
def decay_absorbed(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``polar((1 - eta lambda) W + eta_t) = polar(W + eta_t / (1 - eta lambda))`` (Prop. 10).

  Decoupled decay is absorbed by the retraction at the price of a rescaled step;
  through the shipped ``geometry.polar`` (``"auto"``); residual max-abs. Control:
  ``polar(W + eta_t)`` (forgetting the rescale).

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.decay_absorbed()
    >>> c.proposition, c.passed
    ('10', True)

  Args:
    seed: the random draw.
    vacuous: drop the rescale in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    w, eta, shrink = _decay_problem(seed, 20)
    lhs = polar((1 - shrink) * w + eta)
    rhs = polar(w + (eta if control else eta / (1 - shrink)))
    return np.max(np.abs(lhs - rhs))

  return certify(measure, vacuous)


@certificate("10")
def polar_retract_absorbs_decay(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``stiefax.polar_retract`` lands on the same point for ``eta_t - eta lambda W`` and
  ``eta_t / (1 - eta lambda)`` (Proposition 10, through the shipped transform).

  Control: the update ``eta_t`` (no rescale).

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.polar_retract_absorbs_decay()
    >>> c.proposition, c.passed
    ('10', True)

  Args:
    seed: the random draw.
    vacuous: drop the rescale in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control: bool) -> float:
    w, eta, shrink = _decay_problem(seed, 21)
    tx = retract_tx()
    lhs = one_update(tx, as_kernel(eta - shrink * w), as_kernel(w))
    rhs = one_update(tx, as_kernel(eta if control else eta / (1 - shrink)), as_kernel(w))
    return np.max(np.abs(lhs - rhs))

  return certify(measure, vacuous)
