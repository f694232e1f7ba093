"""stiefax's Riemannian Adam step against geoopt's RiemannianAdam on EuclideanStiefel.

Needs the optional ``bench`` extra (``pip install -e ".[bench]"``: PyTorch CPU and
geoopt). Same frame shapes ``(H, d, r)``, float32, CPU; the time of one full optimizer
step (update and apply) is the median over ``--reps`` steps after warm-up. geoopt's
RiemannianAdam keeps an elementwise second moment and retracts with a QR-based
retraction; stiefax's runs the paper's B2 (scalar moment, cap, polar retraction).

    python benchmarks/vs_geoopt.py [--reps 50]
"""

import argparse
import statistics
import time

import jax
import optax

import stiefax
from benchmarks.common import time_fn

SHAPES = [(8, 128, 16), (4, 128, 32), (12, 768, 64)]


def geoopt_ms(shape, reps):
  import geoopt  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  manifold = geoopt.EuclideanStiefel()
  w = geoopt.ManifoldParameter(manifold.random(*shape), manifold=manifold)
  opt = geoopt.optim.RiemannianAdam([w], lr=1e-2, stabilize=None)
  grads = [torch.randn(*shape) for _ in range(4)]
  times = []
  for i in range(reps + 3):
    w.grad = grads[i % 4]
    t0 = time.perf_counter()
    opt.step()
    if i >= 3:
      times.append((time.perf_counter() - t0) * 1e3)
  return statistics.median(times)


def stiefax_ms(shape, reps):
  # The same (H, d, r) layout: the frame rows are axis 1.
  frames = stiefax.FrameSpec(row_axis=1)
  w = stiefax.flax.orthonormal_init(frames)(jax.random.key(0), shape)
  g = jax.random.normal(jax.random.key(1), shape)
  tx = stiefax.riemannian_adam(frames=frames)

  @jax.jit
  def step(w, state, g):
    u, state = tx.update(g, state, w)
    return optax.apply_updates(w, u), state

  return time_fn(step, w, tx.init(w), g, reps=reps)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=50)
  args = parser.parse_args()
  print(f"{'(H, d, r)':<16} {'geoopt ms':>10} {'stiefax ms':>11} {'speed-up':>9}")
  ups = []
  for shape in SHAPES:
    g_ms, s_ms = geoopt_ms(shape, args.reps), stiefax_ms(shape, args.reps)
    ups.append((shape, g_ms / s_ms))
    print(f"{str(shape):<16} {g_ms:>10.3f} {s_ms:>11.3f} {g_ms / s_ms:>8.2f}x", flush=True)
  print("summary: stiefax step vs geoopt RiemannianAdam: "
        + ", ".join(f"{s} {u:.2f}x faster" for s, u in ups))


if __name__ == "__main__":
  main()
