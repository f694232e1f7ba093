"""The accelerator benchmarks of docs/performance.md in one run: one JSON and its tables.

Runs, optimizers taking turns in one process (medians of interleaved rounds):

* the optimizer update of ``riemannian_adam`` (``method="auto"``) against
  ``optax.adamw`` at every shape of the update table, float32, and on a 12-layer
  GPT-2-small tree written layer by layer (24 query/key kernels ``(768, 12, 64)``) in
  float32 and bfloat16; the default (grouped on an accelerator), one leaf at a time
  (``group_frames=False``) and the literal chain;
* the whole jitted training step (forward, backward, update; buffers donated), B2
  (``stiefel_adamw``) against A2 (``optax.adamw``): the paper's image-patch model, and a
  GPT-2-small-shaped decoder (12 layers, d 768, 12 heads of 64, MLP 3 072, sequence
  1 024) in bfloat16, with the compiled step's memory (arguments + temporaries) and,
  where the device reports it, its peak memory;
* the kernels of the compiled update (:mod:`benchmarks.kernels`) on this backend.

Sized to finish within 8 minutes on one GPU: the JSON is rewritten after every part,
and the parts not started after ``--budget-s`` (default 420) are skipped and listed.
``--tiny`` runs the same paths at toy sizes (the CPU test of the slow suite).

    python -m benchmarks.gpu [--out results/gpu] [--tiny]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import optax

from benchmarks import kernels
from benchmarks import update_step
from benchmarks.common import time_fn
import stiefax
from stiefax.experiments import optim
from stiefax.experiments.lm import model as lm_model
from stiefax.experiments.patches import config as patches_config
from stiefax.experiments.patches import model as patch_model
from stiefax.experiments.patches import training as patch_training

# (name, kernel shape, FrameSpec, layers, dtype) of the update table.
FULL_UPDATES = [
  (name, *update_step.SHAPES[name], "float32")
  for name in ("(8,128,16)", "(4,128,32)", "(12,768,64)", "(16,1024,64)", "12x(12,768,64)")
] + [
  ("12L(12,768,64)", *update_step.SHAPES["12L(12,768,64)"], dtype)
  for dtype in ("float32", "bfloat16")
]
TINY_UPDATES = [
  ("(2,16,4)", (16, 2, 4), stiefax.FrameSpec(), 1, "float32"),
  ("3L(2,16,4)", (16, 2, 4), stiefax.FrameSpec(), 3, "bfloat16"),
]
GPT2 = lm_model.ModelConfig(
  d_model=768, depth=12, heads=12, kv_heads=12, head_dim=64, mlp_dim=3072, seq=1024
)
TINY_LM = lm_model.ModelConfig(
  d_model=32, depth=2, heads=2, kv_heads=2, head_dim=8, mlp_dim=64, seq=16
)


def update_rows(specs, reps):
  rows = []
  for name, shape, frames, layers, dtype in specs:
    for label, ms, ratio, per_frame in update_step.bench_shape(
      shape, frames, ["auto"], reps, layers=layers, dtype=jnp.dtype(dtype)
    ):
      rows.append(
        dict(
          shape=name, dtype=dtype, optimizer=label, ms=ms, x_adamw=ratio, state_b_frame=per_frame
        )
      )
      print(f"update {name:<16} {dtype:<9} {label:<22} {ms:9.3f} ms {ratio:6.2f}x", flush=True)
  return rows


def _memory(compiled):
  m = compiled.memory_analysis()
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.temp_size_in_bytes)


def _peak_bytes():
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


def time_steps(steppers, reps):
  """Median ms per step of each ``(step, carry, batch)``, arms taking turns."""
  times = {name: [] for name in steppers}

  def timed(name):
    step, carry, batch = steppers[name]
    p, s, loss = step(*carry[0], *batch)
    carry[0] = (p, s)
    return loss

  for _ in range(reps):
    for name in steppers:
      times[name].append(time_fn(timed, name, reps=1, warmup=1))
  return {name: statistics.median(t) for name, t in times.items()}


def _make_step(loss_fn, tx):
  def step(params, state, *batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  return jax.jit(step, donate_argnums=(0, 1))


def patch_rows(reps, batch):
  setting = patches_config.Setting(n_train=10_000, epochs=40, depth=1)
  tokens, classes = 16, 10
  model = patch_model.make_model(setting, tokens, classes)
  x = jax.random.normal(jax.random.key(0), (batch, tokens, setting.d))
  y = jax.random.randint(jax.random.key(1), (batch,), 0, classes)

  def loss_fn(params, x, y):
    logits = model.apply(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  steppers, memory = {}, {}
  for name in ("A2", "B2"):
    arm = patches_config.arm_by_name(name)
    tx = optim.make_optimizer(
      arm, patches_config.hyper(setting, patches_config.arm_hparams(arm, setting, None))
    )
    params = patch_training.init_model(model, arm, 0, tokens, setting.d)
    state = tx.init(params)
    step = _make_step(loss_fn, tx)
    memory[name] = _memory(step.lower(params, state, x, y).compile())
    steppers[name] = (step, [(params, state)], (x, y))
  ms = time_steps(steppers, reps)
  return [
    dict(
      model=f"patches depth 1, batch {batch}",
      dtype="float32",
      arm=n,
      ms=ms[n],
      x_a2=ms[n] / ms["A2"],
      step_bytes=memory[n],
    )
    for n in ms
  ]


def lm_rows(config, reps, batch, dtype="bfloat16"):
  model = lm_model.DecoderLM(config)
  tokens = jax.random.randint(jax.random.key(0), (batch, config.seq + 1), 0, config.vocab)
  params = jax.jit(model.init)(jax.random.key(1), tokens[:, :-1])["params"]
  params = stiefax.flax.project_params({"params": params}, frames=stiefax.layouts.qk_frames())
  params = jax.tree.map(lambda x: x.astype(dtype), params)

  def loss_fn(params, tokens):
    logits = model.apply(params, tokens[:, :-1]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  txs = {
    "A2": optax.adamw(1e-3, weight_decay=0.1),
    "B2": stiefax.stiefel_adamw(1e-3, weight_decay=0.1),
  }
  steppers, memory, peaks = {}, {}, {}
  for name, tx in txs.items():
    p = jax.tree.map(jnp.copy, params)
    state = tx.init(p)
    step = _make_step(loss_fn, tx)
    memory[name] = _memory(step.lower(p, state, tokens).compile())
    steppers[name] = (step, [(p, state)], (tokens,))
  for name in steppers:  # each arm's peak after its own first steps, in order
    time_steps({name: steppers[name]}, 1)
    peaks[name] = _peak_bytes()
  ms = time_steps(steppers, reps)
  shape = f"decoder {config.depth}L d{config.d_model} {config.heads}x{config.head_dim} seq {config.seq}, batch {batch}"
  return [
    dict(
      model=shape,
      dtype=dtype,
      arm=n,
      ms=ms[n],
      x_a2=ms[n] / ms["A2"],
      step_bytes=memory[n],
      peak_bytes_after=peaks[n],
    )
    for n in ms
  ]


def markdown(result) -> str:
  out = [f"{result['device']}, jax {result['jax']}, {result['date']}", ""]
  out += [
    "| shape (H, d, r) | dtype | optimizer | ms | × adamw |",
    "| --- | --- | --- | ---: | ---: |",
  ]
  out += [
    f"| {r['shape']} | {r['dtype']} | {r['optimizer']} | {r['ms']:.3f} | {r['x_adamw']:.2f} |"
    for r in result["update"]
  ]
  out += [
    "",
    "| model | dtype | arm | ms per step | × A2 | step memory (MiB) |",
    "| --- | --- | --- | ---: | ---: | ---: |",
  ]
  for r in result["train_step"]:
    mem = "" if r["step_bytes"] is None else f"{r['step_bytes'] / 2**20:.0f}"
    out.append(
      f"| {r['model']} | {r['dtype']} | {r['arm']} | {r['ms']:.2f} | {r['x_a2']:.3f} | {mem} |"
    )
  if result["kernels"]:
    out += ["", "| " + " | ".join(result["kernels"][0]) + " |"]
    out += ["|" + "---|" * len(result["kernels"][0])]
    out += ["| " + " | ".join(str(v) for v in r.values()) + " |" for r in result["kernels"]]
  if result["skipped"]:
    out += ["", "skipped (past the time budget): " + ", ".join(result["skipped"])]
  return "\n".join(out) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="results/gpu", help="folder of the JSON and tables")
  parser.add_argument("--tiny", action="store_true", help="toy sizes (a CPU check)")
  parser.add_argument("--reps", type=int, default=None)
  parser.add_argument(
    "--budget-s",
    type=float,
    default=420.0,
    help="seconds after which the parts not yet started are skipped (listed in the JSON)",
  )
  args = parser.parse_args(argv)
  t0 = time.perf_counter()
  reps = args.reps or (2 if args.tiny else 20)
  device = jax.devices()[0]
  result = dict(
    device=f"{device.platform} {getattr(device, 'device_kind', '')}".strip(),
    jax=jax.__version__,
    date=datetime.date.today().isoformat(),
    tiny=args.tiny,
    update=[],
    train_step=[],
    kernels=[],
    skipped=[],
  )
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  stem = f"{device.platform}-{'tiny-' if args.tiny else ''}{result['date']}"

  def save():  # after every part, so a run stopped from outside keeps what it measured
    result["seconds"] = round(time.perf_counter() - t0, 1)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown(result))

  def run(name, fn):
    if time.perf_counter() - t0 > args.budget_s:
      result["skipped"].append(name)
      print(f"skipped {name}: past the budget of {args.budget_s:.0f} s", flush=True)
      return []
    rows = fn()
    save()
    return rows

  for spec in TINY_UPDATES if args.tiny else FULL_UPDATES:
    result["update"] += run(
      f"update {spec[0]} {spec[-1]}", lambda spec=spec: update_rows([spec], reps)
    )
  result["train_step"] += run("patches step", lambda: patch_rows(reps, 8 if args.tiny else 256))
  result["train_step"] += run(
    "decoder step", lambda: lm_rows(TINY_LM if args.tiny else GPT2, reps, 2 if args.tiny else 8)
  )
  for r in result["train_step"]:
    print(f"step {r['model']:<50} {r['arm']} {r['ms']:8.2f} ms {r['x_a2']:.3f}x A2", flush=True)
  result["kernels"] = run("kernels", lambda: kernels.table((1, 3) if args.tiny else (1, 12)))
  save()
  print(markdown(result))
  print(f"summary: wrote {out / (stem + '.json')} in {result['seconds']} s")


if __name__ == "__main__":
  main()
