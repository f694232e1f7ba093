"""The transforms under test, built once per argument tuple.

Caching the transform objects keeps their compiled trajectories (``jax.jit`` with the
transform static) alive across certificates and calls.
"""

from __future__ import annotations

import functools
from typing import Optional

import optax

from stiefax import _moments
from stiefax import _projections
from stiefax import _transforms
from stiefax._alias import riemannian_adam
from stiefax._alias import riemannian_sgd
from stiefax._stiefel_adamw import stiefel_adamw
from stiefax.certificates._problems import TAU

# Transforms are built once, so their compiled trajectories are reused across calls.
cached_tx = functools.lru_cache(maxsize=None)


@cached_tx
def adam_tx(
  lr: float = 1.0, eps: float = 1e-8, max_norm: Optional[float] = TAU, moment: str = "scalar"
) -> optax.GradientTransformation:
  return riemannian_adam(lr, b1=0.9, b2=0.999, eps=eps, max_norm=max_norm, moment=moment)


@cached_tx
def retract_tx() -> optax.GradientTransformation:
  return _transforms.polar_retract()


@cached_tx
def cap_tx() -> optax.GradientTransformation:
  return _projections.step_norm_cap(TAU)


@cached_tx
def stiefel_adamw_tx(weight_decay: float) -> optax.GradientTransformation:
  return stiefel_adamw(0.01, weight_decay=weight_decay)


@cached_tx
def sgd_tx(lr: float = 0.02) -> optax.GradientTransformation:
  return riemannian_sgd(lr)


@cached_tx
def euclidean_adam_tx(lr: float = 1e-2) -> optax.GradientTransformation:
  return optax.adamw(lr, weight_decay=0.0)


@cached_tx
def moment_tx(b1: float = 0.9, b2: float = 0.999, eps: float = 0.0) -> optax.GradientTransformation:
  return _moments.scalar_moment(b1, b2, eps)
