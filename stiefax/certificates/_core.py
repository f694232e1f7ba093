"""The certificate record, its pass rule, and the registry that names each check once.

A certificate is a function ``name(seed=0, *, vacuous=False, ...) -> Certificate``
decorated with :func:`certificate`, which records its proposition (and tolerance) and
adds it to the registry under the function's own name; its body builds
``measure(control)`` and returns ``certify(measure, vacuous)``, which evaluates the
statistic for the control and the claim in float64 and names the record after the
running certificate. :func:`registered` lists the certificates in registration order
(the order of the table).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import ParamSpec

import jax

#: Tolerance of ``mmuon_optimum``: relative objective against an independent solver.
OPTIMUM_TOLERANCE = 1e-6

#: Tolerance of every certificate: float64 identities hold to ~1e-15 relative.
TOLERANCE = 1e-10

#: A certificate passes only if its control is at least this many tolerances.
CONTROL_MARGIN = 100.0

P = ParamSpec("P")

#: ``measure(control)``: the statistic of the check (``False``) or of its control.
Measure = Callable[[bool], Any]


class Certificate(NamedTuple):
  """One numerical certificate: the residual of a claim and of its control.

  Attributes:
    name: the check, e.g. ``"joint_gauge_gradient"``.
    proposition: the paper's proposition, e.g. ``"1"`` or ``"6(ii)"``.
    residual: the claim's residual (0 is exact); must be <= ``tolerance``.
    tolerance: the largest residual accepted.
    control: the same statistic where the claim must fail; must be at least
      ``CONTROL_MARGIN * tolerance``.
    passed: ``residual <= tolerance`` and ``control >= CONTROL_MARGIN * tolerance``.
  """

  name: str  # the check, e.g. "joint_gauge_gradient".
  proposition: str  # the paper's proposition, e.g. "1" or "6(ii)".
  residual: float  # the claim's residual (0 is exact); must be <= tolerance.
  tolerance: float  # the largest residual accepted.
  control: float  # the same statistic where the claim must fail; must be >> tolerance.
  passed: bool  # residual <= tolerance and control >= CONTROL_MARGIN * tolerance.


def record(
  name: str, proposition: str, residual: Any, control: Any, tolerance: float = TOLERANCE
) -> Certificate:
  """The record of one check: passes when the residual is small and the control is not."""
  residual, control = float(residual), float(control)
  passed = bool(residual <= tolerance and control >= CONTROL_MARGIN * tolerance)
  return Certificate(name, proposition, residual, tolerance, control, passed)


class Entry(NamedTuple):
  """A registered certificate: its name, proposition, tolerance and function."""

  name: str
  proposition: str
  tolerance: float
  function: Callable[..., Certificate]


_REGISTRY: dict[str, Entry] = {}
_RUNNING: contextvars.ContextVar[Entry] = contextvars.ContextVar("certificate")


def certificate(
  proposition: str, *, tolerance: float = TOLERANCE
) -> Callable[[Callable[P, Certificate]], Callable[P, Certificate]]:
  """Registers a certificate function under its own name.

  The function must take the seed first and a keyword-only ``vacuous=False`` and have
  a docstring; a second function of the same name is an error.

  Args:
    proposition: the paper's proposition the check certifies, e.g. ``"6(ii)"``.
    tolerance: the largest residual accepted.

  Returns:
    The decorator; it returns the function, run with its :class:`Entry` current.
  """

  def register(fn: Callable[P, Certificate]) -> Callable[P, Certificate]:
    name = fn.__name__
    if name in _REGISTRY:
      raise ValueError(f"certificate {name!r} is registered twice")
    if not (fn.__doc__ or "").strip():
      raise ValueError(f"certificate {name!r} has no docstring")
    params = list(inspect.signature(fn).parameters.values())
    vacuous = inspect.signature(fn).parameters.get("vacuous")
    if not params or params[0].name != "seed" or vacuous is None:
      raise ValueError(f"certificate {name!r} must take (seed, *, ..., vacuous=False)")
    if vacuous.kind is not inspect.Parameter.KEYWORD_ONLY or vacuous.default is not False:
      raise ValueError(f"certificate {name!r}: vacuous must be keyword-only, default False")

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> Certificate:
      token = _RUNNING.set(entry)
      try:
        return fn(*args, **kwargs)
      finally:
        _RUNNING.reset(token)

    entry = Entry(name, proposition, tolerance, run)
    _REGISTRY[name] = entry
    return run

  return register


def certify(measure: Measure, vacuous: bool) -> Certificate:
  """Runs ``measure(control)`` for the control and the claim, in float64.

  The record is named after the running certificate (see :func:`certificate`); with
  ``vacuous`` the control's statistic is the residual too, so the record fails.

  Args:
    measure: the statistic of the claim (``control=False``) or the control.
    vacuous: use the control's statistic as the residual.

  Returns:
    The :class:`Certificate` of the running check.
  """
  entry = _RUNNING.get(None)
  if entry is None:
    raise RuntimeError("certify() runs inside a function decorated with @certificate")
  with jax.enable_x64(True):
    control = float(measure(True))
    residual = control if vacuous else float(measure(False))
  return record(entry.name, entry.proposition, residual, control, entry.tolerance)


def registered() -> tuple[Entry, ...]:
  """Every registered certificate, in registration order."""
  return tuple(_REGISTRY.values())
