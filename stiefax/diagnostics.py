"""Geometric diagnostics: manifold distance, tangency, gauge content, equivariance, steps.

All functions are pure, work on arrays or parameter trees (with an optional label tree;
``labels=None`` means the query/key weights found by :func:`stiefax.layouts.qk_labels`),
and run under ``jax.jit``. Equation,
table and proposition numbers refer to the paper "Directions That Don't Drift: Stiefel
Manifold Routing for Transformer Attention".

* :func:`isometry_error`: ``max |W^T W - I|`` over frames.
* :func:`tangency_error`: ``max |W^T X + X^T W|``.
* :func:`gauge_content`: how much of a query/key gradient lies along the joint
  ``O(r)`` gauge orbit (none, for a true gradient: Proposition 1) and along the
  per-frame ``O(r)`` directions (about a quarter: Table 8).
* :func:`equivariance_violation`: the Table 9 experiment for any Optax transform.
* :func:`step_statistics`: tangent-gradient norm, step norm and their ratio per frame
  (the trajectory logging of section 4.7).
"""

from stiefax._diagnostics import GaugeContent
from stiefax._diagnostics import StepStatistics
from stiefax._diagnostics import equivariance_violation
from stiefax._diagnostics import gauge_content
from stiefax._diagnostics import isometry_error
from stiefax._diagnostics import step_statistics
from stiefax._diagnostics import tangency_error

__all__ = [
  "isometry_error",
  "tangency_error",
  "GaugeContent",
  "gauge_content",
  "equivariance_violation",
  "StepStatistics",
  "step_statistics",
]
