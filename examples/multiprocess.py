"""Several processes train one decoder LM with `stiefel_adamw` on a global device mesh.

This is how JAX runs on a GPU cluster or a TPU pod: one process per host (or per GPU),
`jax.distributed.initialize()` at the start of each, and a global mesh over every
device of every process. Here the processes run on one machine with CPU collectives
(gloo) and a few host devices each, so the same code is tested without accelerators:

    python examples/multiprocess.py --launch 2 --layout both --steps 20

`--launch N` starts N copies of this script with a local coordinator on 127.0.0.1 (on
a cluster you start one copy per host yourself and drop `--launch`; see
docs/howto/scaling.md). The mesh has a `data` axis (the batch; the processes) and a
`model` axis (devices inside a process). The query heads `q_einsum/w` `(H, d, r)` and
the key heads in `kv_einsum/w` `(2, K, d, r)` of the decoder are laid out as

  heads  the heads axis over `model` (tensor parallel): the frame update is local;
  fsdp   the rows (the d axis) over `data`, as an FSDP / ZeRO-3 rule shards every
         weight: the update reduces the r x r Gram products of each frame;
  both   heads over `model` and rows over `data`;
  none   the unsharded reference, on one device;
  gather rows over `data`, but the update gathers each W whole first (the naive way);
  fsdp-perturbed  the control: fsdp with the frame update of the rows held by the last
         process scaled by 1 + `--perturb`.

Every other parameter is replicated; the batch is split over `data`. The first process
prints the loss, the isometry error of the frames and the collectives (count and bytes
per device) of the compiled optimizer update; `--out` writes the final parameters (the
first process) and those numbers as a `.npz` file and a `.json` file.

Checkpoints (Orbax) are global: `--save DIR` writes params and optimizer state of each
layout to `DIR/<layout>` (after `--save-step` steps, by default at the end),
`--restore DIR/<layout>` reads them onto this run's mesh, whatever mesh and number of
processes wrote them, and continues (give `--first-step` to continue the batches).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

# pylint: disable=g-import-not-at-top,wrong-import-position
LAYOUTS = ("none", "heads", "fsdp", "both", "gather", "fsdp-perturbed")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_BYTES = {"f64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s8": 1, "u8": 1, "pred": 1}


def free_port() -> int:
  """A TCP port that nothing listens on now (for the local coordinator)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(n: int, argv: list[str], devices: int, timeout: float = 600) -> int:
  """Runs this script as ``n`` processes with a local coordinator; their exit status."""
  address = f"127.0.0.1:{free_port()}"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
  env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
  procs = [
    subprocess.Popen(
      [sys.executable, __file__, *argv, "--coordinator", address]
      + ["--num-processes", str(n), "--process-id", str(i)],
      env=env,
    )
    for i in range(n)
  ]
  deadline = time.monotonic() + timeout
  codes = []
  for p in procs:
    try:
      codes.append(p.wait(timeout=max(deadline - time.monotonic(), 1)))
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      return 124
  return max(codes, key=abs)


