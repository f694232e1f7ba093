"""Kernels of the compiled optimizer update: what bounds it on an accelerator.

On a GPU a small update is bound by kernel launches, not arithmetic, so the number of
kernels in the compiled update is its cost there. This compiles ``tx.update`` for a
GPT-2-small-shaped tree (per layer: ``query``, ``key``, ``value`` kernels
``(768, 12, 64)`` and an MLP kernel ``(768, 3072)``) from abstract shapes (no arrays,
no device needed) and counts the kernels of the entry computation of the optimized
HLO: its fusions, matrix products, custom calls, loops and the other instructions that
run (everything but parameters, constants, bitcasts and tuples). The Stiefel part is
``stiefel_adamw``'s count minus ``optax.adamw``'s on the same tree; ``stiefel_adamw``
is built grouped (``group_frames=True``, the accelerators' default) and one leaf at a
time (``group_frames=False``, the CPU's).

    python -m benchmarks.kernels [--layers 1,12] [--dtype float32]
"""

from __future__ import annotations

import argparse
import collections
import functools
import re

import jax
import jax.numpy as jnp
import optax

import stiefax

# Entry instructions that launch no work of their own.
FREE = ("parameter", "constant", "bitcast", "tuple", "get-tuple-element")
# The kinds the count is made of (the rest are counted as "other").
KINDS = ("fusion", "dot", "custom-call", "while", "concatenate")


def gpt2_tree(layers, d=768, heads=12, head_dim=64, mlp=3072, dtype=jnp.float32, abstract=True):
  """A GPT-2-small-shaped params tree, Flax names: ``layer_i/attention/{query,key,value}``."""
  if abstract:

    def leaf(key, shape):
      return jax.ShapeDtypeStruct(shape, dtype)
  else:
    init = stiefax.flax.orthonormal_init()

    def leaf(key, shape):
      return (
        init(key, shape).astype(dtype)
        if len(shape) == 3
        else (0.02 * jax.random.normal(key, shape)).astype(dtype)
      )

  keys = iter(jax.random.split(jax.random.key(0), 4 * layers))
  return {
    "params": {
      f"layer_{i}": {
        "attention": {
          name: {"kernel": leaf(next(keys), (d, heads, head_dim))}
          for name in ("query", "key", "value")
        },
        "mlp": {"kernel": leaf(next(keys), (d, mlp))},
      }
      for i in range(layers)
    }
  }


def entry_kernels(hlo_text: str) -> collections.Counter:
  """The opcodes of the instructions of the optimized HLO's entry computation that run."""
  start = hlo_text.index("\nENTRY ")
  body = hlo_text[start : hlo_text.index("\n}", start)]
  found: collections.Counter = collections.Counter()
  for line in body.splitlines()[1:]:
    m = re.match(r"\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?:\([^=]*\)|\S+)\s+([\w\-]+)\(", line)
    if m and m.group(1) not in FREE:
      found[m.group(1)] += 1
  return found


def compiled(tx: optax.GradientTransformation, params):
  """``jax.jit(tx.update)`` compiled for ``params`` (arrays or shapes)."""
  state = jax.eval_shape(tx.init, params)
  return jax.jit(tx.update).lower(params, state, params).compile()


def count(tx: optax.GradientTransformation, params) -> collections.Counter:
  """The kernels of ``jax.jit(tx.update)`` compiled for ``params`` (arrays or shapes)."""
  return entry_kernels(compiled(tx, params).as_text())


def temp_mib(program) -> float:
  """The temporary memory of a compiled program, MiB (0 where it is not reported)."""
  analysis = program.memory_analysis()
  return 0.0 if analysis is None else analysis.temp_size_in_bytes / 2**20


OPTIMIZERS = {
  "stiefel_adamw": lambda: stiefax.stiefel_adamw(
    1e-3, stiefel=functools.partial(stiefax.riemannian_adam, group_frames=True)
  ),
  "stiefel_adamw per leaf": lambda: stiefax.stiefel_adamw(
    1e-3, stiefel=functools.partial(stiefax.riemannian_adam, group_frames=False)
  ),
  "adamw": lambda: optax.adamw(1e-3),
}


def table(layers=(1, 12), dtype=jnp.float32):
  """Rows of kernel counts per optimizer and each Stiefel part, then temporary MiB."""
  rows = []
  for n in layers:
    params = gpt2_tree(n, dtype=dtype)
    programs = {name: compiled(make(), params) for name, make in OPTIMIZERS.items()}
    totals = {name: sum(entry_kernels(p.as_text()).values()) for name, p in programs.items()}
    rows.append(
      {
        "layers": n,
        **totals,
        "stiefel part": totals["stiefel_adamw"] - totals["adamw"],
        "stiefel part per leaf": totals["stiefel_adamw per leaf"] - totals["adamw"],
        **{f"{name} temp MiB": round(temp_mib(p), 1) for name, p in programs.items()},
      }
    )
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", default="1,12")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  args = parser.parse_args()
  rows = table(tuple(int(x) for x in args.layers.split(",")), jnp.dtype(args.dtype))
  print(
    f"jax {jax.__version__} on {jax.devices()[0].platform}, {args.dtype}; kernels of the update"
  )
  cols = list(rows[0])
  print("| " + " | ".join(cols) + " |")
  print("|" + "---|" * len(cols))
  for row in rows:
    print("| " + " | ".join(str(row[c]) for c in cols) + " |")


if __name__ == "__main__":
  main()
