"""stiefax: Stiefel-manifold attention frames for JAX and Optax.

Query/key projections (and any other "routing" matrix) kept on
``St(d, r) = {W : W^T W = I_r}`` and trained with a scale-free, step-capped
Riemannian Adam, built from small composable Optax transforms.
"""

from stiefax import certificates
from stiefax import covariance
from stiefax import diagnostics
from stiefax import flax
from stiefax import geometry
from stiefax import labels
from stiefax import muon
from stiefax.alias import MOMENTS
from stiefax.alias import FramesAndRestState
from stiefax.alias import riemannian_adam
from stiefax.alias import riemannian_sgd
from stiefax.alias import stiefel_adamw
from stiefax.frames import FrameSpec
from stiefax.geometry import POLAR_METHODS
from stiefax.muon import ManifoldMuonState
from stiefax.muon import manifold_muon
from stiefax.sphere import hyperball_adam
from stiefax.sphere import sphere_project
from stiefax.sphere import sphere_retract
from stiefax.transforms import PROJECTORS
from stiefax.transforms import RETRACTIONS
from stiefax.transforms import ElementwiseMomentState
from stiefax.transforms import PolarRetractState
from stiefax.transforms import ScalarMomentState
from stiefax.transforms import canonical_gradient
from stiefax.transforms import elementwise_moment
from stiefax.transforms import grassmann_project
from stiefax.transforms import polar_retract
from stiefax.transforms import retract
from stiefax.transforms import scalar_moment
from stiefax.transforms import step_norm_cap
from stiefax.transforms import stiefel_project

__version__ = "0.1.0"

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
  "labels",
  "diagnostics",
  "covariance",
  "certificates",
]
