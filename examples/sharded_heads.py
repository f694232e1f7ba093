"""Attention heads sharded across devices: the frame update needs no communication.

Each head's W_Q, W_K is its own frame, and every step of `riemannian_adam` (projection,
moments, cap, Newton-Schulz retraction with a fixed iteration count) works frame by
frame. So when the query/key kernels `(d_model, H, head_dim)` are sharded along the
heads axis, each device updates its own heads and the compiled optimizer update holds
no all-reduce or all-gather. stiefax adds nothing for this: the shardings are plain
`jax.sharding.NamedSharding`s, `jax.jit` propagates them into the optimizer state, and
on several hosts the same script runs after `jax.distributed.initialize()`.

On a CPU this script asks XLA for 4 host devices (remove that line on a machine with
several accelerators):

    python examples/sharded_heads.py --steps 200

Prints the device mesh, the sharding of the query kernel and of its first moment, the
collectives found in the compiled optimizer update (none), and the loss and isometry
error during training.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

# pylint: disable=g-import-not-at-top,wrong-import-position
import argparse
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import optax

import stiefax

D, HEADS, R, SEQ, CLASSES = 32, 8, 4, 6, 4


class Classifier(nn.Module):
  """One pre-LN attention block and a linear readout."""

  @nn.compact
  def __call__(self, x):
    h = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS, qkv_features=HEADS * R)(h)
    return nn.Dense(CLASSES)(x.mean(axis=1))


def batch(key, n=64):
  """Which of CLASSES directions hides in a noise sequence."""
  k1, k2, k3 = jax.random.split(key, 3)
  labels = jax.random.randint(k1, (n,), 0, CLASSES)
  protos = jax.random.normal(jax.random.key(7), (CLASSES, D))
  x = 0.5 * jax.random.normal(k2, (n, SEQ, D))
  pos = jax.random.randint(k3, (n,), 0, SEQ)
  return x.at[jnp.arange(n), pos].add(protos[labels]), labels


def collectives(compiled_text):
  return sorted(
    set(
      re.findall(
        r"\b(all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)\b", compiled_text
      )
    )
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  args = parser.parse_args()

  # On several hosts: jax.distributed.initialize() here; jax.devices() is then global.
  mesh = Mesh(jax.devices(), ("heads",))
  print(f"mesh: {dict(mesh.shape)} over {jax.devices()[0].platform} devices")

  model = Classifier()
  x0, _ = batch(jax.random.key(0))
  params = stiefax.flax.project_params(model.init(jax.random.key(1), x0), stiefax.layouts.qk_labels)
  labels = stiefax.layouts.qk_labels(params)

  # Query/key kernels (d_model, heads, head_dim): heads split across the mesh. The
  # rest of this small model is replicated (shard it as your model needs).
  def sharding(label, leaf):
    spec = P(None, "heads", None) if label == "stiefel" else P()
    return NamedSharding(mesh, spec)

  shardings = jax.tree.map(sharding, labels, params)
  params = jax.device_put(params, shardings)
  tx = stiefax.stiefel_adamw(3e-3, weight_decay=0.01, labels=labels)
  # Built outside jit, the state is sharded like the params (zeros_like); under jit
  # its shardings would be left to the compiler unless given as out_shardings.
  state = tx.init(params)
  query = params["params"]["MultiHeadDotProductAttention_0"]["query"]["kernel"]
  print(f"query kernel {query.shape} sharding: {query.sharding.spec}")
  per_frame = [leaf for leaf in jax.tree.leaves(state) if leaf.shape == (HEADS,)]
  print(
    f"per-frame state (second moment, skip counters): {len(per_frame)} leaves"
    f" of shape ({HEADS},), sharding {per_frame[0].sharding.spec}"
  )

  grads = jax.tree.map(jnp.ones_like, params)
  update_text = jax.jit(tx.update).lower(grads, state, params).compile().as_text()
  print(f"collectives in the compiled optimizer update: {collectives(update_text) or 'none'}")

  def loss_fn(params, x, y):
    logits = model.apply(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  def step(params, state, key):
    x, y = batch(key)
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  keys = jax.random.split(jax.random.key(2), args.steps)
  for i, key in enumerate(keys, 1):
    params, state, loss = step(params, state, key)
    if i == 1 or i % max(args.steps // 4, 1) == 0 or i == args.steps:
      iso = float(stiefax.diagnostics.isometry_error(params, labels))
      print(f"step {i:4d}  loss {float(loss):.4f}  isometry {iso:.2e}")
  query = params["params"]["MultiHeadDotProductAttention_0"]["query"]["kernel"]
  print(f"after training, query kernel sharding: {query.sharding.spec}")


if __name__ == "__main__":
  main()
