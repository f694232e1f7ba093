"""stiefax's Riemannian Adam step against geoopt's RiemannianAdam on EuclideanStiefel.

Needs the optional ``bench`` extra (``pip install -e ".[bench]"``: PyTorch CPU and
geoopt). Same frame shapes ``(H, d, r)``, float32, CPU; the time of one full optimizer
step (update and apply) is the median over ``--reps`` steps after warm-up. Both update
in place: geoopt's ``opt.step()`` writes into the parameter, stiefax's jitted step
donates the parameter and state buffers. geoopt's RiemannianAdam keeps an elementwise
second moment and retracts with a QR-based retraction; stiefax's runs the paper's B2
(scalar moment, cap, polar retraction). The last column is stiefax's step inside a
jitted ``lax.fori_loop`` (no Python dispatch), which shows how much of the per-call
time is the fixed cost of calling a jitted function.

    python benchmarks/vs_geoopt.py [--reps 50]
"""

import argparse
import statistics
import time

import jax
import optax

from benchmarks.common import time_fn
import stiefax

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


def stiefax_ms(shape, reps, loop_steps=100):
  """(ms per jitted call with donated buffers, ms per step inside one jitted loop)."""
  # The same (H, d, r) layout: the frame rows are axis 1.
  frames = stiefax.FrameSpec(row_axis=1)
  w = stiefax.flax.orthonormal_init(frames)(jax.random.key(0), shape)
  g = jax.random.normal(jax.random.key(1), shape)
  tx = stiefax.riemannian_adam(1.0, frames=frames)

  def step(w, state, g):
    u, state = tx.update(g, state, w)
    return optax.apply_updates(w, u), state

  donated = jax.jit(step, donate_argnums=(0, 1))
  carry = [(w.copy(), tx.init(w))]

  def call():
    carry[0] = donated(*carry[0], g)
    return carry[0][0]

  @jax.jit
  def loop(w, state, g):
    return jax.lax.fori_loop(0, loop_steps, lambda _, c: step(*c, g), (w, state))

  per_call = time_fn(call, reps=reps)
  per_loop_step = time_fn(loop, w, tx.init(w), g, reps=max(reps // 10, 5)) / loop_steps
  return per_call, per_loop_step


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=50)
  args = parser.parse_args()
  print(
    f"{'(H, d, r)':<16} {'geoopt ms':>10} {'stiefax ms':>11} {'speed-up':>9}"
    f" {'stiefax in-loop ms':>19}"
  )
  ups = []
  for shape in SHAPES:
    g_ms = geoopt_ms(shape, args.reps)
    s_ms, loop_ms = stiefax_ms(shape, args.reps)
    ups.append((shape, g_ms / s_ms))
    print(
      f"{shape!s:<16} {g_ms:>10.3f} {s_ms:>11.3f} {g_ms / s_ms:>8.2f}x {loop_ms:>19.3f}",
      flush=True,
    )
  print(
    "summary: stiefax step vs geoopt RiemannianAdam: "
    + ", ".join(f"{s} {u:.2f}x faster" for s, u in ups)
  )


if __name__ == "__main__":
  main()
