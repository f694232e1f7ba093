"""The Riemannian sphere Adam: each frame kept on its own sphere, stepped in its tangent space.

A scale-invariant parameter, ``l(c W) = l(W)`` for ``c > 0`` (query/key projections
under QK-norm, for example), has no use for its norm: only its direction matters.
These transforms optimize such a parameter on the sphere ``{W : ||W||_F = rho}`` of
each frame with the same scalar second moment and step cap as the corrected
Riemannian Adam of the paper (section 3.2), the sphere playing the role of
``St(d, r)``:

    sphere_project -> sphere moment -> scale_by_learning_rate -> step_norm_cap
      -> (relative scale) -> sphere_retract

Frames are the groups of entries whose joint norm is kept: for a leaf viewed with a
:class:`stiefax.FrameSpec`, the entries of one frame are those of
:meth:`stiefax.FrameSpec.view` sharing the batch indices (all of a head's ``d x r``
block, say; :meth:`stiefax.FrameSpec.frame_axes` names the others). Specs that
``split`` a fused leaf or ``select`` part of it work as in the Stiefel transforms:
the entries outside the selection are not frames and get a zero update (train them
with another optimizer, as :func:`stiefax.stiefel_adamw` does). Unlike Stiefel
frames, sphere frames may be wide (``r > d``). A vector is one ``d x 1`` frame and a
scalar a ``1 x 1`` frame, whatever ``frames`` says.

Notation: ``<A, B> = sum_ij A_ij B_ij`` and ``||A||`` the Frobenius norm, both per
frame.
"""

from stiefax._sphere import hyperball_adam
from stiefax._sphere import sphere_adam
from stiefax._sphere import sphere_moment
from stiefax._sphere import sphere_project
from stiefax._sphere import sphere_retract

__all__ = [
  "sphere_project",
  "sphere_retract",
  "sphere_moment",
  "sphere_adam",
  "hyperball_adam",
]
