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

import functools
import math
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stiefax import diagnostics
from stiefax import geometry
from stiefax import muon
from stiefax import transforms
from stiefax.alias import riemannian_adam
from stiefax.alias import riemannian_sgd
from stiefax.alias import stiefel_adamw
from stiefax.frames import FrameSpec

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

#: Tolerance of :func:`mmuon_optimum`: relative objective against an independent solver.
OPTIMUM_TOLERANCE = 1e-6

#: Tolerance of every certificate: float64 identities hold to ~1e-15 relative.
TOLERANCE = 1e-10

#: A certificate passes only if its control is at least this many tolerances.
CONTROL_MARGIN = 100.0

# The test problem: frames of Table 9 (d = 24, r = 6, three heads), the step cap of
# the paper (tau = 0.1), a short sequence of tokens for the attention score function.
D, R, H = 24, 6, 3
TAU = 0.1
TOKENS = 8


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


def _record(name: str, proposition: str, residual, control, tolerance: float = TOLERANCE):
  residual, control = float(residual), float(control)
  passed = bool(residual <= tolerance and control >= CONTROL_MARGIN * tolerance)
  return Certificate(name, proposition, residual, tolerance, control, passed)


def _certify(
  name: str,
  proposition: str,
  measure: Callable[[bool], Any],
  vacuous: bool,
  tolerance: float = TOLERANCE,
):
  """Runs ``measure(control)`` for the check and the control, in float64."""
  with jax.enable_x64(True):
    control = float(measure(True))
    residual = control if vacuous else float(measure(False))
  return _record(name, proposition, residual, control, tolerance)


# ----------------------------------------------------------------------------
# Test problems (NumPy float64; every certificate draws its own).
# ----------------------------------------------------------------------------


def _rng(seed: int, salt: int) -> np.random.Generator:
  return np.random.default_rng([int(seed), salt])


def _haar(rng: np.random.Generator, shape) -> np.ndarray:
  """Haar-random orthonormal frames ``(..., d, r)`` (QR of a Gaussian, signs fixed)."""
  q, r = np.linalg.qr(rng.standard_normal(shape))
  return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


def _kernel(frames: np.ndarray) -> jax.Array:
  """``(H, d, r)`` frames -> a ``(d, H, r)`` float64 kernel (the Flax layout)."""
  return jnp.asarray(np.transpose(frames, (1, 0, 2)), jnp.float64)


def _frames(kernel) -> np.ndarray:
  """A ``(d, H, r)`` kernel -> ``(H, d, r)`` NumPy float64 frames."""
  return np.transpose(np.asarray(kernel, np.float64), (1, 0, 2))


def _mT(x: np.ndarray) -> np.ndarray:
  return np.swapaxes(x, -1, -2)


def _skew(a: np.ndarray) -> np.ndarray:
  return 0.5 * (a - _mT(a))


def _sym(a: np.ndarray) -> np.ndarray:
  return 0.5 * (a + _mT(a))


def _norm(x: np.ndarray) -> np.ndarray:
  """Frobenius norm of each frame ``(..., d, r) -> (...)``."""
  return np.sqrt(np.sum(np.square(x), axis=(-2, -1)))


