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
"""

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
from stiefax._matrix import POLAR_METHODS
from stiefax.alias import MOMENTS
from stiefax.alias import FramesAndRestState
from stiefax.alias import riemannian_adam
from stiefax.alias import riemannian_sgd
from stiefax.alias import stiefel_adamw
from stiefax.frames import FrameSpec
from stiefax.muon import ManifoldMuonState
from stiefax.muon import manifold_muon
from stiefax.projections import canonical_gradient
from stiefax.projections import grassmann_project
from stiefax.projections import step_norm_cap
from stiefax.projections import stiefel_project
from stiefax.sphere import hyperball_adam
from stiefax.sphere import sphere_project
from stiefax.sphere import sphere_retract
from stiefax.transforms import PROJECTORS
from stiefax.transforms import RETRACTIONS
from stiefax.transforms import ElementwiseMomentState
from stiefax.transforms import PolarRetractState
from stiefax.transforms import ScalarMomentState
from stiefax.transforms import elementwise_moment
from stiefax.transforms import polar_retract
from stiefax.transforms import retract
from stiefax.transforms import scalar_moment

__version__ = "0.2.0"

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
  "sphere_project",
  "sphere_retract",
  "hyperball_adam",
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
