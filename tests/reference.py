"""Float64 NumPy reference of the Riemannian update, written from the paper's section 3.2.

Independent of stiefax: frames are ``(H, d, r)`` arrays, one loop over heads, the polar
factor from NumPy's SVD. Used by the tests to check every transform and alias.
"""

import numpy as np


def sym(a):
  return 0.5 * (a + a.T)


def stiefel_project(w, g):
  return g - w @ sym(w.T @ g)


def grassmann_project(w, g):
  return g - w @ (w.T @ g)


def canonical_gradient(w, g):
  return g - w @ g.T @ w


PROJECT = {
  "stiefel": stiefel_project,
  "grassmann": grassmann_project,
  "canonical": canonical_gradient,
}


def polar(a):
  u, _, vt = np.linalg.svd(a, full_matrices=False)
  return u @ vt


def qr_retract(w, eta):
  """``qf(W + eta)`` with ``diag(R) > 0``."""
  q, r = np.linalg.qr(w + eta)
  return q * np.sign(np.diag(r))


def cayley_retract(w, eta):
  """The dense Cayley transform of ``Omega = P eta W^T - W eta^T P``, ``P = I - W W^T / 2``."""
  eye = np.eye(w.shape[0])
  p = eye - 0.5 * w @ w.T
  om = p @ eta @ w.T - w @ eta.T @ p
  return np.linalg.solve(eye - om / 2, (eye + om / 2) @ w)


RETRACT = {
  "polar": lambda w, eta: polar(w + eta),
  "qr": qr_retract,
  "cayley": cayley_retract,
}


class RiemannianAdam:
  """One frame at a time, exactly as listed in section 3.2 of the paper."""

  def __init__(
    self,
    lr=1.0,
    b1=0.9,
    b2=0.999,
    eps=1e-8,
    max_norm=0.1,
    projector="stiefel",
    moment="scalar",
    retraction="polar",
  ):
    self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps
    self.max_norm, self.projector, self.moment = max_norm, projector, moment
    self.retraction = retraction
    self.transport = grassmann_project if projector == "grassmann" else stiefel_project
    self.m = self.v = None
    self.t = 0

  def step(self, w, g):
    """``w``, ``g``: ``(H, d, r)``. Returns the new ``w``."""
    if self.m is None:
      self.m = np.zeros_like(w)
      self.v = np.zeros_like(w) if self.moment == "elementwise" else np.zeros(w.shape[0])
    self.t += 1
    out = np.empty_like(w)
    for h in range(w.shape[0]):
      W = w[h]
      xi = PROJECT[self.projector](W, g[h])
      m = self.b1 * self.transport(W, self.m[h]) + (1 - self.b1) * xi
      if self.moment == "elementwise":
        v = self.b2 * self.v[h] + (1 - self.b2) * xi**2
      else:
        v = self.b2 * self.v[h] + (1 - self.b2) * np.sum(xi**2)
      self.m[h], self.v[h] = m, v
      m_hat = m / (1 - self.b1**self.t)
      v_hat = v / (1 - self.b2**self.t)
      step = self.transport(W, m_hat / (np.sqrt(v_hat) + self.eps))
      eta = -self.lr * step
      if self.max_norm is not None:
        limit = self.max_norm * np.sqrt(W.shape[1])
        norm = np.linalg.norm(eta)
        if norm > limit:
          eta = eta * (limit / norm)
      out[h] = RETRACT[self.retraction](W, eta)
    return out


def riemannian_sgd(w, g, lr=0.02, projector="grassmann", retraction="polar"):
  return np.stack(
    [RETRACT[retraction](w[h], -lr * PROJECT[projector](w[h], g[h])) for h in range(len(w))]
  )


def random_frames(rng, shape):
  """Haar-random frames ``(H, d, r)`` in float64."""
  a = rng.standard_normal(shape)
  q, r = np.linalg.qr(a)
  return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]
