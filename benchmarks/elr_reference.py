"""The reference ELR schedule of AdamW under linear decay, against a measured AdamW run.

Trains the digits patch model (``stiefax patches``' encoder, d=16) with
``optax.adamw(linear_schedule(lr, 0, T), weight_decay)`` on minibatches, records the
effective learning rate of the MLP input kernel with
:func:`stiefax.elr_tools.effective_learning_rate` at every step (the statistic of
``update_summary``), Adam's update RMS and the weight RMS, and compares them with
:func:`stiefax.elr_tools.reference_elr_schedule`. Prints the fit and, with
``--plot PATH``, draws the curves.

    python -m benchmarks.elr_reference [--steps 400] [--plot docs/img/elr_reference.png]
"""

import argparse

import numpy as np

from stiefax import elr as elr_tools


def measure_adamw_elr(learning_rate=3e-2, weight_decay=0.1, steps=400, batch=32, seed=0):
  """``(elr, update_rms, weight_rms, init_rms)`` per step of a real AdamW run."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  from stiefax.experiments.patches import config as patches_config
  from stiefax.experiments.patches import data as patch_data  # pylint: disable=g-import-not-at-top
  from stiefax.experiments.patches import images as patch_images
  from stiefax.experiments.patches import model as patches_model

  data = patch_data.prepare(
    patch_images.load_images(None), n_train=1000, patch=4, d=16, cache_dir=None
  )
  setting = patches_config.Setting(n_train=1000, epochs=1, d=16, heads=4, head_dim=4)
  model = patches_model.make_model(setting, data.train_x.shape[1], data.num_classes)
  params = model.init(jax.random.key(seed), jnp.zeros((1,) + data.train_x.shape[1:]))
  schedule = optax.linear_schedule(learning_rate, 0.0, steps)
  tx = optax.adamw(schedule, weight_decay=weight_decay)
  xs, ys = jnp.asarray(data.train_x), jnp.asarray(data.train_y)
  kernel = lambda tree: tree["params"]["mlp_in_0"]["kernel"]

  def loss_fn(p, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

  @jax.jit
  def run(params, idx):
    def body(carry, i):
      p, s = carry
      eta = schedule(s[0].count)
      g = jax.grad(loss_fn)(p, xs[i], ys[i])
      u, s = tx.update(g, s, p)
      new = optax.apply_updates(p, u)
      elr = kernel(elr_tools.effective_learning_rate(p, new).tangential)
      w = kernel(p)
      adam = -(kernel(u) + eta * weight_decay * w) / jnp.maximum(eta, 1e-30)
      rms = lambda a: jnp.sqrt(jnp.mean(jnp.square(a)))
      return (new, s), (elr, rms(adam), rms(w))

    return jax.lax.scan(body, (params, tx.init(params)), idx)[1]

  idx = np.random.default_rng([seed, 1]).integers(0, data.train_x.shape[0], (steps, batch))
  elr, u_rms, w_rms = (np.asarray(a, np.float64) for a in run(params, jnp.asarray(idx)))
  init_rms = float(np.sqrt(np.mean(np.square(np.asarray(kernel(params))))))
  return elr, u_rms, w_rms, init_rms


def fit(elr, reference):
  """Correlation of the log curves and the measured/reference ratio, steps 1 .. 0.9 T."""
  n = int(0.9 * len(elr))
  corr = float(np.corrcoef(np.log(elr[1:n]), np.log(reference[1:n]))[0, 1])
  ratio = elr[1:n] / reference[1:n]
  return corr, float(np.quantile(ratio, 0.1)), float(np.quantile(ratio, 0.9))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lr", type=float, default=3e-2)
  parser.add_argument("--weight-decay", type=float, default=0.1)
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--plot", default=None, help="write the figure to this PNG")
  args = parser.parse_args()
  elr, u_rms, w_rms, init_rms = measure_adamw_elr(
    args.lr, args.weight_decay, args.steps, args.batch
  )
  ref = elr_tools.reference_elr_schedule(args.lr, args.weight_decay, args.steps, init_rms)
  corr, lo, hi = fit(elr, ref.elr)
  mid = slice(args.steps // 4, 3 * args.steps // 4)
  print(
    f"AdamW lr {args.lr:g} -> 0 over {args.steps} steps, decay {args.weight_decay:g},"
    f" batch {args.batch}; MLP input kernel of the digits patch model"
  )
  print(
    f"update RMS: step 0 {u_rms[0]:.2f}, median of the middle half {np.median(u_rms[mid]):.3f}"
    " (reference 0.2)"
  )
  print(
    f"weight RMS: start {init_rms:.3f}, measured at T/2 {w_rms[args.steps // 2]:.3f},"
    f" reference {ref.weight_rms[args.steps // 2]:.3f}"
  )
  print(
    f"summary: log-ELR correlation {corr:.3f}; measured/reference ELR 10-90% range"
    f" {lo:.2f}-{hi:.2f}"
  )
  if args.plot:
    import matplotlib  # pylint: disable=g-import-not-at-top

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

    steps = np.arange(args.steps)
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    ax[0].semilogy(steps, elr, lw=0.8, label="measured (update_summary's elr)")
    ax[0].semilogy(steps, ref.elr, lw=1.5, label="reference, update RMS 0.2")
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("effective learning rate")
    ax[0].legend(fontsize=8)
    ax[1].plot(steps, w_rms, lw=1, label="weight RMS, measured")
    ax[1].plot(steps, ref.weight_rms, lw=1.5, label="weight RMS, reference")
    ax[1].plot(steps, u_rms, lw=0.6, label="Adam update RMS, measured")
    ax[1].axhline(0.2, color="gray", lw=0.6, ls="--")
    ax[1].set_xlabel("step")
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
  main()