def collectives(hlo: str) -> dict[str, dict[str, int]]:
  """Count and bytes (of each result, per device) of every collective in compiled HLO."""
  out = {name: {"count": 0, "bytes": 0} for name in COLLECTIVES}
  pattern = re.compile(r"=\s*(\(?[^=]*?\)?)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
  for line in hlo.splitlines():
    m = pattern.search(line)
    if m is None:  # (an async pair counts once: its -start)
      continue
    shapes, name = m.groups()
    size = 0
    for dtype, dims in re.findall(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]", shapes):
      n = 1
      for d in filter(None, dims.split(",")):
        n *= int(d)
      size += n * _BYTES.get(dtype, 4)
    out[name]["count"] += 1
    out[name]["bytes"] += size
  return out


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--launch", type=int, default=0, help="start this many local processes")
  parser.add_argument("--devices", type=int, default=2, help="CPU devices per process (launch)")
  parser.add_argument("--coordinator", default=None, help="host:port of process 0")
  parser.add_argument("--num-processes", type=int, default=1)
  parser.add_argument("--process-id", type=int, default=0)
  parser.add_argument(
    "--layout",
    default="both",
    help=f"one or more (comma-separated) of {', '.join(LAYOUTS)}",
  )
  parser.add_argument("--mesh", default=None, help="data x model, e.g. 2x2 (default: all)")
  parser.add_argument("--steps", type=int, default=4, help="training steps")
  parser.add_argument("--first-step", type=int, default=0, help="index of the first batch")
  parser.add_argument(
    "--save", default=None, help="write an Orbax checkpoint of each layout to <save>/<layout>"
  )
  parser.add_argument(
    "--save-layouts", default=None, help="comma-separated layouts to save (default: all)"
  )
  parser.add_argument(
    "--save-step", type=int, default=None, help="save after this many steps (default: the end)"
  )
  parser.add_argument("--restore", default=None, help="Orbax checkpoint directory to read")
  parser.add_argument("--out", default=None, help="write <out>.npz and <out>.json")
  parser.add_argument(
    "--perturb",
    type=float,
    default=1e-3,
    help="fsdp-perturbed: scale the frame update of the last process's rows by 1+x",
  )
  args = parser.parse_args(argv)
  args.layouts = args.layout.split(",")
  for layout in args.layouts:
    if layout not in LAYOUTS:
      parser.error(f"unknown layout {layout!r}; choose from {', '.join(LAYOUTS)}")
  if len(args.layouts) > 1 and args.restore:
    parser.error("--restore takes one layout")
  return args


def main(argv=None):
  args = parse_args(argv)
  if args.launch:
    rest = list(argv if argv is not None else sys.argv[1:])
    i = next(j for j, a in enumerate(rest) if a.startswith("--launch"))
    del rest[i : i + (1 if "=" in rest[i] else 2)]
    sys.exit(launch(args.launch, rest, args.devices))

  import jax

  # Collectives between the CPU devices of several processes (no effect on GPU or TPU).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if args.coordinator:
    jax.distributed.initialize(
      args.coordinator, num_processes=args.num_processes, process_id=args.process_id
    )
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("started")  # a first collective across processes
    if jax.process_index() == 0:
      print(
        f"distributed runtime up: {jax.process_count()} processes,"
        f" {jax.device_count()} devices ({jax.local_device_count()} each)",
        flush=True,
      )
  run(args)
  if args.coordinator:
    jax.distributed.shutdown()


def run(args):
  """Trains ``args.steps`` steps in each layout on the global mesh (module docstring)."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import Mesh
  import numpy as np

  import stiefax
  from stiefax.experiments.lm.model import DecoderLM
  from stiefax.experiments.lm.model import ModelConfig

  config = ModelConfig(d_model=32, depth=2, heads=4, kv_heads=2, head_dim=8, mlp_dim=64, seq=16)
  devices = jax.devices()
  if args.mesh:
    n_data, n_model = (int(v) for v in args.mesh.split("x"))
  else:
    n_data, n_model = jax.process_count(), len(devices) // jax.process_count()
  mesh = Mesh(np.array(devices[: n_data * n_model]).reshape(n_data, n_model), ("data", "model"))
  one = Mesh(np.array(devices[:1]).reshape(1, 1), ("data", "model"))

  model = DecoderLM(config, "plain")
  tokens0 = jnp.zeros((1, config.seq), jnp.int32)
  # Every process builds the same initial parameters (same key); each then keeps only
  # the shards its devices hold.
  host_params = jax.tree.map(
    np.asarray, stiefax.flax.project_params(model.init(jax.random.key(0), tokens0))
  )
  for layout in args.layouts:
    # "none" is the unsharded reference: one device.
    train(args, layout, one if layout == "none" else mesh, model, config, host_params)


_COMPILED: dict = {}  # layout -> (train step, update), jitted


def frame_specs(params, layout: str):
  """PartitionSpecs of the decoder's parameters in ``layout``: only W_Q, W_K are split."""
  import jax
  from jax.sharding import PartitionSpec as P

  import stiefax

  heads = "model" if layout in ("heads", "both") else None
  rows = "data" if layout in ("fsdp", "both", "gather", "fsdp-perturbed") else None

  def spec(path, leaf):
    names = stiefax.layouts.path_names(path)
    if names[-2:] == ("q_einsum", "w"):  # (H, d, r): heads, rows, columns
      return P(heads, rows, None)
    if names[-2:] == ("kv_einsum", "w"):  # (2, K, d, r): k/v, heads, rows, columns
      return P(None, heads, rows, None)
    return P()

  return jax.tree_util.tree_map_with_path(spec, params)


def train(args, layout, mesh, model, config, host_params):
  """One layout: build, compile, train, report (and save / restore / write)."""
  import jax
  from jax.experimental import multihost_utils
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  import numpy as np
  import optax

  import stiefax

  batch_size = 8
  lead = jax.process_index() == 0
  labels = stiefax.layouts.qk_labels(host_params)
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), frame_specs(host_params, layout))
  replicated = NamedSharding(mesh, P())
  batch_sharding = NamedSharding(mesh, P("data", None))

  def global_array(x, sharding):
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

  def on_mesh(x):
    # Step counters are built on one local device: replicate them over the mesh.
    if isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh:
      return x
    return global_array(np.asarray(x), replicated)

  params = jax.tree.map(global_array, host_params, shardings)
  tx = stiefax.stiefel_adamw(3e-3, weight_decay=0.01, labels=labels)
  # Outside jit: moments sharded like their params, per-frame leaves like the heads.
  state = jax.tree.map(on_mesh, tx.init(params))
  state_shardings = jax.tree.map(lambda x: x.sharding, state)

  if args.restore:
    import orbax.checkpoint as ocp

    abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      {"params": params, "state": state},
    )
    with ocp.StandardCheckpointer() as ckpt:
      restored = ckpt.restore(os.path.abspath(args.restore), abstract)
    params, state = restored["params"], restored["state"]

  def update_fn(grads, state, params):
    if layout != "gather":
      return tx.update(grads, state, params)
    # The naive reference: gather each W (and its gradient and moments) whole,
    # update it on every device, keep the shard back.
    whole = jax.tree.map(lambda _: replicated, params)
    grads, params = jax.lax.with_sharding_constraint((grads, params), (whole, whole))
    state = jax.lax.with_sharding_constraint(state, jax.tree.map(lambda _: replicated, state))
    return tx.update(grads, state, params)

  # The control: the frame update of the rows that the last process's devices hold
  # (the last block of the `data` axis) is scaled by 1 + perturb.
  n_data, d = mesh.shape["data"], config.d_model
  block = np.ones((n_data, d // n_data), np.float32)
  if layout == "fsdp-perturbed":
    block[-1] += args.perturb
  row_scale = global_array(block.reshape(d), NamedSharding(mesh, P("data")))

  def perturbed(updates, row_scale):
    def leaf(path, u):
      names = stiefax.layouts.path_names(path)
      if names[-2:] == ("q_einsum", "w"):
        return u * row_scale[None, :, None]
      if names[-2:] == ("kv_einsum", "w"):
        return u.at[0].multiply(row_scale[None, :, None])  # the key slice
      return u

    return jax.tree_util.tree_map_with_path(leaf, updates)

  def loss_fn(params, tokens):
    logits = model.apply(params, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  def step(params, state, tokens, row_scale):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    updates, state = update_fn(grads, state, params)
    if layout.startswith("fsdp"):  # the scale is 1 except in the control
      updates = perturbed(updates, row_scale)
    return optax.apply_updates(params, updates), state, loss

  # fsdp-perturbed runs fsdp's compiled programs with another row scale.
  base = "fsdp" if layout == "fsdp-perturbed" else layout
  if base not in _COMPILED:
    train_step = jax.jit(
      step,
      in_shardings=(shardings, state_shardings, batch_sharding, row_scale.sharding),
      out_shardings=(shardings, state_shardings, replicated),
    )
    # The optimizer update alone, compiled with the layout's shardings: its collectives.
    update = jax.jit(
      update_fn,
      in_shardings=(shardings, state_shardings, shardings),
      out_shardings=(shardings, state_shardings),
    )
    _COMPILED[base] = train_step, update
  train_step, update = _COMPILED[base]

  def tokens_at(i):
    key = jax.random.key(100 + i)
    x = np.asarray(jax.random.randint(key, (batch_size, config.seq + 1), 0, config.vocab))
    return global_array(x, batch_sharding)

  t0 = time.perf_counter()
  comm = collectives(update.lower(params, state, params).compile().as_text())
  t1 = time.perf_counter()

  def save(params, state):
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckpt:  # every process writes its shards
      path = os.path.join(os.path.abspath(args.save), layout)
      ckpt.save(path, {"params": params, "state": state})

  saving = args.save and (args.save_layouts is None or layout in args.save_layouts.split(","))
  losses = []
  for i in range(args.steps):
    params, state, loss = train_step(params, state, tokens_at(args.first_step + i), row_scale)
    losses.append(float(loss))
    if saving and i + 1 == (args.steps if args.save_step is None else args.save_step):
      save(params, state)
  iso = float(stiefax.diagnostics.isometry_error(params, labels))
  t2 = time.perf_counter()
  used = {k: v for k, v in comm.items() if v["count"]}
  if lead:
    print(
      f"processes {jax.process_count()}  mesh {dict(mesh.shape)}  layout {layout}"
      f"  losses {' '.join(f'{v:.4f}' for v in losses)}  isometry {iso:.2e}"
      f"  (update compiled in {t1 - t0:.1f} s, trained in {t2 - t1:.1f} s)",
      flush=True,
    )
    print(f"collectives in the optimizer update: {used or 'none'}", flush=True)

  if args.out:
    gathered = multihost_utils.process_allgather(params, tiled=True)
    if lead:
      out = args.out if len(args.layouts) == 1 else f"{args.out}-{layout}"
      flat = jax.tree_util.tree_flatten_with_path(gathered)[0]
      np.savez(out + ".npz", **{jax.tree_util.keystr(p): np.asarray(x) for p, x in flat})
      with open(out + ".json", "w", encoding="utf-8") as f:
        json.dump(
          {
            "processes": jax.process_count(),
            "mesh": dict(mesh.shape),
            "layout": layout,
            "losses": losses,
            "isometry": iso,
            "collectives": comm,
            "frame_sharding": str(
              params["params"]["layer_0"]["attn"]["q_einsum"]["w"].sharding.spec
            ),
          },
          f,
        )


if __name__ == "__main__":
  main()
