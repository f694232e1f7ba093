"""Small ``(d, heads, r)`` attention kernels, gradients and trajectories shared by the
transform and optimizer tests."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tests import reference as ref

D, H, R = 12, 3, 4  # kernels (d_model, heads, head_dim)


def kernel(rng, shape=(D, H, R), dtype=np.float64):
  """A (d, heads, r) kernel whose frames [:, h, :] are orthonormal."""
  w = ref.random_frames(rng, (shape[1], shape[0], shape[2]))
  return jnp.asarray(np.transpose(w, (1, 0, 2)), dtype)


def to_ref(x):
  return np.transpose(np.asarray(x, np.float64), (1, 0, 2))


def trajectory(tx, w, grads):
  """Applies ``tx`` (jitted) along a list of gradients; returns (iterates, final state)."""
  state = tx.init(w)
  step = jax.jit(tx.update)
  out = []
  for g in grads:
    u, state = step(g, state, w)
    w = optax.apply_updates(w, u)
    out.append(w)
  return out, state


def run(tx, w, grads):
  """Applies ``tx`` along a list of gradients; returns the list of iterates."""
  return trajectory(tx, w, grads)[0]


def random_grads(rng, n, shape, decades=3):
  """Gradients whose scale spans ``decades`` orders of magnitude."""
  scales = 10.0 ** rng.uniform(-decades / 2, decades / 2, size=n)
  return [jnp.asarray(s * rng.standard_normal(shape)) for s in scales]
