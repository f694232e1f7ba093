"""What the optimizer update of W_Q, W_K communicates in each sharding layout.

Compiles the update of `stiefel_adamw` (frames only: the query heads `q_einsum/w`
`(H, d, r)` and the key heads of `kv_einsum/w` `(2, K, d, r)` of Gemma's layout, per
layer) on a (data, model) mesh of host devices, and counts every collective in the
compiled HLO with the bytes of its result on one device:

  heads   heads over `model` (tensor parallel)
  fsdp    rows (the d axis) over `data` (FSDP / ZeRO-3)
  both    heads over `model`, rows over `data`
  gather  rows over `data`, but the update gathers each W (and its gradient and
          moments) whole first: the naive way, for reference

    python -m benchmarks.comm_table                      # d=768, H=K=12, r=64, 1 layer
    python -m benchmarks.comm_table --d 32 --heads 4 --kv-heads 2 --head-dim 8 --layers 2
    python -m benchmarks.comm_table --layers 2 --group-frames on   # as accelerators run it

``--group-frames`` chooses how the fused update treats the frame leaves of one shape:
``auto`` as the backend's default (grouped on accelerators, one leaf at a time on the
CPU), ``on`` stacked into one batched pass, ``off`` one leaf at a time.

The counts are the same on several processes (the test suite's two-process run of
`examples/multiprocess.py` counts them there) and on accelerators up to how XLA
combines or splits the same transfers.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

# pylint: disable=g-import-not-at-top,wrong-import-position
import argparse
import datetime
import functools
import re

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

import stiefax

LAYOUTS = ("heads", "fsdp", "both", "gather")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_BYTES = {"f64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s8": 1, "u8": 1, "pred": 1}
_OP = re.compile(r"=\s*(.*?)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(")


def collectives(hlo: str) -> dict[str, dict[str, int]]:
  """Count and bytes (of each result, on one device) of every collective in HLO text."""
  out = {name: {"count": 0, "bytes": 0} for name in COLLECTIVES}
  for line in hlo.splitlines():
    m = _OP.search(line)
    if m is None:
      continue
    shapes, name, _ = m.groups()
    size = 0
    for dtype, dims in re.findall(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]", shapes):
      size += int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64)) * _BYTES.get(
        dtype, 4
      )
    out[name]["count"] += 1
    out[name]["bytes"] += size
  return out


def specs(layout: str) -> tuple[P, P]:
  """PartitionSpecs of ``q_einsum/w`` (H, d, r) and ``kv_einsum/w`` (2, K, d, r)."""
  heads = "model" if layout in ("heads", "both") else None
  rows = "data" if layout in ("fsdp", "both", "gather") else None
  return P(heads, rows, None), P(None, heads, rows, None)


GROUPING = {"auto": None, "on": True, "off": False}


def compile_update(layout, mesh, layers, d, heads, kv_heads, head_dim, group_frames=None):
  """The compiled HLO text of the update of every layer's W_Q, W_K in ``layout``."""
  q_spec, kv_spec = specs(layout)
  init = stiefax.flax.orthonormal_init
  params = {}
  for i in range(layers):
    q = init(stiefax.FrameSpec(row_axis=1))(jax.random.key(2 * i), (heads, d, head_dim))
    kv = init(stiefax.FrameSpec(row_axis=2))(jax.random.key(2 * i + 1), (2, kv_heads, d, head_dim))
    params[f"layer_{i}"] = {
      "attn": {
        "q_einsum": {"w": jax.device_put(q, NamedSharding(mesh, q_spec))},
        "kv_einsum": {"w": jax.device_put(kv, NamedSharding(mesh, kv_spec))},
      }
    }
  stiefel = functools.partial(stiefax.riemannian_adam, group_frames=group_frames)
  tx = stiefax.stiefel_adamw(1e-3, weight_decay=0.01, stiefel=stiefel)
  replicated = NamedSharding(mesh, P())

  def on_mesh(x):
    if isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh:
      return x
    return jax.device_put(x, replicated)

  state = jax.tree.map(on_mesh, tx.init(params))  # sharded like the params
  shardings = jax.tree.map(lambda x: x.sharding, params)
  state_shardings = jax.tree.map(lambda x: x.sharding, state)

  def update(grads, state, params):
    if layout == "gather":
      whole = jax.tree.map(lambda _: replicated, params)
      grads, params = jax.lax.with_sharding_constraint((grads, params), (whole, whole))
      state = jax.lax.with_sharding_constraint(state, jax.tree.map(lambda _: replicated, state))
    return tx.update(grads, state, params)

  fn = jax.jit(
    update,
    in_shardings=(shardings, state_shardings, shardings),
    out_shardings=(shardings, state_shardings),
  )
  grads = jax.tree.map(jnp.ones_like, params)
  return fn.lower(grads, state, params).compile().as_text()


def frame_bytes(layers, d, heads, kv_heads, head_dim):
  """Bytes of all W_Q, W_K (float32)."""
  return 4 * layers * (heads + kv_heads) * d * head_dim


def table(args) -> str:
  """The markdown table of every layout's collectives."""
  n_data, n_model = (int(v) for v in args.mesh.split("x"))
  mesh = Mesh(
    np.array(jax.devices()[: n_data * n_model]).reshape(n_data, n_model), ("data", "model")
  )
  shape = (args.layers, args.d, args.heads, args.kv_heads, args.head_dim)
  lines = [
    f"mesh data={n_data} x model={n_model}; {args.layers} layer(s) of W_Q ({args.heads},"
    f" {args.d}, {args.head_dim}) and W_K ({args.kv_heads}, {args.d}, {args.head_dim}),"
    f" float32, {frame_bytes(*shape):,} bytes in all; jax {jax.__version__},"
    f" {datetime.date.today().isoformat()}; --group-frames {args.group_frames}",
    "",
    "| layout | " + " | ".join(COLLECTIVES) + " | bytes in all |",
    "|---|" + "---|" * (len(COLLECTIVES) + 1),
  ]
  for layout in args.layouts.split(","):
    comm = collectives(compile_update(layout, mesh, *shape, GROUPING[args.group_frames]))
    cells = [f"{c['count']} ({c['bytes']:,} B)" if c["count"] else "0" for c in comm.values()]
    total = sum(c["bytes"] for c in comm.values())
    lines.append(f"| {layout} | " + " | ".join(cells) + f" | {total:,} |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", type=int, default=1)
  parser.add_argument("--d", type=int, default=768)
  parser.add_argument("--heads", type=int, default=12)
  parser.add_argument("--kv-heads", type=int, default=12)
  parser.add_argument("--head-dim", type=int, default=64)
  parser.add_argument("--mesh", default="2x2", help="data x model (default 2x2)")
  parser.add_argument("--layouts", default=",".join(LAYOUTS))
  parser.add_argument("--group-frames", default="auto", choices=tuple(GROUPING))
  print(table(parser.parse_args()))


if __name__ == "__main__":
  main()
