"""Float64 numerical certificates of the paper's propositions (its Table 10).

Each certificate checks one identity or bound that a proposition asserts, on the code
stiefax ships (its transforms, aliases and diagnostics), in float64, and measures a
*control*: the same statistic on an input for which the claim must fail (a random
tensor pair instead of a gradient, the uncapped step, the elementwise moment, ...). A
certificate passes when its residual is at most its tolerance *and* its control is at
least ``CONTROL_MARGIN`` times the tolerance, so a check that became vacuous (a
statistic that is small whatever it is fed) cannot pass. Every certificate function
takes ``vacuous=True`` to feed the control's input to the check itself (and some take
the input directly: ``grads=``, ``max_norm=``, ``tx=``); the record then fails.

Every function computes under ``jax.enable_x64(True)`` (a context, never the global
setting) and returns a :class:`Certificate`; :func:`run_all` runs them all. Propositions
refer to the paper "Directions That Don't Drift: Stiefel Manifold Routing for
Transformer Attention": 1 (gauge directions carry no gradient), 2 (steepest descent in
the embedded metric; eq. 12), 3 (degree one / degree zero), the Jensen bound of the
remark after it, 6 (conditioning and the rotation bound), 7 (``O(d)``-equivariance),
8 (weight decay is normal) and 10 (decoupled decay is absorbed by the retraction).
Beyond the paper, ``mMuon`` rows certify :func:`stiefax.manifold_muon` (its step is
tangent, of spectral norm at most the rate, and attains the optimum of its subproblem
against an independent scipy solve, to ``OPTIMUM_TOLERANCE`` relative) and
``retraction`` rows the QR and Cayley retractions of :func:`stiefax.retract`.

The Jensen bound ``||m_hat_t||_F <= sqrt(v_hat_t)`` holds for every gradient sequence
only when ``b1 = b2`` (then both averages use the same weights); for ``b1 < b2`` (the
defaults 0.9, 0.999) it holds when the tangent-gradient norms do not increase
(Chebyshev's sum inequality, then Jensen), and a growing sequence breaks it: the two
``jensen_*`` certificates check exactly these statements, and their control is the
default moment on a growing sequence.

The checks live in one module per proposition group (``_gauge``: 1, ``_steepest``: 2,
``_scale_free``: 3 and the Jensen bound, ``_conditioning``: 6, ``_equivariance``: 7,
``_decay``: 8 and 10, ``_muon``, ``_retractions``). Each is registered by its
decorator, ``@certificate(proposition)``, under its function's name (the record's
``name``); :data:`CERTIFICATES` and ``__all__`` list the registered checks in the
order of the table below (the order in which the groups are imported).

``stiefax certify`` prints the residuals, tolerances and controls of every check; the
table measured for this release is in the documentation (``docs/reproduction.md``,
"``stiefax certify``"), not here, since the last digits vary across platforms.

Example:
  >>> from stiefax import certificates
  >>> c = certificates.grassmann_split()
  >>> c.passed, c.residual < c.tolerance < c.control
  (True, True)
  >>> certificates.grassmann_split(vacuous=True).passed
  False
"""

from __future__ import annotations

