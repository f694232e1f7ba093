"""Small ``(d, heads, r)`` attention kernels, gradients and trajectories shared by the
transform and optimizer tests."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import stiefax
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


def toy_params():
  """A small linen-style tree: two orthonormal (d, H, r) frame kernels (query, key), a
  value kernel, and a dense layer's matrix and bias."""
  init = stiefax.flax.orthonormal_init()
  k = jax.random.split(jax.random.key(0), 4)
  return {
    "params": {
      "attn": {
        "query": {"kernel": init(k[0], (8, 2, 4))},
        "key": {"kernel": init(k[1], (8, 2, 4))},
        "value": {"kernel": 0.3 * jax.random.normal(k[2], (8, 2, 4))},
      },
      "dense": {"kernel": jax.random.normal(k[3], (8, 8)), "bias": jnp.ones(8)},
    }
  }
