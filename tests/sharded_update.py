"""Runs in a subprocess with 4 host devices: a head-sharded update equals the unsharded one.

The tree holds two layers of query and key kernels, which the fused update stacks into
one group: stacking along a new axis keeps each kernel's heads on their devices. Prints
one JSON line: the max difference and the collectives found in the compiled HLO.
"""

import json
import re
import sys

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import optax

import stiefax


def every_frame(params):
  """Labels every leaf a frame (these kernels are not named like Flax's query/kernel)."""
  return jax.tree.map(lambda _: "stiefel", params)


def main():
  devices = jax.devices()
  assert len(devices) == 4, devices
  mesh = Mesh(devices, ("heads",))
  # Two layers of query/key kernels (d_model, heads, head_dim): one group of four.
  init = stiefax.flax.orthonormal_init()
  w = {
    f"layer_{i}": {
      "query": init(jax.random.key(2 * i), (128, 8, 16)),
      "key": init(jax.random.key(2 * i + 1), (128, 8, 16)),
    }
    for i in range(2)
  }
  grads = [
    jax.tree.map(lambda x, i=i: jax.random.normal(jax.random.key(10 + i), x.shape), w)
    for i in range(3)
  ]
  # argv[2]: "heads" (default) shards the heads, "rows" the d_model rows (FSDP-like),
  # whose update reduces each frame's small Gram products but must gather no W.
  rows = len(sys.argv) > 2 and sys.argv[2] == "rows"
  shard = NamedSharding(mesh, P("heads", None, None) if rows else P(None, "heads", None))
  # "capped": the default B2 (fixed Newton-Schulz count); "uncapped": the stopping
  # rule, whose convergence test reduces over all frames (the control).
  tx = (
    stiefax.riemannian_adam(1.0, group_frames=True)
    if sys.argv[1] == "capped"
    else stiefax.riemannian_adam(1.0, max_norm=None, group_frames=True)
  )

  state_specs = []

  def run(w, grads, sharded):
    update = jax.jit(tx.update)
    if sharded:
      w = jax.device_put(w, shard)
      grads = [jax.device_put(g, shard) for g in grads]
    state = tx.init(w)  # outside jit: sharded like the params
    if sharded:
      state_specs.extend(str(x.sharding.spec) for x in jax.tree.leaves(state) if x.ndim)
    for g in grads:
      u, state = update(g, state, w)
      w = optax.apply_updates(w, u)
    hlo = update.lower(grads[0], state, w).compile().as_text()
    return w, hlo

  plain, _ = run(w, grads, False)
  sharded, hlo = run(w, grads, True)
  diff = max(
    float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(sharded))
  )
  collectives = sorted(
    set(re.findall(r"\b(all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)", hlo))
  )
  out_sharding = str(jax.tree.leaves(sharded)[0].sharding.spec)
  print(
    json.dumps(
      {
        "diff": diff,
        "collectives": collectives,
        "sharding": out_sharding,
        "state_shardings": sorted(set(state_specs)),
        "iso": float(stiefax.diagnostics.isometry_error(sharded, every_frame)),
      }
    )
  )


if __name__ == "__main__":
  main()