def _inner(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  return np.sum(x * y, axis=(-2, -1))


@functools.partial(jax.jit, static_argnames=("tx",))
def _fresh_update(tx, g, w):
  return tx.update(g, tx.init(w), w)[0]


def _update(tx: optax.GradientTransformation, g, w) -> np.ndarray:
  """One update of ``tx`` from a fresh state, as ``(H, d, r)`` frames (compiled per tx)."""
  return _frames(_fresh_update(tx, jnp.asarray(g, jnp.float64), jnp.asarray(w, jnp.float64)))


@functools.cache
def _projector(kind: str) -> optax.GradientTransformation:
  return {
    "stiefel": transforms.stiefel_project,
    "grassmann": transforms.grassmann_project,
    "canonical": transforms.canonical_gradient,
  }[kind]()


def _project(g: np.ndarray, w: np.ndarray, kind: str = "stiefel") -> np.ndarray:
  """The shipped projection transforms applied to ``(H, d, r)`` frames."""
  return _update(_projector(kind), _kernel(g), _kernel(w))


_polar_jit = jax.jit(geometry.polar, static_argnames=("method",))


def _polar(a: np.ndarray) -> np.ndarray:
  """The shipped ``geometry.polar`` (``"auto"``: matrix products only), in float64."""
  return np.asarray(_polar_jit(jnp.asarray(a, jnp.float64)))


def _lift(w: np.ndarray, w_new: np.ndarray) -> np.ndarray:
  """The tangent step ``eta`` with ``polar(W + eta) = W_new``, per frame ``(H, d, r)``.

  With ``A = W + eta = W_new P`` (``P`` symmetric positive) and ``W^T eta`` skew,
  ``sym(W^T W_new P) = I``: a Lyapunov equation ``B P + P B^T = 2 I`` for ``P``
  (``B = W^T W_new``), solved exactly; then ``eta = W_new P - W``.
  """
  out = []
  for wf, uf in zip(w, w_new):
    r = wf.shape[-1]
    b, eye = wf.T @ uf, np.eye(r)
    p = np.linalg.solve(np.kron(b, eye) + np.kron(eye, b), 2 * eye.reshape(-1))
    out.append(uf @ p.reshape(r, r) - wf)
  return np.stack(out)


def _principal_tangents(w: np.ndarray, u: np.ndarray) -> np.ndarray:
  """Tangents of the principal angles between ``col(W)`` and ``col(U)`` (U orthonormal).

  Cosines and sines both come from singular values (accurate at small angles).
  """
  d = w.shape[-2]
  out = []
  for wf, uf in zip(w, u):
    proj = np.eye(d) - wf @ wf.T
    cos = np.sort(np.linalg.svd(wf.T @ uf, compute_uv=False))[::-1]
    sin = np.sort(np.linalg.svd(proj @ uf, compute_uv=False))
    out.append(sin / cos)
  return np.stack(out)


def _max_angle(w: np.ndarray, u: np.ndarray) -> float:
  """Largest principal angle (radians) between ``col(W)`` and ``col(U)``, over frames."""
  return float(np.max(np.arctan(_principal_tangents(w, u))))


class _Attention(NamedTuple):
  """A multi-head attention loss of ``(W_Q, W_K)``: data and the point."""

  x: jax.Array  # (tokens, d) inputs.
  w_v: jax.Array  # (d, H, r) value kernel.
  target: jax.Array  # (tokens, H, r) readout weights.
  w_q: jax.Array  # (d, H, r) query frames.
  w_k: jax.Array  # (d, H, r) key frames.


def _scores(x, wq, wk):
  """Attention scores ``(X W_Q)(X W_K)^T / sqrt(r)`` per head, ``(H, n, n)``."""
  q = jnp.einsum("nd,dhr->hnr", x, wq)
  k = jnp.einsum("nd,dhr->hnr", x, wk)
  return jnp.einsum("hnr,hmr->hnm", q, k) / math.sqrt(q.shape[-1])


def _attention_loss(x, w_v, target, wq, wk):
  """A scalar function of the scores: softmax attention, tanh readout."""
  p = jax.nn.softmax(_scores(x, wq, wk), axis=-1)
  out = jnp.einsum("hnm,md,dhr->nhr", p, x, w_v)
  return jnp.sum(jnp.tanh(out) * target)


_scores_jit = jax.jit(_scores)
_attention_grad = jax.jit(jax.grad(_attention_loss, argnums=(3, 4)))


@jax.jit
def _attention_jvp(x, w_v, target, wq, wk, tq, tk):
  return jax.jvp(lambda a, b: _attention_loss(x, w_v, target, a, b), (wq, wk), (tq, tk))[1]


@jax.jit
def _retraction_derivatives(x, w_v, target, frames, wk, directions):
  """``d/dt loss(polar(W + t xi))`` at 0 for each direction ``xi`` (forward mode)."""

  def one(xi):
    curve = lambda t: _attention_loss(
      x, w_v, target, jnp.swapaxes(geometry.polar(frames + t * xi), 0, 1), wk
    )
    return jax.jvp(curve, (jnp.zeros([], frames.dtype),), (jnp.ones([], frames.dtype),))[1]

  return jax.vmap(one)(directions)


_gauge_jit = jax.jit(diagnostics.gauge_content)


def _attention_problem(seed: int) -> tuple[_Attention, np.random.Generator]:
  """A float64 attention problem and the generator that drew it."""
  rng = _rng(seed, 1)
  x = jnp.asarray(rng.standard_normal((TOKENS, D)))
  w_v = jnp.asarray(rng.standard_normal((D, H, R)) / math.sqrt(D))
  target = jnp.asarray(rng.standard_normal((TOKENS, H, R)))
  w_q, w_k = _kernel(_haar(rng, (H, D, R))), _kernel(_haar(rng, (H, D, R)))
  return _Attention(x, w_v, target, w_q, w_k), rng


def _quadratic(seed: int, salt: int):
  """``f(W) = -tr(W^T A W)`` summed over heads: ``A`` and a starting kernel."""
  rng = _rng(seed, salt)
  n = rng.standard_normal((D, D))
  a = jnp.asarray((n + n.T) / (2 * math.sqrt(D)))
  return a, _kernel(_haar(rng, (H, D, R))), rng


@functools.partial(jax.jit, static_argnames=("tx", "steps"))
def _trajectory(tx, w0, a, scale, decay, steps):
  """``steps`` updates of ``tx`` on ``f(W) = -tr(W^T A W)``.

  The gradient fed to ``tx`` is ``scale * (-2 A W) + decay * W`` (a coupled L2 term
  when ``decay > 0``). Compiled once per transform object.
  """

  def body(carry, _):
    w, state = carry
    g = scale * (-2.0 * jnp.einsum("de,ehr->dhr", a, w)) + decay * w
    u, state = tx.update(g, state, w)
    return (optax.apply_updates(w, u), state), None

  (w, _), _ = jax.lax.scan(body, (w0, tx.init(w0)), None, length=steps)
  return w


# Transforms are built once, so their compiled trajectories are reused across calls.
_tx = functools.lru_cache(maxsize=None)


@_tx
def _adam(lr=1.0, eps=1e-8, max_norm=TAU, moment="scalar"):
  return riemannian_adam(lr, 0.9, 0.999, eps, max_norm, moment=moment)


@_tx
def _retract():
  return transforms.polar_retract()


@_tx
def _cap():
  return transforms.step_norm_cap(TAU)


@_tx
def _stiefel_adamw(weight_decay):
  return stiefel_adamw(0.01, weight_decay=weight_decay)


@_tx
def _sgd(lr=0.02):
  return riemannian_sgd(lr)


@_tx
def _euclidean_adam(lr=1e-2):
  return optax.adamw(lr, weight_decay=0.0)


@_tx
def _moment(b1=0.9, b2=0.999, eps=0.0):
  return transforms.scalar_moment(b1, b2, eps)


class _ColumnMomentState(NamedTuple):
  count: jax.Array
  mu: Any
  nu: Any


def _column_moment(b1: float, b2: float, eps: float, axis: int) -> optax.GradientTransformation:
  """Riemannian Adam moment with ``v`` summed over ``axis`` of each frame.

  ``axis=-2`` (sum over rows): one ``v`` per column, constant down each column, so the
  update is ``O(d)``-equivariant (Proposition 7). ``axis=-1``: one ``v`` per row,
  varying down the columns: not equivariant (the converse of Proposition 7).
  """
  spec = FrameSpec()

  def init_fn(params):
    frames = spec.to_frames(params)
    nu = jnp.zeros_like(jnp.sum(frames, axis=axis, keepdims=True))
    return _ColumnMomentState(jnp.zeros([], jnp.int32), jnp.zeros_like(params), nu)

  def update_fn(updates, state, params=None):
    w, xi = spec.to_frames(params), spec.to_frames(updates)
    count = state.count + 1
    m = geometry.stiefel_project(w, b1 * spec.to_frames(state.mu) + (1 - b1) * xi)
    v = b2 * state.nu + (1 - b2) * jnp.sum(jnp.square(xi), axis=axis, keepdims=True)
    t = count.astype(xi.dtype)
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    step = geometry.stiefel_project(w, m_hat / (jnp.sqrt(v_hat) + eps))
    return (
      spec.from_frames(step, updates.shape),
      _ColumnMomentState(count, spec.from_frames(m, updates.shape), v),
    )

  return optax.GradientTransformation(init_fn, update_fn)


@_tx
def _column_adam(axis: int, lr: float):
  return optax.chain(
    transforms.stiefel_project(),
    _column_moment(0.9, 0.999, 1e-8, axis),
    optax.scale_by_learning_rate(lr),
    transforms.step_norm_cap(TAU),
    transforms.polar_retract(),
  )


# ----------------------------------------------------------------------------
# Proposition 1: gauge directions carry no gradient; the gauge is the joint O(r).
# ----------------------------------------------------------------------------


def joint_action_invariance(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The joint action ``(W_Q R, W_K R)``, ``R`` in ``O(r)``, leaves the scores unchanged.

  Attention scores ``S = (X W_Q)(X W_K)^T / sqrt(r)`` per head; residual
  ``max|S(W_Q R, W_K R) - S| / max|S|`` with one random ``R`` per head (Proposition 1:
  the joint ``O(r)`` is the gauge of attention). Control: the per-frame action
  ``(W_Q R, W_K)``, which is not a symmetry.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.joint_action_invariance()
    >>> c.proposition, c.passed
    ('1', True)

  Args:
    seed: the random draw.
    vacuous: apply the per-frame action in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    p, rng = _attention_problem(seed)
    rot = _kernel(_haar(rng, (H, R, R)))  # (r, H, r): one R per head
    rotate = lambda w: jnp.einsum("dhr,rhs->dhs", w, rot)
    s0 = _scores_jit(p.x, p.w_q, p.w_k)
    s1 = _scores_jit(p.x, rotate(p.w_q), p.w_k if control else rotate(p.w_k))
    return jnp.max(jnp.abs(s1 - s0)) / jnp.max(jnp.abs(s0))

  return _certify("joint_action_invariance", "1", measure, vacuous)


def joint_gauge_gradient(
  seed: int = 0, *, grads: Optional[tuple] = None, vacuous: bool = False
) -> Certificate:
  """A true gradient has no component along the joint gauge orbit (Proposition 1).

  Residual: the largest ``joint`` fraction of :func:`stiefax.diagnostics.gauge_content`
  over heads, for ``jax.grad`` of a multi-head attention loss of ``(W_Q, W_K)``.
  Control: a random Gaussian tensor pair in place of the gradient.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.joint_gauge_gradient()
    >>> c.proposition, c.passed
    ('1', True)

  Args:
    seed: the random draw.
    grads: ``(g_Q, g_K)`` to certify instead of the true gradient (``(D, H, R)``
      kernels), e.g. a random pair, which fails.
    vacuous: feed the control's random pair to the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    p, rng = _attention_problem(seed)
    if control:
      g_q, g_k = (jnp.asarray(rng.standard_normal((D, H, R))) for _ in range(2))
    elif grads is not None:
      g_q, g_k = (jnp.asarray(g, jnp.float64) for g in grads)
    else:
      g_q, g_k = _attention_grad(p.x, p.w_v, p.target, p.w_q, p.w_k)
    return jnp.max(_gauge_jit(p.w_q, p.w_k, g_q, g_k).joint)

  return _certify("joint_gauge_gradient", "1", measure, vacuous)


def gauge_orbit_derivative(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The loss is flat along the joint orbit: ``d/dt L(W_Q e^{t Omega}, W_K e^{t Omega}) = 0``.

  The proof of Proposition 1, by forward-mode differentiation: the directional
  derivative along ``(W_Q Omega, W_K Omega)`` (``Omega`` skew, one per head), relative
  to ``||grad L|| ||(W_Q Omega, W_K Omega)||``. Control: the per-frame direction
  ``(W_Q Omega, 0)``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.gauge_orbit_derivative()
    >>> c.proposition, c.passed
    ('1', True)

  Args:
    seed: the random draw.
    vacuous: differentiate along the per-frame direction in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    p, rng = _attention_problem(seed)
    omega = _skew(rng.standard_normal((H, R, R)))
    t_q = _kernel(_frames(p.w_q) @ omega)
    t_k = jnp.zeros_like(p.w_k) if control else _kernel(_frames(p.w_k) @ omega)
    deriv = _attention_jvp(p.x, p.w_v, p.target, p.w_q, p.w_k, t_q, t_k)
    g_q, g_k = _attention_grad(p.x, p.w_v, p.target, p.w_q, p.w_k)
    g_norm = jnp.sqrt(jnp.sum(g_q**2) + jnp.sum(g_k**2))
    t_norm = jnp.sqrt(jnp.sum(t_q**2) + jnp.sum(t_k**2))
    return jnp.abs(deriv) / (g_norm * t_norm)

  return _certify("gauge_orbit_derivative", "1", measure, vacuous)


# ----------------------------------------------------------------------------
# Proposition 2: steepest descent in the embedded metric; the Grassmann split (12).
# ----------------------------------------------------------------------------


def _gradient_at_point(seed: int, salt: int):
  """A query-kernel gradient of the attention loss and its point, as frames."""
  p, _ = _attention_problem(seed + 7919 * salt)
  g, _ = _attention_grad(p.x, p.w_v, p.target, p.w_q, p.w_k)
  return _frames(p.w_q), _frames(g)


def tangent_projection(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``stiefax.stiefel_project`` is the orthogonal projection onto ``T_W St`` (eq. 3).

  Residual: the largest of ``|W^T xi + xi^T W|``, ``|Pi(xi) - xi|`` (idempotence) and
  ``|<xi, g - xi>|`` (orthogonality), relative to ``||g||``, for ``xi = Pi_W g``: the
  embedded-metric Riemannian gradient (Proposition 2). Control: the canonical gradient
  ``g - W g^T W`` in place of ``Pi_W``: tangent, but not the orthogonal projection.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.tangent_projection()
    >>> c.proposition, c.passed
    ('2', True)

  Args:
    seed: the random draw.
    vacuous: certify the canonical gradient instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    w, g = _gradient_at_point(seed, 2)
    kind = "canonical" if control else "stiefel"
    xi = _project(g, w, kind)
    again = _project(xi, w, kind)
    s = _mT(w) @ xi
    scale = _norm(g)[:, None, None]
    tangency = np.max(np.abs(s + _mT(s)) / scale)
    idempotence = np.max(np.abs(again - xi) / scale)
    orthogonality = np.max(np.abs(_inner(xi, g - xi)) / _norm(g) ** 2)
    return max(tangency, idempotence, orthogonality)

  return _certify("tangent_projection", "2", measure, vacuous)


def riemannian_gradient(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``Pi_W g`` is the Riemannian gradient: ``d/dt f(polar(W + t xi)) = <Pi_W g, xi>``.

  For random tangent directions ``xi`` the derivative of the loss along the retraction
  curve (forward mode through ``stiefax.geometry.polar``) equals the embedded-metric
  inner product with ``Pi_W g`` (Proposition 2); residual relative to
  ``||Pi_W g|| ||xi||``. Control: the canonical gradient in place of ``Pi_W g``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.riemannian_gradient()
    >>> c.proposition, c.passed
    ('2', True)

  Args:
    seed: the random draw.
    vacuous: use the canonical gradient in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    p, rng = _attention_problem(seed + 2)
    w = _frames(p.w_q)
    g = _frames(_attention_grad(p.x, p.w_v, p.target, p.w_q, p.w_k)[0])
    grad = _project(g, w, "canonical" if control else "stiefel")
    xis = np.stack([_project(rng.standard_normal(w.shape), w) for _ in range(3)])
    derivs = np.asarray(
      _retraction_derivatives(p.x, p.w_v, p.target, jnp.asarray(w), p.w_k, jnp.asarray(xis))
    )
    scale = np.linalg.norm(_project(g, w)) * np.sqrt(np.sum(xis**2, axis=(1, 2, 3)))
    return np.max(np.abs(derivs - np.sum(grad[None] * xis, axis=(1, 2, 3))) / scale)

  return _certify("riemannian_gradient", "2", measure, vacuous)


def steepest_descent(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``Pi_W g / ||Pi_W g||`` is the steepest unit tangent direction (Proposition 2).

  Residual: ``|<g, xi*> - ||Pi_W g||| / ||Pi_W g||`` for ``xi* = Pi_W g / ||Pi_W g||``
  plus how much any of 512 random unit tangent directions (and perturbations of
  ``xi*``) beats ``xi*``. Control: the Grassmann direction ``Pi^h_W g / ||Pi^h_W g||``
  (PA16), whose decrease falls short by ``1 - sqrt(1 - rho^2)`` (eq. 12; about 3% at
  the paper's ``rho = 0.24``).

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.steepest_descent()
    >>> c.proposition, c.passed
    ('2', True)

  Args:
    seed: the random draw.
    vacuous: certify the Grassmann direction instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    w, g = _gradient_at_point(seed, 3)
    rng = _rng(seed, 3)
    best = _project(g, w, "grassmann" if control else "stiefel")
    best = best / _norm(best)[:, None, None]
    xi_norm = _norm(_project(g, w))
    value = _inner(g, best)
    identity = np.max(np.abs(value - xi_norm) / xi_norm)
    # 256 random unit tangents and 256 small perturbations of the candidate, projected
    # at once through the shipped transform (as one kernel of K * H frames).
    noise = rng.standard_normal((512,) + w.shape)
    noise[256:] = best[None] + 1e-3 * noise[256:]
    flat = noise.reshape((-1,) + w.shape[-2:])
    proj = _project(flat, np.broadcast_to(w[None], noise.shape).reshape(flat.shape))
    proj = proj.reshape(noise.shape)
    proj = proj / _norm(proj)[..., None, None]
    beat = np.max((_inner(proj, g[None]) - value[None]) / xi_norm[None])
    return max(identity, max(beat, 0.0))

  return _certify("steepest_descent", "2", measure, vacuous)


def grassmann_split(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``||Pi_W g||^2 = ||Pi^h_W g||^2 + ||Pi_{G_W} g||^2`` (Proposition 2, eq. 12).

  ``Pi^h_W g = (I - W W^T) g`` (shipped ``grassmann_project``), ``Pi_{G_W} g = W
  skew(W^T g)`` (the per-frame gauge block); residual relative to ``||Pi_W g||^2``.
  Control: the whole vertical block ``W W^T g`` (normal part included) in place of
  ``Pi_{G_W} g``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.grassmann_split()
    >>> c.proposition, c.passed
    ('2 (eq. 12)', True)

  Args:
    seed: the random draw.
    vacuous: use the whole vertical block in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    w, g = _gradient_at_point(seed, 4)
    tangent = _norm(_project(g, w)) ** 2
    horizontal = _norm(_project(g, w, "grassmann")) ** 2
    vertical = w @ (_mT(w) @ g) if control else w @ _skew(_mT(w) @ g)
    return np.max(np.abs(tangent - horizontal - _norm(vertical) ** 2) / tangent)

  return _certify("grassmann_split", "2 (eq. 12)", measure, vacuous)


# ----------------------------------------------------------------------------
# Proposition 3: degree one (fixed step) and degree zero (scalar-moment Adam, eps=0).
# ----------------------------------------------------------------------------


def _first_step(tx, w: np.ndarray, g: np.ndarray) -> np.ndarray:
  """The tangent step of the first update of ``tx``, lifted from its retraction."""
  return _lift(w, w + _update(tx, _kernel(g), _kernel(w)))


def sgd_degree_one(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The fixed-step displacement is degree one: ``xi(c g) = c xi(g)`` (Proposition 3(i)).

  ``stiefax.riemannian_sgd(0.02)``; the tangent step is recovered from the retracted
  point (a Lyapunov equation, solved exactly); residual
  ``max_c ||xi(c g) - c xi(g)|| / ||c xi(g)||`` for ``c`` in ``{0.1, 10}``. Control: the
  scalar-moment Riemannian Adam (``eps = 0``, uncapped), which is degree zero.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.sgd_degree_one()
    >>> c.proposition, c.passed
    ('3(i)', True)

  Args:
    seed: the random draw.
    vacuous: certify the Riemannian Adam step instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    w, g = _gradient_at_point(seed, 5)
    tx = _adam(0.02, eps=0.0, max_norm=None) if control else _sgd(0.02)
    base = _first_step(tx, w, g)
    worst = 0.0
    for c in (0.1, 10.0):
      scaled = _first_step(tx, w, c * g)
      worst = max(worst, np.max(_norm(scaled - c * base) / _norm(c * base)))
    return worst

  return _certify("sgd_degree_one", "3(i)", measure, vacuous)


def sgd_step_norm(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``||xi_sgd||_F = eta ||Pi^h_W g||_F`` per frame (Proposition 3(i)).

  The lifted tangent step of ``stiefax.riemannian_sgd(0.02)`` (Grassmann projector);
  residual relative. Control: ``eta ||g||_F``, the ambient gradient norm.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.sgd_step_norm()
    >>> c.proposition, c.passed
    ('3(i)', True)

  Args:
    seed: the random draw.
    vacuous: compare with ``eta ||g||_F`` in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    w, g = _gradient_at_point(seed, 6)
    lr = 0.02
    step = _norm(_first_step(_sgd(lr), w, g))
    target = lr * (_norm(g) if control else _norm(_project(g, w, "grassmann")))
    return np.max(np.abs(step - target) / target)

  return _certify("sgd_step_norm", "3(i)", measure, vacuous)


def _scale_free_residual(tx, seed: int, salt: int, steps: int = 10) -> float:
  """``max_c max|W_T(c g) - W_T(g)|`` over ``c`` in ``{1e-3, 1e3}``: trajectories."""
  a, w0, _ = _quadratic(seed, salt)
  ref = _trajectory(tx, w0, a, 1.0, 0.0, steps)
  return max(
    float(jnp.max(jnp.abs(_trajectory(tx, w0, a, c, 0.0, steps) - ref))) for c in (1e-3, 1e3)
  )


def adam_degree_zero(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """Scaling every gradient by ``c`` leaves the Riemannian Adam iterates unchanged.

  ``stiefax.riemannian_adam(1.0, eps=0)`` (the cap binds) for 10 steps on
  ``f(W) = -tr(W^T A W)`` with gradients ``c * grad f``, ``c`` in ``{1e-3, 1e3}``;
  residual ``max|W_T(c) - W_T(1)|`` (Proposition 3(ii)). Control: ``eps = 1e-2``,
  above the tangent-gradient scale at ``c = 1e-3`` (Remark 5).

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.adam_degree_zero()
    >>> c.proposition, c.passed
    ('3(ii)', True)

  Args:
    seed: the random draw.
    vacuous: certify the ``eps = 1e-2`` update instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    return _scale_free_residual(_adam(1.0, eps=1e-2 if control else 0.0), seed, 7)

  return _certify("adam_degree_zero", "3(ii)", measure, vacuous)


def adam_degree_zero_uncapped(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """Degree zero without the cap: ``riemannian_adam(0.05, eps=0, max_norm=None)``.

  As :func:`adam_degree_zero` with the step cap removed (Proposition 3(ii) does not
  need it). Control: ``stiefax.riemannian_sgd(0.05)``, which is degree one.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.adam_degree_zero_uncapped()
    >>> c.proposition, c.passed
    ('3(ii)', True)

  Args:
    seed: the random draw.
    vacuous: certify the fixed-step rule instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    tx = _sgd(0.05) if control else _adam(0.05, eps=0.0, max_norm=None)
    return _scale_free_residual(tx, seed, 8)

  return _certify("adam_degree_zero_uncapped", "3(ii)", measure, vacuous)


def adam_first_step(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The first step of Riemannian Adam at ``eps = 0`` has length ``min(eta, tau sqrt(r))``.

  Whatever the gradient scale (``c`` in ``{1e-6, 1, 1e6}``) and for ``eta`` in
  ``{0.1, 1}`` (uncapped and capped at ``r = 6``): ``m_hat_1 = xi_1``,
  ``sqrt(v_hat_1) = ||xi_1||``, so the displacement is independent of ``||g||``
  (Proposition 3(ii) and the remark after it). Residual relative, on the lifted
  tangent step. Control: ``stiefax.riemannian_sgd(eta)``, whose length follows ``||g||``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.adam_first_step()
    >>> c.proposition, c.passed
    ('3(ii)', True)

  Args:
    seed: the random draw.
    vacuous: certify the fixed-step rule instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    w, g = _gradient_at_point(seed, 9)
    worst = 0.0
    for lr in (0.1, 1.0):
      tx = _sgd(lr) if control else _adam(lr, eps=0.0)
      target = min(lr, TAU * math.sqrt(R))
      for c in (1e-6, 1.0, 1e6):
        length = _norm(_first_step(tx, w, c * g))
        worst = max(worst, float(np.max(np.abs(length - target) / target)))
    return worst

  return _certify("adam_first_step", "3(ii)", measure, vacuous)


# ----------------------------------------------------------------------------
# The Jensen bound ||m_hat_t|| <= sqrt(v_hat_t).
# ----------------------------------------------------------------------------


def _moment_ratio(tx, seed: int, growth: float, steps: int = 60) -> float:
  """``max_t ||m_hat_t|| / sqrt(v_hat_t) - 1`` for a moment at ``eps = 0``.

  The output of the shipped moment at ``eps = 0`` is ``m_hat_t / sqrt(v_hat_t)``, so
  its frame norm is the ratio. The gradients share one direction per frame (the worst
  case for cancellation) with norms ``growth**t`` times a random jitter in [0.5, 1].
  A non-increasing sequence uses ``growth < 1`` and sorts the jitter.
  """
  rng = _rng(seed, 10)
  w = _haar(rng, (H, D, R))
  direction = _project(rng.standard_normal(w.shape), w)
  jitter = rng.uniform(0.5, 1.0, steps)
  if growth <= 1:
    jitter = np.sort(jitter)[::-1]
  wk = _kernel(w)
  state = tx.init(wk)
  update = jax.jit(tx.update)
  worst = -np.inf
  for t in range(steps):
    g = _kernel(direction * (growth**t * jitter[t]))
    out, state = update(g, state, wk)
    worst = max(worst, float(np.max(_norm(_frames(out)))))
  return max(worst - 1.0, 0.0)


def jensen_equal_betas(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``||m_hat_t|| <= sqrt(v_hat_t)`` for every gradient sequence when ``b1 = b2``.

  ``stiefax.scalar_moment(0.9, 0.9, eps=0)`` on a growing sequence (norms ``1.1**t``):
  with equal weights, ``||m_hat_t|| <= sum_s w_s ||xi_s|| <= sqrt(sum_s w_s
  ||xi_s||^2)`` (the projection is non-expansive; Jensen). Residual: the largest excess
  of ``||m_hat_t|| / sqrt(v_hat_t)`` over 1. Control: the default ``b2 = 0.999`` on the
  same sequence, where the bound stated after Proposition 3 fails.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.jensen_equal_betas()
    >>> c.proposition, c.passed
    ('3 (Jensen)', True)

  Args:
    seed: the random draw.
    vacuous: certify the default betas instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    return _moment_ratio(_moment(0.9, 0.999 if control else 0.9), seed, 1.1)

  return _certify("jensen_equal_betas", "3 (Jensen)", measure, vacuous)


def jensen_nonincreasing(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``||m_hat_t|| <= sqrt(v_hat_t)`` at the default betas when gradients do not grow.

  ``stiefax.scalar_moment(0.9, 0.999, eps=0)`` on a sequence of non-increasing norms
  (``0.97**t`` times sorted jitter): for ``b1 <= b2`` the first-moment weights favour
  recent (smaller) gradients, so ``sum_s w_s a_s <= sum_s u_s a_s <= sqrt(sum_s u_s
  a_s^2)`` (Chebyshev, then Jensen). Control: a growing sequence (``1.1**t``).

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.jensen_nonincreasing()
    >>> c.proposition, c.passed
    ('3 (Jensen)', True)

  Args:
    seed: the random draw.
    vacuous: certify the growing sequence instead.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    return _moment_ratio(_moment(0.9, 0.999), seed, 1.1 if control else 0.97)

  return _certify("jensen_nonincreasing", "3 (Jensen)", measure, vacuous)


# ----------------------------------------------------------------------------
# Proposition 6: sigma_min(W + eta) >= 1; rotation bound arctan(tau sqrt(r)).
# ----------------------------------------------------------------------------


def _steps(seed: int, salt: int):
  """A point and tangent steps of Frobenius norm 1e-3 ... 1e3 (plus a rank-1 step)."""
  rng = _rng(seed, salt)
  w = _haar(rng, (H, D, R))
  g = rng.standard_normal(w.shape)
  xi = _project(g, w)
  unit = xi / _norm(xi)[:, None, None]
  steps = [s * unit for s in (1e-3, 1e-1, 1.0, 10.0, 1e3)]
  u = _project(rng.standard_normal(w.shape), w, "grassmann")[..., :1]  # horizontal
  v = rng.standard_normal((H, 1, R))
  rank1 = u @ v
  steps.append(3.0 * rank1 / _norm(rank1)[:, None, None])
  return w, g, steps


def sigma_min_tangent(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``sigma_min(W + eta) >= 1`` for every tangent step, capped or not (Proposition 6(i)).

  Tangent steps ``eta = Pi_W g`` (shipped ``stiefel_project``) rescaled to norms
  ``1e-3 ... 1e3``, plus a rank-1 step; residual ``max(0, 1 - sigma_min)``. Control:
  the normal part ``-s W sym(W^T g)`` of the same gradient (what the projection
  removes), scaled to halve the largest singular direction.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.sigma_min_tangent()
    >>> c.proposition, c.passed
    ('6(i)', True)

  Args:
    seed: the random draw.
    vacuous: use the normal step in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    w, g, steps = _steps(seed, 11)
    if control:
      s = _sym(_mT(w) @ g)
      top = np.max(np.linalg.eigvalsh(s), axis=-1)[:, None, None]
      steps = [-0.5 * w @ s / top]
    worst = 0.0
    for eta in steps:
      sig = np.linalg.svd(w + eta, compute_uv=False)
      worst = max(worst, float(np.max(1.0 - sig[..., -1])))
    return max(worst, 0.0)

  return _certify("sigma_min_tangent", "6(i)", measure, vacuous)


def gram_identity(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``(W + eta)^T (W + eta) = I + eta^T eta`` for tangent ``eta`` (proof of Prop. 6(i)).

  Residual ``max|(W + eta)^T (W + eta) - I - eta^T eta| / (1 + ||eta||^2)`` over the
  steps of :func:`sigma_min_tangent`. Control: the un-projected gradient step.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.gram_identity()
    >>> c.proposition, c.passed
    ('6(i)', True)

  Args:
    seed: the random draw.
    vacuous: use the un-projected step in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    w, g, steps = _steps(seed, 12)
    if control:
      steps = [g / _norm(g)[:, None, None]]
    worst = 0.0
    for eta in steps:
      a = w + eta
      lhs = _mT(a) @ a - np.eye(R) - _mT(eta) @ eta
      worst = max(worst, float(np.max(np.abs(lhs) / (1.0 + _norm(eta)[:, None, None] ** 2))))
    return worst

  return _certify("gram_identity", "6(i)", measure, vacuous)


def angle_bound(
  seed: int = 0, *, max_norm: Optional[float] = TAU, vacuous: bool = False
) -> Certificate:
  """One capped Riemannian Adam step rotates a frame by at most ``arctan(tau sqrt(r))``.

  ``stiefax.riemannian_adam(1.0, max_norm=tau)`` (``tau = 0.1``) from random and
  worst-case rank-1 gradients at scales ``1e-4 ... 1e4``; the largest principal angle
  between ``col(W)`` and ``col(W_new)``; residual ``max(0, angle - arctan(tau
  sqrt(r)))`` in radians (Proposition 6(ii)). Control: the uncapped step of the same
  gradients (``max_norm=None``), which rotates by up to 45 degrees at ``eta = 1``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.angle_bound()
    >>> c.proposition, c.passed
    ('6(ii)', True)

  Args:
    seed: the random draw.
    max_norm: the cap of the update under test (``None``: uncapped, which fails); the
      bound is always ``arctan(0.1 sqrt(r))``.
    vacuous: certify the uncapped step.

  Returns:
    A :class:`Certificate`.
  """
  bound = math.atan(TAU * math.sqrt(R))

  def measure(control):
    rng = _rng(seed, 13)
    w = _haar(rng, (H, D, R))
    horizontal = _project(rng.standard_normal(w.shape), w, "grassmann")
    grads = [rng.standard_normal(w.shape), horizontal[..., :1] @ rng.standard_normal((H, 1, R))]
    tx = _adam(1.0, max_norm=None if control else max_norm)
    worst = 0.0
    for g in grads:
      for c in (1e-4, 1.0, 1e4):
        new = w + _update(tx, _kernel(c * g), _kernel(w))
        worst = max(worst, _max_angle(w, new))
    return max(worst - bound, 0.0)

  return _certify("angle_bound", "6(ii)", measure, vacuous)


def angle_tangents(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``tan theta_i = sigma_i(K (I + Omega)^{-1})`` for ``eta = W Omega + W_perp K``.

  The identity behind Proposition 6(ii): the tangents of the principal angles between
  ``col(W)`` and ``col(W + eta)`` (computed from the shipped ``polar``) are the
  singular values of ``K (I + Omega)^{-1}``; residual relative to the largest.
  Control: ``sigma_i(K)``, dropping ``(I + Omega)^{-1}``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.angle_tangents()
    >>> c.proposition, c.passed
    ('6(ii)', True)

  Args:
    seed: the random draw.
    vacuous: compare with ``sigma_i(K)`` in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    rng = _rng(seed, 14)
    full = _haar(rng, (H, D, D))
    w, w_perp = full[..., :R], full[..., R:]
    omega = _skew(rng.standard_normal((H, R, R)))
    k = 0.3 * rng.standard_normal((H, D - R, R))
    eta = w @ omega + w_perp @ k
    u = _polar(w + eta)
    measured = np.sort(_principal_tangents(w, u), axis=-1)
    m = k if control else k @ np.linalg.inv(np.eye(R) + omega)
    expected = np.sort(np.linalg.svd(m, compute_uv=False), axis=-1)
    return np.max(np.abs(measured - expected)) / np.max(expected)

  return _certify("angle_tangents", "6(ii)", measure, vacuous)


def retraction_isometry(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``stiefax.polar_retract`` lands on ``St(d, r)`` for every tangent step (Prop. 6(i)).

  Since ``sigma_min(W + eta) >= 1`` the polar factor is unique and well conditioned,
  so the shipped matrix-product retraction (``method="auto"``) is exact to float64
  rounding for steps of norm ``1e-3 ... 1e3``; residual ``max|W_new^T W_new - I|``.
  Control: ``W + eta`` without the retraction.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.retraction_isometry()
    >>> c.proposition, c.passed
    ('6(i)', True)

  Args:
    seed: the random draw.
    vacuous: skip the retraction in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    w, _, steps = _steps(seed, 15)
    tx = _retract()
    worst = 0.0
    for eta in steps[:4]:
      new = w + eta if control else w + _update(tx, _kernel(eta), _kernel(w))
      gram = _mT(new) @ new
      worst = max(worst, float(np.max(np.abs(gram - np.eye(R)))))
    return worst

  return _certify("retraction_isometry", "6(i)", measure, vacuous)


# ----------------------------------------------------------------------------
# Proposition 7: O(d)-equivariance (Table 9).
# ----------------------------------------------------------------------------


def _violation(tx, seed: int) -> float:
  return float(diagnostics.equivariance_violation(tx, key=jax.random.key(seed)))


def scalar_moment_equivariance(
  seed: int = 0, *, tx: Optional[optax.GradientTransformation] = None, vacuous: bool = False
) -> Certificate:
  """The corrected Riemannian Adam is ``O(d)``-equivariant (Proposition 7, Table 9).

  :func:`stiefax.diagnostics.equivariance_violation` of ``stiefax.riemannian_adam()``
  (``d=24, r=6``, three heads, 15 steps, worst of 5 rotations). Control: the
  elementwise ("naive") Riemannian Adam, ``riemannian_adam(0.03, moment="elementwise")``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.scalar_moment_equivariance()
    >>> c.proposition, c.passed
    ('7', True)

  Args:
    seed: the random draw.
    tx: the transform to certify instead (e.g. the elementwise moment, which fails).
    vacuous: certify the elementwise moment.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    if control:
      return _violation(_adam(0.03, moment="elementwise"), seed)
    return _violation(_adam() if tx is None else tx, seed)

  return _certify("scalar_moment_equivariance", "7", measure, vacuous)


def per_column_equivariance(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """A per-column second moment is ``O(d)``-equivariant too (Proposition 7).

  Riemannian Adam whose ``v`` is one scalar per column of each frame (constant down
  the columns; ``xi -> xi D``). Control: one ``v`` per *row* (varying down the
  columns), which is not: the converse of Proposition 7.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.per_column_equivariance()
    >>> c.proposition, c.passed
    ('7', True)

  Args:
    seed: the random draw.
    vacuous: certify the per-row moment.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    return _violation(_column_adam(-1, 0.03) if control else _column_adam(-2, 1.0), seed)

  return _certify("per_column_equivariance", "7", measure, vacuous)


def sgd_equivariance(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """Riemannian SGD (PA16) is ``O(d)``-equivariant (Proposition 7's ingredients).

  Control: Adam with zero decay (the "AdamW" row of Table 9), ``optax.adamw(1e-2,
  weight_decay=0)``, whose violation is of the order of ``W``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.sgd_equivariance()
    >>> c.proposition, c.passed
    ('7', True)

  Args:
    seed: the random draw.
    vacuous: certify Adam.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    return _violation(_euclidean_adam(1e-2) if control else _sgd(0.02), seed)

  return _certify("sgd_equivariance", "7", measure, vacuous)


def equivariance_ingredients(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """Each ingredient commutes with ``W -> Q^T W`` (the proof of Proposition 7).

  For a random ``Q`` in ``O(d)``: ``Pi_{Q^T W}(Q^T g) = Q^T Pi_W g`` (shipped
  ``stiefel_project``), ``cap(Q^T eta) = Q^T cap(eta)`` (``step_norm_cap``),
  ``polar(Q^T A) = Q^T polar(A)`` (``geometry.polar``) and a per-column scaling
  ``(Q^T xi) D = Q^T (xi D)``; residual: the largest. Control: an entrywise scaling
  ``xi / sqrt(V)`` with ``V`` varying down the columns (the elementwise moment's form).

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.equivariance_ingredients()
    >>> c.proposition, c.passed
    ('7', True)

  Args:
    seed: the random draw.
    vacuous: use the entrywise scaling in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    rng = _rng(seed, 16)
    w = _haar(rng, (H, D, R))
    g = rng.standard_normal(w.shape)
    q = _haar(rng, (D, D))
    rot = lambda x: _mT(q)[None] @ x
    if control:
      v = rng.uniform(0.5, 2.0, (H, D, R))
      return np.max(np.abs(rot(g) / v - rot(g / v)))
    diffs = [
      _project(rot(g), rot(w)) - rot(_project(g, w)),
    ]
    cap = _cap()
    capped = lambda x: _update(cap, _kernel(x), _kernel(w))
    diffs.append(capped(rot(g)) - rot(capped(g)))
    a = w + 0.5 * _project(g, w)
    diffs.append(_polar(rot(a)) - rot(_polar(a)))
    scale = rng.uniform(0.5, 2.0, (H, 1, R))
    diffs.append(rot(g) * scale - rot(g * scale))
    return max(float(np.max(np.abs(x))) for x in diffs)

  return _certify("equivariance_ingredients", "7", measure, vacuous)


# ----------------------------------------------------------------------------
# Proposition 8: Pi_W(lambda W) = 0; Proposition 10: decay absorbed by the retraction.
# ----------------------------------------------------------------------------


def decay_is_normal(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``Pi_W(lambda W) = 0``: weight decay has zero Riemannian gradient (Proposition 8).

  ``W = W I_r`` lies in the normal space ``{W S : S = S^T}``; residual
  ``max|Pi_W(lambda W)| / lambda`` through the shipped ``stiefel_project``. Control: a
  point off the manifold (``W + 0.05 N``), where ``W^T W != I``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.decay_is_normal()
    >>> c.proposition, c.passed
    ('8', True)

  Args:
    seed: the random draw.
    vacuous: certify the off-manifold point.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    rng = _rng(seed, 17)
    w = _haar(rng, (H, D, R))
    if control:
      w = w + 0.05 * rng.standard_normal(w.shape)
    lam = 0.05
    return np.max(np.abs(_project(lam * w, w))) / lam

  return _certify("decay_is_normal", "8", measure, vacuous)


def adam_ignores_decay(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """Adding ``lambda W`` to every gradient leaves the Riemannian Adam trajectory unchanged.

  ``stiefax.riemannian_adam()`` for 10 steps on ``f(W) = -tr(W^T A W)`` with and
  without the coupled L2 gradient ``lambda W`` (``lambda = 0.5``); residual
  ``max|W_T(lambda) - W_T(0)|`` (Proposition 8). Control: Euclidean Adam
  (``optax.adamw(1e-2, weight_decay=0)``), which the term moves.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.adam_ignores_decay()
    >>> c.proposition, c.passed
    ('8', True)

  Args:
    seed: the random draw.
    vacuous: certify Euclidean Adam.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    tx = _euclidean_adam(1e-2) if control else _adam()
    a, w0, _ = _quadratic(seed, 18)
    plain = _trajectory(tx, w0, a, 1.0, 0.0, 10)
    decayed = _trajectory(tx, w0, a, 1.0, 0.5, 10)
    return jnp.max(jnp.abs(decayed - plain))

  return _certify("adam_ignores_decay", "8", measure, vacuous)


def stiefel_adamw_exempts_frames(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``stiefax.stiefel_adamw`` never applies weight decay to frames (Props. 8, 10).

  Two updates of a query/key/value model with ``weight_decay=1.0`` and with 0: the
  query/key frames must agree exactly (the decay term is not formed for them; residual
  ``max|delta W_Q|, |delta W_K|``). Control: the value kernel, which AdamW decays.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.stiefel_adamw_exempts_frames()
    >>> c.proposition, c.passed
    ('10', True)

  Args:
    seed: the random draw.
    vacuous: compare the value kernel in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    rng = _rng(seed, 19)
    params = {
      "query": {"kernel": _kernel(_haar(rng, (H, D, R)))},
      "key": {"kernel": _kernel(_haar(rng, (H, D, R)))},
      "value": {"kernel": jnp.asarray(rng.standard_normal((D, H, R)))},
    }
    grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape)), params)
    finals = []
    for decay in (0.0, 1.0):
      finals.append(_two_steps(_stiefel_adamw(decay), params, grads))
    names = ("value",) if control else ("query", "key")
    return max(
      float(jnp.max(jnp.abs(finals[1][n]["kernel"] - finals[0][n]["kernel"]))) for n in names
    )

  return _certify("stiefel_adamw_exempts_frames", "10", measure, vacuous)


@functools.partial(jax.jit, static_argnames=("tx",))
def _two_steps(tx, params, grads):
  state = tx.init(params)
  for _ in range(2):
    u, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, u)
  return params


def _decay_problem(seed: int, salt: int):
  rng = _rng(seed, salt)
  w = _haar(rng, (H, D, R))
  eta = _project(rng.standard_normal(w.shape), w)
  eta = 0.3 * eta / _norm(eta)[:, None, None]
  return w, eta, 0.1  # eta_lr * lambda


def decay_absorbed(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``polar((1 - eta lambda) W + eta_t) = polar(W + eta_t / (1 - eta lambda))`` (Prop. 10).

  Decoupled decay is absorbed by the retraction at the price of a rescaled step;
  through the shipped ``geometry.polar`` (``"auto"``); residual max-abs. Control:
  ``polar(W + eta_t)`` (forgetting the rescale).

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.decay_absorbed()
    >>> c.proposition, c.passed
    ('10', True)

  Args:
    seed: the random draw.
    vacuous: drop the rescale in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    w, eta, shrink = _decay_problem(seed, 20)
    lhs = _polar((1 - shrink) * w + eta)
    rhs = _polar(w + (eta if control else eta / (1 - shrink)))
    return np.max(np.abs(lhs - rhs))

  return _certify("decay_absorbed", "10", measure, vacuous)


def polar_retract_absorbs_decay(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """``stiefax.polar_retract`` lands on the same point for ``eta_t - eta lambda W`` and
  ``eta_t / (1 - eta lambda)`` (Proposition 10, through the shipped transform).

  Control: the update ``eta_t`` (no rescale).

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.polar_retract_absorbs_decay()
    >>> c.proposition, c.passed
    ('10', True)

  Args:
    seed: the random draw.
    vacuous: drop the rescale in the check.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    w, eta, shrink = _decay_problem(seed, 21)
    tx = _retract()
    lhs = _update(tx, _kernel(eta - shrink * w), _kernel(w))
    rhs = _update(tx, _kernel(eta if control else eta / (1 - shrink)), _kernel(w))
    return np.max(np.abs(lhs - rhs))

  return _certify("polar_retract_absorbs_decay", "10", measure, vacuous)


# ----------------------------------------------------------------------------
# Beyond the paper: manifold Muon and the QR / Cayley retractions.
# ----------------------------------------------------------------------------

MUON_LR = 0.1


@_tx
def _mmuon():
  return muon.manifold_muon(MUON_LR)


def _muon_steps(seed: int, salt: int, control: bool) -> tuple[np.ndarray, np.ndarray]:
  """Frames and the tangent step of ``manifold_muon`` (lifted from its retracted update).

  ``control``: the Euclidean Muon step ``-lr msign(G)`` of ``optax.contrib.muon``.
  """
  rng = _rng(seed, salt)
  w = _haar(rng, (H, D, R))
  g = rng.standard_normal(w.shape)
  if control:
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    return w, -MUON_LR * (u @ vt)
  return w, _lift(w, w + _update(_mmuon(), _kernel(g), _kernel(w)))


def mmuon_tangent(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The manifold Muon step is tangent: ``W^T eta + eta^T W = 0``.

  One update of ``stiefax.manifold_muon(0.1)`` from a fresh state; its polar
  retraction is undone exactly (:func:`_lift`) and the residual is
  ``max|W^T eta + eta^T W| / lr``. Control: the Euclidean Muon step
  ``-lr msign(G)`` (``optax.contrib.muon``), which is not tangent.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.mmuon_tangent()
    >>> c.proposition, c.passed
    ('mMuon', True)

  Args:
    seed: the random draw.
    vacuous: certify the Euclidean Muon step.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    w, eta = _muon_steps(seed, 30, control)
    t = _mT(w) @ eta
    return np.max(np.abs(t + _mT(t))) / MUON_LR

  return _certify("mmuon_tangent", "mMuon", measure, vacuous)


def mmuon_spectral_norm(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The manifold Muon step has spectral norm at most the rate: ``||eta||_2 <= lr``.

  Residual ``max(max_h ||eta_h||_2 / lr - 1, 0)`` for the lifted step of
  :func:`mmuon_tangent`, over gradients scaled by ``1e-4, 1, 1e4``. Control: the
  tangent gradient scaled to the Frobenius ball of the same radius scale,
  ``||eta||_F = lr sqrt(r)`` (the shape of the Riemannian Adam cap), whose spectral
  norm exceeds ``lr`` unless all its singular values are equal.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.mmuon_spectral_norm()
    >>> c.proposition, c.passed
    ('mMuon', True)

  Args:
    seed: the random draw.
    vacuous: certify the Frobenius-ball step.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    rng = _rng(seed, 31)
    w = _haar(rng, (H, D, R))
    worst = 0.0
    for scale in (1e-4, 1.0, 1e4):
      g = scale * rng.standard_normal(w.shape)
      if control:
        xi = _project(g, w)
        eta = MUON_LR * math.sqrt(R) * xi / _norm(xi)[:, None, None]
      else:
        eta = _lift(w, w + _update(_mmuon(), _kernel(g), _kernel(w)))
      worst = max(worst, float(np.max(np.linalg.norm(eta, 2, axis=(-2, -1)))) / MUON_LR - 1)
    return max(worst, 0.0)

  return _certify("mmuon_spectral_norm", "mMuon", measure, vacuous)


def scipy_spectral_step(w: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, Any]:
  """``max tr(G^T A)`` s.t. ``||A||_2 <= 1``, ``A`` tangent, by scipy's SLSQP.

  Independent of the dual solver: ``A = W Omega + W_perp K`` (``Omega`` skew) spans
  the tangent space, and the spectral ball is the smooth equality
  ``A^T A + L L^T = I`` with a lower-triangular slack ``L``; exact Jacobians. The
  returned direction is divided by ``max(1, ||A||_2)`` so that it is feasible.

  Returns:
    ``(A, result)``: the direction and scipy's ``OptimizeResult``.
  """
  import scipy.linalg  # pylint: disable=g-import-not-at-top
  import scipy.optimize  # pylint: disable=g-import-not-at-top

  d, r = w.shape
  w_perp = scipy.linalg.null_space(w.T)
  basis = []
  for i, j in zip(*np.triu_indices(r, 1)):
    om = np.zeros((r, r))
    om[i, j], om[j, i] = 1.0, -1.0
    basis.append(w @ om)
  for i in range(d - r):
    for j in range(r):
      e = np.zeros((d - r, r))
      e[i, j] = 1.0
      basis.append(w_perp @ e)
  basis = np.stack(basis)
  tril = np.tril_indices(r)
  low_basis = np.zeros((len(tril[0]), r, r))
  low_basis[np.arange(len(tril[0])), tril[0], tril[1]] = 1.0
  na, iu = len(basis), np.triu_indices(r)
  lin = np.einsum("kdr,dr->k", basis, g / np.linalg.norm(g))

  def split(x):
    return np.einsum("k,kdr->dr", x[:na], basis), np.einsum("k,krs->rs", x[na:], low_basis)

  def eq(x):
    a, low = split(x)
    return (a.T @ a + low @ low.T - np.eye(r))[iu]

  def eq_jac(x):
    a, low = split(x)
    ja = np.einsum("kdr,ds->krs", basis, a)
    jl = np.einsum("krs,ts->krt", low_basis, low)
    ja, jl = ja + _mT(ja), jl + _mT(jl)
    return np.concatenate([ja[:, iu[0], iu[1]], jl[:, iu[0], iu[1]]]).T

  xi = g - w @ _sym(w.T @ g)
  a0 = 0.5 * xi / np.linalg.norm(xi, 2)
  x0 = np.concatenate(
    [
      np.linalg.lstsq(basis.reshape(na, -1).T, a0.ravel(), rcond=None)[0],
      np.linalg.cholesky(np.eye(r) - a0.T @ a0)[tril],
    ]
  )
  zeros = np.zeros(len(x0) - na)
  out = scipy.optimize.minimize(
    lambda x: -lin @ x[:na],
    x0,
    jac=lambda x: -np.concatenate([lin, zeros]),
    constraints=[{"type": "eq", "fun": eq, "jac": eq_jac}],
    method="SLSQP",
    options={"ftol": 1e-15, "maxiter": 1000},
  )
  a, _ = split(out.x)
  return a / max(1.0, float(np.linalg.norm(a, 2))), out


_direction_jit = jax.jit(muon.spectral_tangent_direction, static_argnames=("iterations",))


def mmuon_optimum(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The manifold Muon direction attains the optimum of its subproblem (to 1e-6).

  ``max tr(G^T A)`` subject to ``||A||_2 <= 1`` and ``W^T A + A^T W = 0``, solved by
  :func:`stiefax.muon.spectral_tangent_direction` (40 dual iterations from a cold
  start) and independently by scipy's SLSQP on a smooth reformulation
  (:func:`scipy_spectral_step`), for three frames of ``St(10, 3)``; residual: the
  largest relative objective difference ``|f - f_scipy| / f_scipy``, tolerance
  ``1e-6``. Control: the tangent gradient scaled into the spectral ball, which is
  feasible but not optimal.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.mmuon_optimum()
    >>> c.proposition, c.passed, c.tolerance
    ('mMuon', True, 1e-06)

  Args:
    seed: the random draw.
    vacuous: certify the scaled tangent gradient.

  Returns:
    A :class:`Certificate`.
  """

  def measure(control):
    rng = _rng(seed, 32)
    w = _haar(rng, (3, 10, 3))
    g = rng.standard_normal(w.shape)
    if control:
      xi = _project(g, w)  # (H, d, r) frames through the shipped projector
      a = xi / np.linalg.norm(xi, 2, axis=(-2, -1))[:, None, None]
    else:
      a = np.asarray(_direction_jit(jnp.asarray(w), jnp.asarray(g), iterations=40).direction)
    worst = 0.0
    for h in range(len(w)):
      ref = float(np.sum(g[h] * scipy_spectral_step(w[h], g[h])[0]))
      worst = max(worst, abs(float(np.sum(g[h] * a[h])) - ref) / abs(ref))
    return worst

  return _certify("mmuon_optimum", "mMuon", measure, vacuous, OPTIMUM_TOLERANCE)


@jax.jit
def _retraction_jets(w, xi):
  """``R(0)`` and ``d/dt R(t xi)`` at 0 for polar, QR and Cayley (forward mode)."""
  fns = (
    lambda t: geometry.polar(w + t * xi),
    lambda t: geometry.qr_retract(w, t * xi),
    lambda t: geometry.cayley_retract(w, t * xi),
  )
  zero, one = jnp.zeros([], w.dtype), jnp.ones([], w.dtype)
  return [jax.jvp(f, (zero,), (one,)) for f in fns]


_qr_jit = jax.jit(geometry.qr_retract)
_cayley_jit = jax.jit(geometry.cayley_retract)


@jax.jit
def _uncorrected_cayley_jet(w, xi):
  """Cayley with Wen and Yin's generator ``xi W^T - W xi^T`` (no ``P``): ``R'(0) != xi``."""

  def curve(t):
    om = t * (xi @ jnp.swapaxes(w, -1, -2) - w @ jnp.swapaxes(xi, -1, -2))
    eye = jnp.broadcast_to(jnp.eye(w.shape[-2], dtype=w.dtype), om.shape)
    return jnp.linalg.solve(eye - om / 2, (eye + om / 2) @ w)

  return jax.jvp(curve, (jnp.zeros([], w.dtype),), (jnp.ones([], w.dtype),))


def _retraction_statistic(seed: int, salt: int, kind: str, control: bool) -> float:
  """Isometry after steps of norm ``1e-3 ... 10`` and the first-order jet vs polar."""
  rng = _rng(seed, salt)
  w = _haar(rng, (H, D, R))
  xi = _project(rng.standard_normal(w.shape), w)
  xi = xi / _norm(xi)[:, None, None]
  wj, xij = jnp.asarray(w), jnp.asarray(xi)
  if control:
    if kind == "qr":  # QR without the sign fix (LAPACK's Householder signs)
      q, _ = np.linalg.qr(w)
      return float(np.max(np.abs(q - w)))
    at0, deriv = _uncorrected_cayley_jet(wj, xij)
    return float(jnp.maximum(jnp.max(jnp.abs(at0 - wj)), jnp.max(jnp.abs(deriv - xij))))
  jets = _retraction_jets(wj, xij)
  polar_at0, polar_deriv = jets[0]
  at0, deriv = jets[1 if kind == "qr" else 2]
  worst = max(
    float(jnp.max(jnp.abs(at0 - polar_at0))), float(jnp.max(jnp.abs(deriv - polar_deriv)))
  )
  fn = _qr_jit if kind == "qr" else _cayley_jit
  for c in (1e-3, 1e-1, 1.0, 10.0):
    new = np.asarray(fn(wj, c * xij))
    worst = max(worst, float(np.max(np.abs(_mT(new) @ new - np.eye(R)))))
  return worst


def qr_retraction(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The sign-fixed QR retraction lands on ``St(d, r)`` and agrees with polar to O(t^2).

  :func:`stiefax.geometry.qr_retract`: residual the largest of
  ``max|R^T R - I|`` after tangent steps of norm ``1e-3 ... 10`` and, by forward-mode
  differentiation, ``|qf(W) - polar(W)|`` and ``|d/dt qf(W + t xi) - d/dt polar(W + t
  xi)|`` at ``t = 0`` (equal value and first derivative: the two retractions differ by
  ``O(t^2)``). Control: QR without the sign fix (LAPACK's Householder signs), which
  does not even return ``W`` at ``t = 0``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.qr_retraction()
    >>> c.proposition, c.passed
    ('retraction', True)

  Args:
    seed: the random draw.
    vacuous: certify the unfixed QR.

  Returns:
    A :class:`Certificate`.
  """
  return _certify(
    "qr_retraction",
    "retraction",
    lambda control: _retraction_statistic(seed, 33, "qr", control),
    vacuous,
  )


def cayley_retraction(seed: int = 0, *, vacuous: bool = False) -> Certificate:
  """The Cayley retraction lands on ``St(d, r)`` and agrees with polar to O(t^2).

  :func:`stiefax.geometry.cayley_retract` with ``Omega = P xi W^T - W xi^T P``: as
  :func:`qr_retraction`. Control: Wen and Yin's generator ``xi W^T - W xi^T`` without
  ``P = I - W W^T / 2``, whose curve has derivative ``xi + W (W^T xi) != xi``.

  Example:
    >>> from stiefax import certificates
    >>> c = certificates.cayley_retraction()
    >>> c.proposition, c.passed
    ('retraction', True)

  Args:
    seed: the random draw.
    vacuous: certify the uncorrected generator.

  Returns:
    A :class:`Certificate`.
  """
  return _certify(
    "cayley_retraction",
    "retraction",
    lambda control: _retraction_statistic(seed, 34, "cayley", control),
    vacuous,
  )


#: Every certificate function, in the order of the table.
CERTIFICATES = (
  joint_action_invariance,
  joint_gauge_gradient,
  gauge_orbit_derivative,
  tangent_projection,
  riemannian_gradient,
  steepest_descent,
  grassmann_split,
  sgd_degree_one,
  sgd_step_norm,
  adam_degree_zero,
  adam_degree_zero_uncapped,
  adam_first_step,
  jensen_equal_betas,
  jensen_nonincreasing,
  sigma_min_tangent,
  gram_identity,
  angle_bound,
  angle_tangents,
  retraction_isometry,
  scalar_moment_equivariance,
  per_column_equivariance,
  sgd_equivariance,
  equivariance_ingredients,
  decay_is_normal,
  adam_ignores_decay,
  stiefel_adamw_exempts_frames,
  decay_absorbed,
  polar_retract_absorbs_decay,
  mmuon_tangent,
  mmuon_spectral_norm,
  mmuon_optimum,
  qr_retraction,
  cayley_retraction,
)


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
