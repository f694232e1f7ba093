"""Quickstart: a small Flax linen transformer trained with AdamW (A2) and with stiefax (B2).

Both arms share everything except how the query/key kernels are trained: A2 trains
them with AdamW like every other matrix; B2 keeps them on the Stiefel manifold with
the corrected Riemannian Adam (`stiefax.stiefel_adamw`). The script prints the loss and
the isometry error max|W^T W - I| of the query/key frames for both.

    python examples/quickstart.py --steps 200
"""

import argparse

from flax import linen as nn
import jax
import jax.numpy as jnp
import optax

import stiefax


class Encoder(nn.Module):
  d: int = 32
  heads: int = 4

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.d)(x)
    for _ in range(2):
      h = h + nn.MultiHeadDotProductAttention(num_heads=self.heads)(nn.LayerNorm()(h))
      h = h + nn.Dense(self.d)(nn.gelu(nn.Dense(4 * self.d)(nn.LayerNorm()(h))))
    return nn.Dense(2)(nn.LayerNorm()(h).mean(axis=1))


def task(key, n=512, seq=8, dim=8):
  """Is the first token more similar to the last token than to the middle one?"""
  x = jax.random.normal(key, (n, seq, dim))
  y = (jnp.sum(x[:, 0] * x[:, -1], -1) > jnp.sum(x[:, 0] * x[:, seq // 2], -1)).astype(jnp.int32)
  return x, y


def train(tx, params, model, x, y, steps):
  def loss_fn(p):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

  def step(carry, _):
    p, s = carry
    loss, g = jax.value_and_grad(loss_fn)(p)
    u, s = tx.update(g, s, p)
    return (optax.apply_updates(p, u), s), loss

  (params, _), losses = jax.jit(lambda p: jax.lax.scan(step, (p, tx.init(p)), None, length=steps))(
    params
  )
  return params, losses


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=300)
  args = parser.parse_args()

  model = Encoder()
  x, y = task(jax.random.key(0))
  params = model.init(jax.random.key(1), x)
  arms = {
    "A2 (AdamW everywhere)": (optax.adamw(1e-3, weight_decay=0.05), params),
    "B2 (stiefax.stiefel_adamw)": (
      stiefax.stiefel_adamw(1e-3, weight_decay=0.05),
      stiefax.flax.project_params(params),  # snap W_Q, W_K onto St(d, r)
    ),
  }
  print(f"{'arm':<28} {'first loss':>10} {'last loss':>10} {'isometry error':>15}")
  for name, (tx, p0) in arms.items():
    p, losses = train(tx, p0, model, x, y, args.steps)
    iso = stiefax.diagnostics.isometry_error(p, stiefax.layouts.qk_labels)
    print(f"{name:<28} {float(losses[0]):>10.4f} {float(losses[-1]):>10.4f} {float(iso):>15.2e}")


if __name__ == "__main__":
  main()
