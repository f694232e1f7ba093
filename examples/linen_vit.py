"""A small Vision Transformer (Flax linen) whose attention frames stay orthonormal.

The model cuts each image into non-overlapping patches, embeds them, and runs a
pre-LN encoder of `nn.MultiHeadDotProductAttention` blocks. The query/key kernels,
`(d_model, heads, head_dim)`, are kept on the Stiefel manifold by
`stiefax.stiefel_adamw` (the corrected Riemannian Adam, one St(d_model, head_dim)
frame per head); every other parameter trains with AdamW. The data are synthetic
16 x 16 images of oriented stripes (4 classes) so that the script needs no download.

    python examples/linen_vit.py --steps 300

Prints the loss, the held-out accuracy, and the isometry error max|W^T W - I| of the
query/key frames (float32 rounding, ~1e-7, throughout).
"""

import argparse
import time

from flax import linen as nn
import jax
import jax.numpy as jnp
import optax

import stiefax


class ViT(nn.Module):
  patch: int = 4
  d: int = 32
  heads: int = 4
  depth: int = 2
  classes: int = 4

  @nn.compact
  def __call__(self, images):  # (batch, height, width, channels)
    b, h, w, c = images.shape
    p = self.patch
    x = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    x = nn.Dense(self.d, name="patch_embed")(x.reshape(b, (h // p) * (w // p), p * p * c))
    x = x + self.param("pos_embed", nn.initializers.normal(0.02), x.shape[1:])
    for i in range(self.depth):
      y = nn.LayerNorm(name=f"ln_attn_{i}")(x)
      x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads, name=f"attn_{i}")(y)
      y = nn.LayerNorm(name=f"ln_mlp_{i}")(x)
      x = x + nn.Dense(self.d, name=f"mlp_out_{i}")(
        nn.gelu(nn.Dense(2 * self.d, name=f"mlp_in_{i}")(y))
      )
    return nn.Dense(self.classes, name="head")(nn.LayerNorm(name="ln_out")(x).mean(axis=1))


def stripes(key, n, size=16, classes=4):
  """Noisy sinusoidal stripes; the label is the stripe orientation (k * 180 / classes deg)."""
  k_label, k_phase, k_freq, k_noise = jax.random.split(key, 4)
  labels = jax.random.randint(k_label, (n,), 0, classes)
  angle = labels * jnp.pi / classes
  phase = jax.random.uniform(k_phase, (n,), maxval=2 * jnp.pi)
  freq = jax.random.uniform(k_freq, (n,), minval=0.5, maxval=1.2)
  yy, xx = jnp.meshgrid(jnp.arange(size), jnp.arange(size), indexing="ij")
  proj = jnp.cos(angle)[:, None, None] * xx + jnp.sin(angle)[:, None, None] * yy
  images = jnp.sin(freq[:, None, None] * proj + phase[:, None, None])
  images = images + 1.5 * jax.random.normal(k_noise, images.shape)
  return images[..., None], labels


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
  parser.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
  parser.add_argument("--lr", type=float, default=3e-3, help="AdamW rate (default 3e-3)")
  args = parser.parse_args()

  model = ViT()
  x_train, y_train = stripes(jax.random.key(0), 2048)
  x_test, y_test = stripes(jax.random.key(1), 512)
  params = model.init(jax.random.key(2), x_train[:1])

  # The three-line drop-in: snap W_Q, W_K onto St(d, r), one optimizer for the model.
  params = stiefax.flax.project_params(params, stiefax.layouts.qk_labels)
  # The frames' Riemannian rate follows the same warm-up and cosine, scaled to 1.0 at
  # the peak: frame_rate(t) = 1.0 * lr(t) / peak_learning_rate.
  tx = stiefax.stiefel_adamw(
    optax.warmup_cosine_decay_schedule(0.0, args.lr, max(1, args.steps // 10), max(2, args.steps)),
    weight_decay=0.05,
    peak_learning_rate=args.lr,
  )
  opt_state = tx.init(params)

  def loss_fn(p, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

  @jax.jit
  def train_step(params, opt_state, key):
    idx = jax.random.randint(key, (args.batch,), 0, x_train.shape[0])
    loss, grads = jax.value_and_grad(loss_fn)(params, x_train[idx], y_train[idx])
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  @jax.jit
  def accuracy(params):
    return jnp.mean(jnp.argmax(model.apply(params, x_test), -1) == y_test)

  start = time.perf_counter()
  key = jax.random.key(3)
  report_every = max(1, args.steps // 5)
  for step in range(1, args.steps + 1):
    key, sub = jax.random.split(key)
    params, opt_state, loss = train_step(params, opt_state, sub)
    if step % report_every == 0 or step == args.steps:
      iso = stiefax.diagnostics.isometry_error(params, stiefax.layouts.qk_labels)
      print(
        f"step {step:>5}  loss {float(loss):.4f}  test acc {float(accuracy(params)):.3f}"
        f"  isometry error {float(iso):.1e}",
        flush=True,
      )
  print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
  main()
