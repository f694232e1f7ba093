"""A small transformer in Flax nnx, trained with `nnx.Optimizer` and stiefax.

`nnx.MultiHeadAttention` keeps its query/key kernels as `(d_model, heads, head_dim)`;
`kernel_init=stiefax.flax.orthonormal_init()` draws every head's frame orthonormal and
`nnx.Optimizer(model, stiefax.stiefel_adamw(...), wrt=nnx.Param)` keeps the query/key
frames on the Stiefel manifold (the corrected Riemannian Adam) while AdamW trains the
rest. The task is a toy pointer lookup: the first token p of each sequence names a
position, and the model must output the token found there.

    python examples/nnx_transformer.py --steps 400

Prints the loss, the accuracy on fresh sequences and the isometry error of the
query/key frames.
"""

import argparse
import time

from flax import nnx
import jax
import jax.numpy as jnp
import optax

import stiefax


class Block(nnx.Module):
  def __init__(self, d, heads, rngs):
    self.ln_attn = nnx.LayerNorm(d, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(
      num_heads=heads,
      in_features=d,
      decode=False,
      rngs=rngs,
      kernel_init=stiefax.flax.orthonormal_init(),
    )  # one orthonormal frame per head
    self.ln_mlp = nnx.LayerNorm(d, rngs=rngs)
    self.mlp_in = nnx.Linear(d, 2 * d, rngs=rngs)
    self.mlp_out = nnx.Linear(2 * d, d, rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(self.ln_attn(x))
    return x + self.mlp_out(nnx.gelu(self.mlp_in(self.ln_mlp(x))))


class Transformer(nnx.Module):
  def __init__(self, vocab, seq, d=32, heads=4, depth=2, *, rngs):
    self.embed = nnx.Embed(vocab, d, rngs=rngs)
    self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (seq, d)))
    self.blocks = nnx.List([Block(d, heads, rngs) for _ in range(depth)])
    self.ln = nnx.LayerNorm(d, rngs=rngs)
    self.head = nnx.Linear(d, vocab, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens) + self.pos[...]
    for block in self.blocks:
      x = block(x)
    return self.head(self.ln(x)[:, 0])


def pointer(key, n, seq=8, vocab=8):
  """Sequences whose first token p (1 <= p < seq) points at a position: the answer is token p."""
  k_ptr, k_tok = jax.random.split(key)
  ptr = jax.random.randint(k_ptr, (n,), 1, seq)
  tokens = jax.random.randint(k_tok, (n, seq), 0, vocab).at[:, 0].set(ptr)
  return tokens, jnp.take_along_axis(tokens, ptr[:, None], 1)[:, 0]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=400, help="training steps (default 400)")
  parser.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
  parser.add_argument("--lr", type=float, default=3e-3, help="AdamW rate (default 3e-3)")
  args = parser.parse_args()

  seq, vocab = 8, 8
  model = Transformer(vocab, seq, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, stiefax.stiefel_adamw(args.lr, weight_decay=0.05), wrt=nnx.Param)
  x_test, y_test = pointer(jax.random.key(1), 1024, seq, vocab)

  @nnx.jit
  def train_step(model, optimizer, key):
    x, y = pointer(key, args.batch, seq, vocab)

    def loss_fn(m):
      return optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  @nnx.jit
  def accuracy(model):
    return jnp.mean(jnp.argmax(model(x_test), -1) == y_test)

  def isometry(model):
    params = nnx.as_pure(nnx.state(model, nnx.Param))
    return float(stiefax.diagnostics.isometry_error(params, stiefax.layouts.qk_labels))

  print(f"initial isometry error of the query/key frames: {isometry(model):.1e}")
  start = time.perf_counter()
  key = jax.random.key(2)
  report_every = max(1, args.steps // 5)
  for step in range(1, args.steps + 1):
    key, sub = jax.random.split(key)
    loss = train_step(model, optimizer, sub)
    if step % report_every == 0 or step == args.steps:
      print(
        f"step {step:>5}  loss {float(loss):.4f}  accuracy {float(accuracy(model)):.3f}"
        f"  isometry error {isometry(model):.1e}",
        flush=True,
      )
  print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
  main()
