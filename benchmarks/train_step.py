"""Whole jitted training step (forward, backward, update) of the image-benchmark model.

B2 (``stiefax.stiefel_adamw`` with the paper's Riemannian Adam on W_Q, W_K) against A2
(``optax.adamw`` on everything), same model, same batch, same process; medians over
``--reps`` steps after warm-up, buffers donated. Default shapes are the paper's image
model: 16 patch tokens, d=128, H=8 heads of r=16, batch 256.

``--arms`` adds arms of ``stiefax patches`` (e.g. ``A2,B2,B2-mmuon,A2-muon,B2-qr,B2-cayley``);
the summary line compares B2 with A2 and one line per further arm gives its ratio to B2.

    python benchmarks/train_step.py [--depth 1] [--batch 256] [--reps 30] [--arms A2,B2]
"""

import argparse
import statistics

import jax
import optax

from benchmarks.common import time_fn
from stiefax.experiments import optim
from stiefax.experiments.patches import config as patches_config
from stiefax.experiments.patches import model as patch_model
from stiefax.experiments.patches import training as patch_training


def make_step(model, tx):
  def loss_fn(params, x, y):
    logits = model.apply(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  def step(params, state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  return jax.jit(step, donate_argnums=(0, 1))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--depth", type=int, default=1)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--reps", type=int, default=30)
  parser.add_argument("--polar", default="auto")
  parser.add_argument("--arms", default="A2,B2", help="arms to time (A2 and B2 always)")
  args = parser.parse_args()

  setting = patches_config.Setting(n_train=10_000, epochs=40, depth=args.depth, polar=args.polar)
  tokens, classes = 16, 10
  model = patch_model.make_model(setting, tokens, classes)
  x = jax.random.normal(jax.random.key(0), (args.batch, tokens, setting.d))
  y = jax.random.randint(jax.random.key(1), (args.batch,), 0, classes)
  steppers = {}
  names = ["A2", "B2"] + [a for a in args.arms.split(",") if a and a not in ("A2", "B2")]
  for name in names:
    arm = patches_config.arm_by_name(name)
    hp = patches_config.arm_hparams(arm, setting, None)
    tx = optim.make_optimizer(arm, patches_config.hyper(setting, hp))
    params = patch_training.init_model(model, arm, 0, tokens, setting.d)
    steppers[name] = (make_step(model, tx), [(params, tx.init(params))])

  def timed(name):
    step, carry = steppers[name]
    p, s, loss = step(*carry[0], x, y)
    carry[0] = (p, s)
    return loss

  # Interleave the arms so that load changes on a shared machine hit both alike.
  times = {name: [] for name in steppers}
  for _ in range(args.reps):
    for name in steppers:
      times[name].append(time_fn(timed, name, reps=1, warmup=1))
  results = {name: statistics.median(t) for name, t in times.items()}
  for name, ms in results.items():
    print(
      f"{name}: {ms:.2f} ms per step (median of {args.reps}), {ms / results['A2']:.3f}x A2,"
      f" {ms / results['B2']:.3f}x B2",
      flush=True,
    )
  ratio = results["B2"] / results["A2"]
  print(
    f"summary: training step (depth {args.depth}, batch {args.batch}, d=128, H=8, r=16) "
    f"B2 {results['B2']:.2f} ms vs A2 {results['A2']:.2f} ms: {ratio:.3f}x"
  )


if __name__ == "__main__":
  main()
