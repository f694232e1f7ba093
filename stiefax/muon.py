"""Manifold Muon: steepest descent under the spectral norm on ``St(d, r)``.

For a frame ``W`` and an ambient direction ``G`` (a gradient or its momentum) the
step direction solves

    max_A  tr(G^T A)   subject to   ||A||_2 <= 1,   W^T A + A^T W = 0,       (P)

the largest first-order decrease per unit of spectral norm among tangent directions
(Bernstein 2025, "Stiefel manifold", Modula docs; Su 2025, "Steepest Descent on
Manifolds: 3. Muon + Stiefel"). A symmetric multiplier ``Lambda`` for the tangency
constraint gives the Lagrangian ``tr((G + 2 W Lambda)^T A)``, maximized over the
spectral ball by ``A = msign(G + 2 W Lambda)``, and the dual problem

    min_{Lambda = Lambda^T}  ||G + 2 W Lambda||_*                            (D)

(nuclear norm) whose (sub)gradient is ``W^T A + A^T W``, the tangency residual of
``A``. Dual ascent on (D) is Bernstein's algorithm.

Gram-space form. Write ``M = W^T G``, ``C = G^T G - M^T M`` (the Gram matrix of the
normal-free part ``G - W M``) and ``B = W^T Y = M + 2 Lambda`` for
``Y = G + 2 W Lambda``. Then ``Y^T Y = B^T B + C`` and, with
``Z = (Y^T Y)^{-1/2}``, ``msign(Y) = Y Z`` and ``W^T msign(Y) = B Z``. So every dual
iteration works on ``r x r`` matrices only (Tilde Research, "Gram-Space Manifold
Muon"); ``d x r`` products appear once before (``M``, ``G^T G``) and once after
(``A = G Z + W (B - M) Z``).

Step of the dual iteration. Plain dual ascent ``Lambda <- Lambda - alpha H`` with
``H = B Z + Z B^T`` needs a step ``alpha`` of the order of the smallest singular value
of ``Y`` and then converges in ``O(cond(Y))`` iterations. The curvature of (D) in
``Lambda`` is ``Lambda -> sym(Lambda Z)`` (to first order), so the step here is
preconditioned by its inverse's one-sided approximation ``Z^{-1} = (Y^T Y)^{1/2}``:

    B <- B - (1/2) sym((Y^T Y)^{1/2} H),

which is scale-free (no step size to tune) and converges linearly at a rate
independent of the scale of ``G``, from Bernstein's start ``Lambda = -sym(M) / 2``
(``benchmarks/mmuon_solver.py`` measures it against plain dual ascent;
``docs/optimizers.md`` reports the numbers). The step is not monotone in
the gap on every problem, so each frame keeps its best iterate, and a step that raised
the gap is retried from it at half the size (doubling back up to 1/2 after a success).
When ``Y`` is rank-deficient at the optimum (a gradient of low rank, or ``d <= 2r``),
(D) is not differentiable there and the iteration stalls at a positive duality gap;
the gap is reported.

Feasibility is enforced, not hoped for: after the fixed iteration count the direction
``A = Y Z`` (spectral norm <= 1 because Newton-Schulz never overshoots, see
:func:`stiefax.geometry.inverse_sqrt`) is projected onto the tangent space and divided
by ``1 + ||sym(W^T A)||_F``, which bounds the spectral norm of the projection. The
returned direction is therefore tangent and of spectral norm at most 1 whatever the
iteration count; the count only decides how close to the optimum of (P) it is. The
relative duality gap ``(||Y||_* - tr(G^T A)) / ||Y||_*`` bounds that distance.
"""

from stiefax._muon import DUAL_ITERATIONS
from stiefax._muon import NS_ITERATIONS
from stiefax._muon import SpectralStep
from stiefax._muon import spectral_tangent_direction

__all__ = [
  "DUAL_ITERATIONS",
  "NS_ITERATIONS",
  "SpectralStep",
  "spectral_tangent_direction",
]
