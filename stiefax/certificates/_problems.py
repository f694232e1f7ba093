"""The test problems and float64 NumPy helpers shared by the certificates.

Every certificate draws its own problem from ``seeded_rng(seed, salt)``: Haar frames,
an attention loss of ``(W_Q, W_K)``, the quadratic ``f(W) = -tr(W^T A W)``; the
shipped transforms are applied to ``(H, d, r)`` frames through ``one_update``.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stiefax import _diagnostics as diagnostics
from stiefax import _geometry as geometry
from stiefax import _projections

# The test problem: frames of Table 9 (d = 24, r = 6, three heads), the step cap of
# the paper (tau = 0.1), a short sequence of tokens for the attention score function.
D, R, H = 24, 6, 3
TAU = 0.1
TOKENS = 8


def seeded_rng(seed: int, salt: int) -> np.random.Generator:
  return np.random.default_rng([int(seed), salt])


def haar(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
  """Haar-random orthonormal frames ``(..., d, r)`` (QR of a Gaussian, signs fixed)."""
  q, r = np.linalg.qr(rng.standard_normal(shape))
  return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


def as_kernel(frames: np.ndarray) -> jax.Array:
  """``(H, d, r)`` frames -> a ``(d, H, r)`` float64 kernel (the Flax layout)."""
  return jnp.asarray(np.transpose(frames, (1, 0, 2)), jnp.float64)


def as_frames(kernel: jax.typing.ArrayLike) -> np.ndarray:
  """A ``(d, H, r)`` kernel -> ``(H, d, r)`` NumPy float64 frames."""
  return np.transpose(np.asarray(kernel, np.float64), (1, 0, 2))


def mT(x: np.ndarray) -> np.ndarray:
  return np.swapaxes(x, -1, -2)


def skew(a: np.ndarray) -> np.ndarray:
  return 0.5 * (a - mT(a))


def sym(a: np.ndarray) -> np.ndarray:
  return 0.5 * (a + mT(a))


def norm(x: np.ndarray) -> np.ndarray:
  """Frobenius norm of each frame ``(..., d, r) -> (...)``."""
  return np.sqrt(np.sum(np.square(x), axis=(-2, -1)))


def inner(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  return np.sum(x * y, axis=(-2, -1))


@functools.partial(jax.jit, static_argnames=("tx",))
def _fresh_update(tx: optax.GradientTransformation, g: jax.Array, w: jax.Array) -> optax.Updates:
  return tx.update(g, tx.init(w), w)[0]


def one_update(
  tx: optax.GradientTransformation, g: jax.typing.ArrayLike, w: jax.typing.ArrayLike
) -> np.ndarray:
  """One update of ``tx`` from a fresh state, as ``(H, d, r)`` frames (compiled per tx)."""
  return as_frames(_fresh_update(tx, jnp.asarray(g, jnp.float64), jnp.asarray(w, jnp.float64)))


@functools.cache
def _projector(kind: str) -> optax.GradientTransformation:
  return {
    "stiefel": _projections.stiefel_project,
    "grassmann": _projections.grassmann_project,
    "canonical": _projections.canonical_gradient,
  }[kind]()


def project(g: np.ndarray, w: np.ndarray, kind: str = "stiefel") -> np.ndarray:
  """The shipped projection transforms applied to ``(H, d, r)`` frames."""
  return one_update(_projector(kind), as_kernel(g), as_kernel(w))


_polar_jit = jax.jit(geometry.polar, static_argnames=("method",))


def polar(a: np.ndarray) -> np.ndarray:
  """The shipped ``geometry.polar`` (``"auto"``: matrix products only), in float64."""
  return np.asarray(_polar_jit(jnp.asarray(a, jnp.float64)))


def lift(w: np.ndarray, w_new: np.ndarray) -> np.ndarray:
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


def principal_tangents(w: np.ndarray, u: np.ndarray) -> np.ndarray:
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


def max_angle(w: np.ndarray, u: np.ndarray) -> float:
  """Largest principal angle (radians) between ``col(W)`` and ``col(U)``, over frames."""
  return float(np.max(np.arctan(principal_tangents(w, u))))


class Attention(NamedTuple):
  """A multi-head attention loss of ``(W_Q, W_K)``: data and the point."""

  x: jax.Array  # (tokens, d) inputs.
  w_v: jax.Array  # (d, H, r) value kernel.
  target: jax.Array  # (tokens, H, r) readout weights.
  w_q: jax.Array  # (d, H, r) query frames.
  w_k: jax.Array  # (d, H, r) key frames.


def scores(x: jax.Array, wq: jax.Array, wk: jax.Array) -> jax.Array:
  """Attention scores ``(X W_Q)(X W_K)^T / sqrt(r)`` per head, ``(H, n, n)``."""
  q = jnp.einsum("nd,dhr->hnr", x, wq)
  k = jnp.einsum("nd,dhr->hnr", x, wk)
  return jnp.einsum("hnr,hmr->hnm", q, k) / math.sqrt(q.shape[-1])


def attention_loss(
  x: jax.Array, w_v: jax.Array, target: jax.Array, wq: jax.Array, wk: jax.Array
) -> jax.Array:
  """A scalar function of the scores: softmax attention, tanh readout."""
  p = jax.nn.softmax(scores(x, wq, wk), axis=-1)
  out = jnp.einsum("hnm,md,dhr->nhr", p, x, w_v)
  return jnp.sum(jnp.tanh(out) * target)


scores_jit = jax.jit(scores)
attention_grad = jax.jit(jax.grad(attention_loss, argnums=(3, 4)))


@jax.jit
def attention_jvp(
  x: jax.Array,
  w_v: jax.Array,
  target: jax.Array,
  wq: jax.Array,
  wk: jax.Array,
  tq: jax.Array,
  tk: jax.Array,
) -> jax.Array:
  return jax.jvp(lambda a, b: attention_loss(x, w_v, target, a, b), (wq, wk), (tq, tk))[1]


@jax.jit
def retraction_derivatives(
  x: jax.Array,
  w_v: jax.Array,
  target: jax.Array,
  frames: jax.Array,
  wk: jax.Array,
  directions: jax.Array,
) -> jax.Array:
  """``d/dt loss(polar(W + t xi))`` at 0 for each direction ``xi`` (forward mode)."""

  def one(xi: jax.Array) -> jax.Array:
    curve = lambda t: attention_loss(
      x, w_v, target, jnp.swapaxes(geometry.polar(frames + t * xi), 0, 1), wk
    )
    return jax.jvp(curve, (jnp.zeros([], frames.dtype),), (jnp.ones([], frames.dtype),))[1]

  return jax.vmap(one)(directions)


gauge_content_jit = jax.jit(diagnostics.gauge_content)


def attention_problem(seed: int) -> tuple[Attention, np.random.Generator]:
  """A float64 attention problem and the generator that drew it."""
  rng = seeded_rng(seed, 1)
  x = jnp.asarray(rng.standard_normal((TOKENS, D)))
  w_v = jnp.asarray(rng.standard_normal((D, H, R)) / math.sqrt(D))
  target = jnp.asarray(rng.standard_normal((TOKENS, H, R)))
  w_q, w_k = as_kernel(haar(rng, (H, D, R))), as_kernel(haar(rng, (H, D, R)))
  return Attention(x, w_v, target, w_q, w_k), rng


def quadratic(seed: int, salt: int) -> tuple[jax.Array, jax.Array, np.random.Generator]:
  """``f(W) = -tr(W^T A W)`` summed over heads: ``A`` and a starting kernel."""
  rng = seeded_rng(seed, salt)
  n = rng.standard_normal((D, D))
  a = jnp.asarray((n + n.T) / (2 * math.sqrt(D)))
  return a, as_kernel(haar(rng, (H, D, R))), rng


@functools.partial(jax.jit, static_argnames=("tx", "steps"))
def trajectory(
  tx: optax.GradientTransformation,
  w0: jax.Array,
  a: jax.Array,
  scale: jax.typing.ArrayLike,
  decay: jax.typing.ArrayLike,
  steps: int,
) -> jax.Array:
  """``steps`` updates of ``tx`` on ``f(W) = -tr(W^T A W)``.

  The gradient fed to ``tx`` is ``scale * (-2 A W) + decay * W`` (a coupled L2 term
  when ``decay > 0``). Compiled once per transform object. The loop of the Table 9
  experiment (:func:`stiefax.diagnostics.equivariance_violation` runs it unscaled and
  batched over rotations), with the gradient scale and decay of Propositions 3 and 8.
  """

  def body(
    carry: tuple[jax.Array, optax.OptState], _: None
  ) -> tuple[tuple[jax.Array, optax.OptState], None]:
    w, state = carry
    g = scale * (-2.0 * jnp.einsum("de,ehr->dhr", a, w)) + decay * w
    u, state = tx.update(g, state, w)
    return (optax.apply_updates(w, u), state), None

  (w, _), _ = jax.lax.scan(body, (w0, tx.init(w0)), None, length=steps)
  return w


def gradient_at_point(seed: int, salt: int) -> tuple[np.ndarray, np.ndarray]:
  """A query-kernel gradient of the attention loss and its point, as frames."""
  p, _ = attention_problem(seed + 7919 * salt)
  g, _ = attention_grad(p.x, p.w_v, p.target, p.w_q, p.w_k)
  return as_frames(p.w_q), as_frames(g)
