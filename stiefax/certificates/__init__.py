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

Residuals measured by ``run_all(seed=0)`` (x86-64 CPU, jax 0.10.2; the last digit
varies across platforms; ``stiefax certify`` prints the current table):

    ========================================  ==========  =========  =========  ========
    check                                     prop.       residual   tolerance  control
    ========================================  ==========  =========  =========  ========
    joint_action_invariance                   1             1.3e-15      1e-10   1.7e+00
    joint_gauge_gradient                      1             5.3e-17      1e-10   2.4e-01
    gauge_orbit_derivative                    1             1.4e-18      1e-10   2.7e-03
    tangent_projection                        2             1.1e-16      1e-10   1.9e-01
    riemannian_gradient                       2             2.4e-17      1e-10   6.5e-03
    steepest_descent                          2             3.1e-16      1e-10   1.5e-01
    grassmann_split                           2 (eq. 12)    1.8e-16      1e-10   1.7e-01
    sgd_degree_one                            3(i)          7.2e-14      1e-10   9.0e+00
    sgd_step_norm                             3(i)          5.0e-16      1e-10   2.4e-01
    adam_degree_zero                          3(ii)         2.2e-16      1e-10   1.0e-01
    adam_degree_zero_uncapped                 3(ii)         2.8e-16      1e-10   5.7e-01
    adam_first_step                           3(ii)         5.6e-16      1e-10   4.4e+07
    jensen_equal_betas                        3 (Jensen)    2.2e-16      1e-10   7.2e-01
    jensen_nonincreasing                      3 (Jensen)    0.0e+00      1e-10   7.2e-01
    sigma_min_tangent                         6(i)          5.6e-16      1e-10   5.0e-01
    gram_identity                             6(i)          5.9e-16      1e-10   1.7e-01
    angle_bound                               6(ii)         0.0e+00      1e-10   5.5e-01
    angle_tangents                            6(ii)         3.9e-16      1e-10   3.6e-01
    retraction_isometry                       6(i)          1.3e-15      1e-10   2.4e+01
    scalar_moment_equivariance                7             1.3e-15      1e-10   4.1e-01
    per_column_equivariance                   7             1.1e-15      1e-10   1.7e-01
    sgd_equivariance                          7             6.7e-16      1e-10   3.4e-01
    equivariance_ingredients                  7             2.2e-15      1e-10   2.6e+00
    decay_is_normal                           8             1.4e-16      1e-10   2.5e-01
    adam_ignores_decay                        8             2.8e-16      1e-10   2.0e-01
    stiefel_adamw_exempts_frames              10            0.0e+00      1e-10   6.1e-02
    decay_absorbed                            10            4.4e-16      1e-10   7.9e-03
    polar_retract_absorbs_decay               10            3.9e-16      1e-10   8.8e-03
    mmuon_tangent                             mMuon         1.7e-14      1e-10   8.2e-01
    mmuon_spectral_norm                       mMuon         0.0e+00      1e-10   5.8e-01
    mmuon_optimum                             mMuon         2.6e-16      1e-06   2.3e-01
    qr_retraction                             retraction    6.7e-16      1e-10   1.2e+00
    cayley_retraction                         retraction    1.1e-15      1e-10   9.9e-02
    ========================================  ==========  =========  =========  ========

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
# Each group registers its certificates when imported: this order is the table's.
from stiefax.certificates import _gauge  # noqa: F401  (Proposition 1)
from stiefax.certificates import _steepest  # noqa: F401  (2)
from stiefax.certificates import _scale_free  # noqa: F401  (3, Jensen)
from stiefax.certificates import _conditioning  # noqa: F401  (6)
from stiefax.certificates import _equivariance  # noqa: F401  (7)
from stiefax.certificates import _decay  # noqa: F401  (8, 10)
from stiefax.certificates import _muon  # noqa: F401  (mMuon)
from stiefax.certificates import _retractions  # noqa: F401  (retraction)
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

# Each certificate is a module attribute under its registered name.
globals().update({entry.name: entry.function for entry in _core.registered()})

__all__ = [
  "Certificate",
  "CERTIFICATES",
  "CONTROL_MARGIN",
  "TOLERANCE",
  "OPTIMUM_TOLERANCE",
  "run_all",
  *(entry.name for entry in _core.registered()),
]


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
