"""stiefax: Stiefel-manifold attention frames for JAX and Optax.

Query/key projections (and any other "routing" matrix) kept on
``St(d, r) = {W : W^T W = I_r}`` and trained with a scale-free, step-capped
Riemannian Adam, built from small composable Optax transforms.

The package's top level is its public face: the frame view, the transforms, their
states, the optimizers and the names of their choices. Everything else has one home,
a documented submodule: :mod:`stiefax.geometry`, :mod:`stiefax.layouts`,
:mod:`stiefax.labels`, :mod:`stiefax.flax`, :mod:`stiefax.diagnostics`,
:mod:`stiefax.covariance`, :mod:`stiefax.elr`, :mod:`stiefax.sphere`,
:mod:`stiefax.muon` and :mod:`stiefax.certificates`.

The names are loaded on first use (PEP 562): ``import stiefax`` itself loads neither
jax nor optax, so the ``stiefax`` command starts at once; ``stiefax.stiefel_adamw`` and
``from stiefax import stiefel_adamw`` work as with any module.
"""

from __future__ import annotations

import importlib
import typing

if typing.TYPE_CHECKING:  # the static view of the names loaded by __getattr__
  from stiefax import certificates
  from stiefax import covariance
  from stiefax import diagnostics
  from stiefax import elr
  from stiefax import flax
  from stiefax import geometry
  from stiefax import labels
  from stiefax import layouts
  from stiefax import muon
  from stiefax import sphere
  from stiefax._alias import MOMENTS
  from stiefax._alias import riemannian_adam
  from stiefax._alias import riemannian_sgd
  from stiefax._frames import FrameSpec
  from stiefax._hyperball import HyperballState
  from stiefax._hyperball import hyperball
  from stiefax._hyperball_alias import adamh
  from stiefax._hyperball_alias import muonh
  from stiefax._matrix import POLAR_METHODS
  from stiefax._moments import ElementwiseMomentState
  from stiefax._moments import ScalarMomentState
  from stiefax._moments import elementwise_moment
  from stiefax._moments import scalar_moment
  from stiefax._muon import ManifoldMuonState
  from stiefax._muon import manifold_muon
  from stiefax._projections import PROJECTORS
  from stiefax._projections import canonical_gradient
  from stiefax._projections import grassmann_project
  from stiefax._projections import step_norm_cap
  from stiefax._projections import stiefel_project
  from stiefax._stiefel_adamw import FramesAndRestState
  from stiefax._stiefel_adamw import stiefel_adamw
  from stiefax._transforms import RETRACTIONS
  from stiefax._transforms import PolarRetractState
  from stiefax._transforms import polar_retract
  from stiefax._transforms import retract

__version__ = "0.3.0"

#: The documented submodules, loaded on first use.
_SUBMODULES = (
  "certificates",
  "covariance",
  "diagnostics",
  "elr",
  "flax",
  "geometry",
  "labels",
  "layouts",
  "muon",
  "sphere",
)

#: Each public name of the top level and the module that defines it.
_EXPORTS = {
  "POLAR_METHODS": "stiefax._matrix",
  "MOMENTS": "stiefax._alias",
  "FramesAndRestState": "stiefax._stiefel_adamw",
  "riemannian_adam": "stiefax._alias",
  "riemannian_sgd": "stiefax._alias",
  "stiefel_adamw": "stiefax._stiefel_adamw",
  "FrameSpec": "stiefax._frames",
  "hyperball": "stiefax._hyperball",
  "adamh": "stiefax._hyperball_alias",
  "muonh": "stiefax._hyperball_alias",
  "HyperballState": "stiefax._hyperball",
  "ManifoldMuonState": "stiefax._muon",
  "manifold_muon": "stiefax._muon",
  "canonical_gradient": "stiefax._projections",
  "grassmann_project": "stiefax._projections",
  "step_norm_cap": "stiefax._projections",
  "stiefel_project": "stiefax._projections",
  "PROJECTORS": "stiefax._projections",
  "RETRACTIONS": "stiefax._transforms",
  "ElementwiseMomentState": "stiefax._moments",
  "PolarRetractState": "stiefax._transforms",
  "ScalarMomentState": "stiefax._moments",
  "elementwise_moment": "stiefax._moments",
  "polar_retract": "stiefax._transforms",
  "retract": "stiefax._transforms",
  "scalar_moment": "stiefax._moments",
}

__all__ = [
  "FrameSpec",
  "stiefel_project",
  "grassmann_project",
  "canonical_gradient",
  "scalar_moment",
  "elementwise_moment",
  "step_norm_cap",
  "polar_retract",
  "retract",
  "ScalarMomentState",
  "ElementwiseMomentState",
  "PolarRetractState",
  "FramesAndRestState",
  "riemannian_adam",
  "riemannian_sgd",
  "stiefel_adamw",
  "manifold_muon",
  "ManifoldMuonState",
  "hyperball",
  "adamh",
  "muonh",
  "HyperballState",
  "POLAR_METHODS",
  "PROJECTORS",
  "RETRACTIONS",
  "MOMENTS",
  "geometry",
  "muon",
  "flax",
  "layouts",
  "labels",
  "diagnostics",
  "covariance",
  "elr",
  "sphere",
  "certificates",
]


def __getattr__(name: str) -> typing.Any:
  """Loads a public name (or a documented submodule) on first use and keeps it."""
  if name in _SUBMODULES:
    value = importlib.import_module(f"stiefax.{name}")
  elif name in _EXPORTS:
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
  else:
    raise AttributeError(f"module 'stiefax' has no attribute {name!r}")
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  """The public names and the module's dunder attributes, not the loader's imports."""
  return sorted(set(__all__) | {n for n in globals() if n.startswith("__")})
