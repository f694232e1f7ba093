"""Pure functions on batches of frames: projections, transport, Adam and retraction steps.

Every function takes arrays of shape ``(..., d, r)`` (a batch of ``d x r`` frames; see
:class:`stiefax.FrameSpec` for how a parameter is viewed that way) and is batched over
the leading axes with matrix products, never Python loops. Equation and proposition
numbers refer to the paper "Directions That Don't Drift: Stiefel Manifold Routing for
Transformer Attention".

Notation: ``W`` in ``St(d, r)`` (``W^T W = I_r``), ``G`` an ambient matrix (a gradient
or an update), ``sym(A) = (A + A^T) / 2``.

This module holds the math of one frame that the transforms, the fused optimizer and
the diagnostics share: the tangent projections (one table, :data:`PROJECTIONS`), the
transport of the first moment, the Adam coefficient, and the retractions (one table,
:data:`RETRACTION_TABLE`) with the retraction of a step. The matrix functions (polar
factors, inverse square roots, QR and Cayley retractions) are implemented in
``stiefax._matrix`` and re-exported here.
"""

from stiefax._geometry import PROJECTIONS
from stiefax._geometry import RETRACTION_TABLE
from stiefax._geometry import Projection
from stiefax._geometry import Retraction
from stiefax._geometry import adam_coefficient
from stiefax._geometry import canonical_tangent
from stiefax._geometry import grassmann_horizontal
from stiefax._geometry import isometry_residual
from stiefax._geometry import project_and_transport
from stiefax._geometry import projection
from stiefax._geometry import retraction_by_name
from stiefax._geometry import retraction_step
from stiefax._geometry import safe_divide
from stiefax._geometry import stiefel_tangent
from stiefax._matrix import DECOMPOSITION_METHODS
from stiefax._matrix import cayley_retract
from stiefax._matrix import compute_dtype
from stiefax._matrix import eye_like
from stiefax._matrix import frame_sq_norm
from stiefax._matrix import inverse_sqrt
from stiefax._matrix import mT
from stiefax._matrix import newton_schulz_iterations
from stiefax._matrix import polar
from stiefax._matrix import qr_retract
from stiefax._matrix import sym

__all__ = [
  "DECOMPOSITION_METHODS",
  "PROJECTIONS",
  "Projection",
  "sym",
  "mT",
  "eye_like",
  "stiefel_tangent",
  "grassmann_horizontal",
  "canonical_tangent",
  "projection",
  "project_and_transport",
  "frame_sq_norm",
  "isometry_residual",
  "safe_divide",
  "adam_coefficient",
  "polar",
  "newton_schulz_iterations",
  "inverse_sqrt",
  "qr_retract",
  "cayley_retract",
  "Retraction",
  "RETRACTION_TABLE",
  "retraction_by_name",
  "retraction_step",
  "compute_dtype",
]
