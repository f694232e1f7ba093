"""The manifold Muon subproblem solver: accuracy per dual iteration and its cost.

1. Float64, Gaussian gradients: the relative duality gap of the shipped preconditioned
   dual ascent (``stiefax.muon.spectral_tangent_direction``) after ``K`` iterations
   from Bernstein's start, against plain dual ascent ``Lambda <- Lambda - alpha H`` at
   its best fixed step of a grid (``alpha`` relative to ``||G||_F / sqrt(r)``; the
   same Gram-space arithmetic, so only the step differs).
2. Float32 jitted time of one solve for ``K`` = 5, 10, 20 on (8, 128, 16) frames.
3. In training (``--train``): the gap the warm-started default leaves at the end of
   each epoch of the digits ``B2-mmuon`` run (median and max over frames).

    python -m benchmarks.mmuon_solver [--train] [--reps 20]
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import time_interleaved
import stiefax
from stiefax import geometry
from stiefax import muon

ITERATIONS = (2, 5, 10, 20, 40)
ALPHAS = (0.01, 0.03, 0.1, 0.3)


def plain_dual_ascent(w, g, iterations, alpha):
  """Bernstein's dual ascent with a fixed step, in Gram space; returns the gap."""
  mT, sym = geometry.mT, geometry.sym
  scale = jnp.sqrt(geometry.frame_sq_norm(g))[..., None, None]
  gn = g / scale
  m = mT(w) @ gn
  c = sym(mT(gn) @ gn - mT(m) @ m)
  b = m - sym(m)
  step = alpha / np.sqrt(w.shape[-1])  # alpha in units of ||G||_F / sqrt(r) = 1 / sqrt(r)
  for _ in range(iterations):
    z, _ = geometry.inverse_sqrt(mT(b) @ b + c, muon.NS_ITERATIONS)
    b = b - step * (b @ z + z @ mT(b))
  return muon.spectral_tangent_direction(w, g, 0.5 * (b - m), iterations=0).gap


def accuracy_table(shapes):
  print("float64 relative duality gap (median over frames) after K dual iterations")
  print(f"{'(H, d, r)':<14} {'solver':<28} " + " ".join(f"K={k:<7}" for k in ITERATIONS))
  with jax.enable_x64(True):
    for h, d, r in shapes:
      keys = jax.random.split(jax.random.key(0), 2)
      init = stiefax.flax.orthonormal_init(stiefax.FrameSpec(row_axis=1))
      w = init(keys[0], (h, d, r), jnp.float64)
      g = jax.random.normal(keys[1], (h, d, r), jnp.float64)
      row = [
        float(jnp.median(muon.spectral_tangent_direction(w, g, iterations=k).gap))
        for k in ITERATIONS
      ]
      print(
        f"{(h, d, r)!s:<14} {'preconditioned (shipped)':<28} " + " ".join(f"{v:<9.1e}" for v in row)
      )
      best = [
        min(float(jnp.median(plain_dual_ascent(w, g, k, a))) for a in ALPHAS) for k in ITERATIONS
      ]
      print(
        f"{(h, d, r)!s:<14} {'plain, best alpha of grid':<28} "
        + " ".join(f"{v:<9.1e}" for v in best)
      )


def timing(reps):
  keys = jax.random.split(jax.random.key(0), 2)
  w = stiefax.flax.orthonormal_init(stiefax.FrameSpec(row_axis=1))(keys[0], (8, 128, 16))
  g = jax.random.normal(keys[1], (8, 128, 16))
  calls = {}
  for k in (5, 10, 20):
    fn = jax.jit(lambda w, g, k=k: muon.spectral_tangent_direction(w, g, iterations=k))
    calls[f"K={k}"] = (fn, (w, g))
  calls["polar retraction"] = (jax.jit(geometry.polar), (w + 0.01 * g,))
  ms = time_interleaved(calls, reps=reps)
  print("float32 jitted ms per solve, 8 frames of St(128, 16)")
  for name, t in ms.items():
    print(f"  {name:<18} {t:.3f} ms")


def in_training():
  from stiefax.experiments.patches import config as patches_config
  from stiefax.experiments.patches import data as patch_data  # pylint: disable=g-import-not-at-top
  from stiefax.experiments.patches import images as patch_images
  from stiefax.experiments.patches import training as patches_training

  images = patch_images.load_images(None)
  data = patch_data.prepare(images, n_train=1000, n_val=0, patch=4, d=16, cache_dir=None)
  setting = patches_config.Setting(n_train=1000, epochs=40, d=16, heads=4, head_dim=4)
  arm = patches_config.ARMS["B2-mmuon"]
  trainer = patches_training.Trainer(
    arm,
    setting,
    patches_config.arm_hparams(arm, setting, None),
    data.train_x.shape[1],
    data.num_classes,
  )
  params, state = trainer.init(0)
  rng = np.random.default_rng([0, 1])
  xs, ys = jnp.asarray(data.train_x), jnp.asarray(data.train_y)
  print("digits B2-mmuon (default 10 warm-started iterations): gap after each 10th epoch")
  for ep in range(setting.epochs):
    idx, wts = trainer.batches(rng, data.train_x.shape[0])
    params, state, _ = trainer.epoch(params, state, xs, ys, jnp.asarray(idx), jnp.asarray(wts))
    if (ep + 1) % 10 == 0:
      gaps = np.concatenate(
        [
          np.ravel(x)
          for _, x in jax.tree_util.tree_leaves_with_path(state)
          if "gap" in jax.tree_util.keystr(_)
        ]
      )
      print(f"  epoch {ep + 1:>3}: median {np.median(gaps):.1e}, max {np.max(gaps):.1e}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=20)
  parser.add_argument("--train", action="store_true", help="also the in-training gaps")
  parser.add_argument("--quick", action="store_true", help="small shapes only")
  args = parser.parse_args()
  shapes = [(4, 16, 4)] if args.quick else [(4, 16, 4), (8, 128, 16)]
  accuracy_table(shapes)
  timing(args.reps)
  if args.train:
    in_training()


if __name__ == "__main__":
  main()