# isort: off
# The groups register their certificates when imported, in this order (the table's);
# each certificate is also imported here by name.
from stiefax.certificates._gauge import joint_action_invariance as joint_action_invariance
from stiefax.certificates._gauge import joint_gauge_gradient as joint_gauge_gradient
from stiefax.certificates._gauge import gauge_orbit_derivative as gauge_orbit_derivative
from stiefax.certificates._steepest import tangent_projection as tangent_projection
from stiefax.certificates._steepest import riemannian_gradient as riemannian_gradient
from stiefax.certificates._steepest import steepest_descent as steepest_descent
from stiefax.certificates._steepest import grassmann_split as grassmann_split
from stiefax.certificates._scale_free import sgd_degree_one as sgd_degree_one
from stiefax.certificates._scale_free import sgd_step_norm as sgd_step_norm
from stiefax.certificates._scale_free import adam_degree_zero as adam_degree_zero
from stiefax.certificates._scale_free import adam_degree_zero_uncapped as adam_degree_zero_uncapped
from stiefax.certificates._scale_free import adam_first_step as adam_first_step
from stiefax.certificates._scale_free import jensen_equal_betas as jensen_equal_betas
from stiefax.certificates._scale_free import jensen_nonincreasing as jensen_nonincreasing
from stiefax.certificates._conditioning import sigma_min_tangent as sigma_min_tangent
from stiefax.certificates._conditioning import gram_identity as gram_identity
from stiefax.certificates._conditioning import angle_bound as angle_bound
from stiefax.certificates._conditioning import angle_tangents as angle_tangents
from stiefax.certificates._conditioning import retraction_isometry as retraction_isometry
from stiefax.certificates._equivariance import (
  scalar_moment_equivariance as scalar_moment_equivariance,
)
from stiefax.certificates._equivariance import per_column_equivariance as per_column_equivariance
from stiefax.certificates._equivariance import sgd_equivariance as sgd_equivariance
from stiefax.certificates._equivariance import equivariance_ingredients as equivariance_ingredients
from stiefax.certificates._decay import decay_is_normal as decay_is_normal
from stiefax.certificates._decay import adam_ignores_decay as adam_ignores_decay
from stiefax.certificates._decay import stiefel_adamw_exempts_frames as stiefel_adamw_exempts_frames
from stiefax.certificates._decay import decay_absorbed as decay_absorbed
from stiefax.certificates._decay import polar_retract_absorbs_decay as polar_retract_absorbs_decay
from stiefax.certificates._muon import mmuon_tangent as mmuon_tangent
from stiefax.certificates._muon import mmuon_spectral_norm as mmuon_spectral_norm
from stiefax.certificates._muon import mmuon_optimum as mmuon_optimum
from stiefax.certificates._retractions import qr_retraction as qr_retraction
from stiefax.certificates._retractions import cayley_retraction as cayley_retraction
# isort: on

from stiefax.certificates import _core
from stiefax.certificates._core import CONTROL_MARGIN
from stiefax.certificates._core import OPTIMUM_TOLERANCE
from stiefax.certificates._core import TOLERANCE
from stiefax.certificates._core import Certificate
from stiefax.certificates._muon import scipy_spectral_step as scipy_spectral_step

# The tests of stiefax.muon lift its retracted steps with these.
from stiefax.certificates._problems import as_frames as _frames  # noqa: F401
from stiefax.certificates._problems import lift as _lift  # noqa: F401

#: Every certificate function, in the order of the table.
CERTIFICATES = tuple(entry.function for entry in _core.registered())

__all__ = [
  "Certificate",
  "CERTIFICATES",
  "CONTROL_MARGIN",
  "TOLERANCE",
  "OPTIMUM_TOLERANCE",
  "run_all",
  "joint_action_invariance",
  "joint_gauge_gradient",
  "gauge_orbit_derivative",
  "tangent_projection",
  "riemannian_gradient",
  "steepest_descent",
  "grassmann_split",
  "sgd_degree_one",
  "sgd_step_norm",
  "adam_degree_zero",
  "adam_degree_zero_uncapped",
  "adam_first_step",
  "jensen_equal_betas",
  "jensen_nonincreasing",
  "sigma_min_tangent",
  "gram_identity",
  "angle_bound",
  "angle_tangents",
  "retraction_isometry",
  "scalar_moment_equivariance",
  "per_column_equivariance",
  "sgd_equivariance",
  "equivariance_ingredients",
  "decay_is_normal",
  "adam_ignores_decay",
  "stiefel_adamw_exempts_frames",
  "decay_absorbed",
  "polar_retract_absorbs_decay",
  "mmuon_tangent",
  "mmuon_spectral_norm",
  "mmuon_optimum",
  "qr_retraction",
  "cayley_retraction",
]

if tuple(c.__name__ for c in CERTIFICATES) != tuple(__all__[6:]):  # pragma: no cover
  raise ImportError("stiefax.certificates: the registry and the names imported here differ")


def run_all(seed: int = 0) -> list[Certificate]:
  """Runs every certificate in :data:`CERTIFICATES` (float64, 33 checks).

  Example:
    >>> from stiefax import certificates
    >>> len(certificates.CERTIFICATES)   # run_all() returns one record per check
    33

  Args:
    seed: the random draw shared by every certificate.

  Returns:
    A list of :class:`Certificate`, one per check.
  """
  return [cert(seed) for cert in CERTIFICATES]
