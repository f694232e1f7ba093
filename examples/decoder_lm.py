"""A small decoder-only language model with Gemma-style weights, trained in bfloat16.

A causal transformer over bytes, written with the parameter layout of Gemma
(google-deepmind/gemma): per layer an `attn` module whose queries are `q_einsum/w`
`(heads, d_model, head_dim)` and whose keys and values share one fused
`kv_einsum/w` `(2, kv_heads, d_model, head_dim)` (grouped-query attention: each key/value
head serves heads / kv_heads query heads); with `--kv-heads` equal to `--heads` the
three projections fuse into `qkv_einsum/w` `(3, heads, d_model, head_dim)`, as in Gemma.
Every parameter is bfloat16.

`stiefax.stiefel_adamw` finds these weights by name: every query head and every key
head is a frame in St(d_model, head_dim) trained by the corrected Riemannian Adam,
while the value slice of the same fused weight, and everything else, trains with AdamW.
No argument names the layout:

    params = stiefax.flax.project_params(params)
    tx = stiefax.stiefel_adamw(3e-3, weight_decay=0.05)

The text is the Python standard library's own source, read from the running
interpreter (no download); the last tenth of it is held out.

    python examples/decoder_lm.py --steps 600

Prints the training loss, the held-out loss in bits per byte, the isometry error of
the query/key frames (bfloat16 rounding, about 4e-3 at most) and, as the control, how
far the AdamW-trained value slices are from orthonormal.
"""

import argparse
import math
import pathlib
import sysconfig
import time

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import stiefax

DTYPE = jnp.bfloat16


def stdlib_bytes(limit: int) -> np.ndarray:
  """Up to ``limit`` bytes of the standard library's .py sources, in a fixed order."""
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  chunks, total = [], 0
  for path in sorted(root.glob("*.py")):
    data = path.read_bytes()
    chunks.append(data)
    total += len(data)
    if total >= limit:
      break
  return np.frombuffer(b"".join(chunks)[:limit], np.uint8)


class RMSNorm(nn.Module):
  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.zeros_init(), (x.shape[-1],), DTYPE)
    var = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
    return (x * jax.lax.rsqrt(var + 1e-6)).astype(DTYPE) * (1 + scale)


class Einsum(nn.Module):
  """A weight ``w`` of a given shape, applied with an einsum (Gemma's ``Einsum``)."""

  shape: tuple
  init: callable = nn.initializers.lecun_normal()

  @nn.compact
  def __call__(self, eqn, x):
    return jnp.einsum(eqn, x, self.param("w", self.init, self.shape, DTYPE))


