"""Symmetries, covariant optimizers and the effective learning rate.

**Covariance.** An action ``phi`` maps parameters to parameters; training the
reparameterized loss ``l'(theta) = l(phi^{-1}(theta))`` from ``phi(theta_0)`` gives
the same model as training ``l`` from ``theta_0`` exactly when the optimizer is
*covariant* under ``phi``::

    theta'_t = phi(theta_t)   for every t.

When ``phi`` is a symmetry of the model (``l' = l``) covariance says that two
parameterizations of one function train identically. The paper's Propositions 3(ii)
(scale-freeness: the loss ``l' = c l``) and 7 (``O(d)``-equivariance: rotation of
the rows of every frame) are instances; :func:`covariance_violation` measures
``max_t max |phi(theta_t) - theta'_t|`` for any Optax optimizer, and
:func:`left_rotation`, :func:`right_rotation`, :func:`rescale` and
:func:`gradient_scale` build the actions.

The effective learning rate of an update (its radial and tangential parts) is in
:mod:`stiefax.elr`.
"""

from stiefax._covariance import Action
from stiefax._covariance import covariance_violation
from stiefax._covariance import gradient_scale
from stiefax._covariance import left_rotation
from stiefax._covariance import rescale
from stiefax._covariance import right_rotation

__all__ = [
  "Action",
  "left_rotation",
  "right_rotation",
  "rescale",
  "gradient_scale",
  "covariance_violation",
]