class Attention(nn.Module):
  heads: int
  kv_heads: int
  head_dim: int

  @nn.compact
  def __call__(self, x):
    d, h, k, r = x.shape[-1], self.heads, self.kv_heads, self.head_dim
    if h == k:  # one fused weight: q, k and v slices
      init = stiefax.flax.orthonormal_init(stiefax.FrameSpec(row_axis=2))
      q, key, v = Einsum((3, h, d, r), init, name="qkv_einsum")("btd,sndr->sbtnr", x)
    else:  # grouped-query attention: q alone, k and v fused
      q = Einsum(
        (h, d, r), stiefax.flax.orthonormal_init(stiefax.FrameSpec(row_axis=1)), name="q_einsum"
      )("btd,ndr->btnr", x)
      init = stiefax.flax.orthonormal_init(stiefax.FrameSpec(row_axis=2))
      key, v = Einsum((2, k, d, r), init, name="kv_einsum")("btd,cndr->cbtnr", x)
      key, v = jnp.repeat(key, h // k, axis=2), jnp.repeat(v, h // k, axis=2)
    t = x.shape[1]
    logits = jnp.einsum("btnr,bsnr->bnts", q, key) / math.sqrt(r)
    causal = jnp.tril(jnp.ones((t, t), bool))
    logits = jnp.where(causal, logits.astype(jnp.float32), -1e30)
    weights = jax.nn.softmax(logits, axis=-1).astype(DTYPE)
    out = jnp.einsum("bnts,bsnr->btnr", weights, v)
    return Einsum((h, r, d), name="attn_vec_einsum")("btnr,nrd->btd", out)


class Block(nn.Module):
  heads: int
  kv_heads: int
  head_dim: int

  @nn.compact
  def __call__(self, x):
    x = x + Attention(self.heads, self.kv_heads, self.head_dim, name="attn")(
      RMSNorm(name="pre_attention_norm")(x)
    )
    y = RMSNorm(name="pre_ffw_norm")(x)
    d = x.shape[-1]
    gate, up = Einsum((2, d, 4 * d), name="gating_einsum")("btd,cdf->cbtf", y)
    y = Einsum((4 * d, d), name="linear")("btf,fd->btd", nn.gelu(gate) * up)
    return x + y


class DecoderLM(nn.Module):
  vocab: int = 256
  d_model: int = 64
  depth: int = 2
  heads: int = 4
  kv_heads: int = 2
  head_dim: int = 16
  seq: int = 128

  @nn.compact
  def __call__(self, tokens):
    embed = self.param(
      "input_embedding",
      nn.initializers.normal(self.d_model**-0.5),
      (self.vocab, self.d_model),
      DTYPE,
    )
    pos = self.param(
      "position_embedding", nn.initializers.normal(0.02), (self.seq, self.d_model), DTYPE
    )
    x = embed[tokens] * math.sqrt(self.d_model) + pos[: tokens.shape[1]]
    x = x.astype(DTYPE)
    for i in range(self.depth):
      x = Block(self.heads, self.kv_heads, self.head_dim, name=f"layer_{i}")(x)
    x = RMSNorm(name="final_norm")(x)
    return jnp.einsum("btd,vd->btv", x, embed).astype(jnp.float32)  # tied embedding


def value_slices(params):
  """The AdamW-trained value slices of the fused weights, as (heads, d, r) frames."""
  out = []
  for path, w in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = stiefax.layouts.path_names(path)
    if names[-2:] in (("kv_einsum", "w"), ("qkv_einsum", "w")):
      out.append(w[-1])  # the v slice: (kv_heads, d, r)
  return jnp.concatenate(out).astype(jnp.float32)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=600, help="training steps (default 600)")
  parser.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
  parser.add_argument("--seq", type=int, default=128, help="bytes per sequence (default 128)")
  parser.add_argument("--heads", type=int, default=4, help="query heads (default 4)")
  parser.add_argument(
    "--kv-heads",
    type=int,
    default=2,
    help="key/value heads (default 2; equal to --heads fuses qkv_einsum)",
  )
  parser.add_argument("--lr", type=float, default=3e-3, help="AdamW rate (default 3e-3)")
  parser.add_argument(
    "--text-bytes",
    type=int,
    default=2_000_000,
    help="bytes of standard-library source to read (default 2e6)",
  )
  args = parser.parse_args()
  if args.heads % args.kv_heads:
    parser.error("--heads must be a multiple of --kv-heads")

  data = stdlib_bytes(args.text_bytes)
  split = int(0.9 * len(data))
  train, held_out = jnp.asarray(data[:split]), jnp.asarray(data[split:])
  print(
    f"text: {len(data):,} bytes of standard-library source ({split:,} train,"
    f" {len(data) - split:,} held out)"
  )

  model = DecoderLM(heads=args.heads, kv_heads=args.kv_heads, seq=args.seq)
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, args.seq), jnp.int32))
  params = stiefax.flax.project_params(params)  # a no-op here: initialized orthonormal
  tx = stiefax.stiefel_adamw(  # the frames' rate decays with the same cosine
    optax.cosine_decay_schedule(args.lr, max(args.steps, 1)),
    weight_decay=0.05,
    peak_learning_rate=args.lr,
  )
  state = tx.init(params)  # eager: checks that every bfloat16 frame is orthonormal
  labels = stiefax.layouts.qk_labels(params)
  n_frames = sum(
    math.prod(stiefax.layouts.qk_frames()(p, w).batch_shape(w.shape))
    for (p, w), lab in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(labels))
    if lab == "stiefel"
  )
  print(
    f"{n_frames} query/key frames in St({model.d_model}, {model.head_dim}), all"
    f" parameters {jax.tree.leaves(params)[0].dtype}"
  )

  def batch(key, text, n):
    starts = jax.random.randint(key, (n,), 0, len(text) - args.seq - 1)
    idx = starts[:, None] + jnp.arange(args.seq + 1)
    seqs = text[idx].astype(jnp.int32)
    return seqs[:, :-1], seqs[:, 1:]

  def loss_fn(params, x, y):
    logits = model.apply(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  def train_step(params, state, key):
    x, y = batch(key, train, args.batch)
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  @jax.jit
  def evaluate(params):
    x, y = batch(jax.random.key(123), held_out, 64)
    return loss_fn(params, x, y) / math.log(2)

  isometry_error = jax.jit(
    lambda p: stiefax.diagnostics.isometry_error(p, stiefax.layouts.qk_labels)
  )

  def isometry(params):
    return float(isometry_error(params))

  print(
    f"step     0  held-out {float(evaluate(params)):.3f} bits/byte"
    f"  q/k isometry {isometry(params):.1e}",
    flush=True,
  )
  start = time.perf_counter()
  key = jax.random.key(1)
  report_every = max(1, args.steps // 6)
  for step in range(1, args.steps + 1):
    key, sub = jax.random.split(key)
    params, state, loss = train_step(params, state, sub)
    if step % report_every == 0 or step == args.steps:
      print(
        f"step {step:>5}  loss {float(loss):.3f} nats/byte  held-out {float(evaluate(params)):.3f}"
        f" bits/byte  q/k isometry {isometry(params):.1e}",
        flush=True,
      )
  v = value_slices(params)
  drift = float(jnp.max(jnp.abs(jnp.swapaxes(v, -1, -2) @ v - jnp.eye(v.shape[-1]))))
  print(f"value slices (AdamW, unconstrained): max|V^T V - I| = {drift:.2e}")
  print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
  main()
