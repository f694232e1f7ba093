"""Custom frames: layer-stacked kernels, block-orthogonal heads, a non-attention frame.

A model written directly in JAX (no Flax), whose parameters are a plain dict:

* `layers/query`, `layers/key`: layer-stacked attention kernels `(L, d, H, r)`, run
  with `jax.lax.scan` over the layers. `FrameSpec(row_axis=1)` views each as L x H
  frames in St(d, r): one per layer and head.
* `pool/query`, `pool/key`: a pooling attention whose heads are *block-orthogonal*:
  `FrameSpec(col_axes=(-2, -1))` merges the H heads of a `(d, H, r)` kernel into one
  St(d, H * r) frame, so all heads are mutually orthogonal (paper section 3.2).
* `embed`: the input projection `(d_in, d)`, not an attention matrix at all, kept
  orthonormal with the default `FrameSpec()` (one St(d_in, d) frame).

One `frames` callable maps each leaf's path to its FrameSpec, one `labels` callable
marks the frames "stiefel" (everything else "adamw"), and `stiefax.stiefel_adamw`
trains the lot. The task: which of C prototypes hides, at a random position, in a noise sequence.

    python examples/custom_frames.py --steps 300

Prints the loss, the accuracy, the isometry error of every frame group, and the
largest inner product between different heads (zero only for the block frames).
"""

import argparse
import math
import time

import jax
import jax.numpy as jnp
import optax

import stiefax
from stiefax.layouts import path_names

D_IN, D, H, R, LAYERS, POOL_R, CLASSES, SEQ = 48, 32, 4, 8, 3, 4, 4, 8


def frames(path, leaf):
  """The FrameSpec of each frame leaf, chosen from its path."""
  names = path_names(path)
  if "layers" in names:
    return stiefax.FrameSpec(row_axis=1)  # (L, d, H, r): L x H frames in St(d, r)
  if "pool" in names:
    return stiefax.FrameSpec(col_axes=(-2, -1))  # (d, H, r): one St(d, H r) frame
  return stiefax.FrameSpec()  # embed (d_in, d): one St(d_in, d) frame


def labels(params):
  """ "stiefel" for the attention query/key kernels and the embedding, else "adamw"."""

  def label(path, _):
    names = path_names(path)
    is_frame = names[-1] in ("query", "key") or names == ("embed",)
    return "stiefel" if is_frame else "adamw"

  return jax.tree_util.tree_map_with_path(label, params)


def init_params(key):
  ks = jax.random.split(key, 8)
  orth = lambda spec: stiefax.flax.orthonormal_init(spec)
  dense = lambda k, shape: (
    jax.random.normal(k, shape) / math.sqrt(shape[-2] if len(shape) > 1 else 1)
  )
  return {
    "embed": orth(stiefax.FrameSpec())(ks[0], (D_IN, D)),
    "layers": {
      "query": orth(stiefax.FrameSpec(row_axis=1))(ks[1], (LAYERS, D, H, R)),
      "key": orth(stiefax.FrameSpec(row_axis=1))(ks[2], (LAYERS, D, H, R)),
      "value": jax.random.normal(ks[3], (LAYERS, D, H, R)) / math.sqrt(D),
      "out": jax.random.normal(ks[4], (LAYERS, H, R, D)) / math.sqrt(H * R),
    },
    "pool": {
      "query": orth(stiefax.FrameSpec(col_axes=(-2, -1)))(ks[5], (D, H, POOL_R)),
      "key": orth(stiefax.FrameSpec(col_axes=(-2, -1)))(ks[6], (D, H, POOL_R)),
    },
    "head": {"kernel": dense(ks[7], (D, CLASSES)), "bias": jnp.zeros((CLASSES,))},
  }


def attention(x, wq, wk, wv=None):
  q = jnp.einsum("bnd,dhr->bhnr", x, wq)
  k = jnp.einsum("bnd,dhr->bhnr", x, wk)
  a = jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]), axis=-1)
  return a if wv is None else a @ jnp.einsum("bnd,dhr->bhnr", x, wv)


def rms(x):
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6)


def apply(params, x):
  h = x @ params["embed"]

  def layer(h, p):
    o = attention(rms(h), p["query"], p["key"], p["value"])
    return h + jnp.einsum("bhnr,hrd->bnd", o, p["out"]), None

  h, _ = jax.lax.scan(layer, h, params["layers"])
  a = attention(rms(h), params["pool"]["query"], params["pool"]["key"])  # (b, H, n, n)
  pooled = jnp.einsum("bhnm,bmd->bd", a, rms(h)) / (H * SEQ)
  return pooled @ params["head"]["kernel"] + params["head"]["bias"]


def prototype_data(key, n):
  """Noise sequences with one hidden token at a random position: a class prototype."""
  k_proto, k_label, k_pos, k_noise = jax.random.split(key, 4)
  protos = jax.random.normal(k_proto, (CLASSES, D_IN))  # as long as a noise token
  y = jax.random.randint(k_label, (n,), 0, CLASSES)
  pos = jax.random.randint(k_pos, (n,), 0, SEQ)
  x = jax.random.normal(k_noise, (n, SEQ, D_IN))
  x = x.at[jnp.arange(n), pos].add(protos[y])
  return x, y


def cross_head(w, spec):
  """max |W_h^T W_h'| over pairs of different heads h != h' (of the same layer)."""
  f = stiefax.FrameSpec(row_axis=spec.row_axis).to_frames(w)  # (..., H, d, r) per head
  g = jnp.einsum("...hdr,...gds->...hgrs", f, f)
  off = 1.0 - jnp.eye(f.shape[-3])[:, :, None, None]
  return float(jnp.max(jnp.abs(g * off)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
  parser.add_argument("--lr", type=float, default=3e-3, help="AdamW rate (default 3e-3)")
  args = parser.parse_args()

  x, y = prototype_data(jax.random.key(0), 2048)
  x_test, y_test = x[1536:], y[1536:]
  x, y = x[:1536], y[:1536]
  params = init_params(jax.random.key(1))
  tx = stiefax.stiefel_adamw(
    args.lr,
    weight_decay=0.01,
    frames=frames,  # one FrameSpec per leaf
    labels=labels,
  )
  opt_state = tx.init(params)

  def loss_fn(p, xb, yb):
    return optax.softmax_cross_entropy_with_integer_labels(apply(p, xb), yb).mean()

  @jax.jit
  def train_step(params, opt_state, key):
    idx = jax.random.randint(key, (128,), 0, x.shape[0])
    loss, grads = jax.value_and_grad(loss_fn)(params, x[idx], y[idx])
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  def iso(p, group):
    tree = (
      {"embed": p["embed"]}
      if group == "embed"
      else {group: {k: p[group][k] for k in ("query", "key")}}
    )
    return stiefax.diagnostics.isometry_error(tree, labels, frames=frames)

  @jax.jit
  def evaluate(p):
    acc = jnp.mean(jnp.argmax(apply(p, x_test), -1) == y_test)
    return acc, iso(p, "layers"), iso(p, "pool"), iso(p, "embed")

  start = time.perf_counter()
  key = jax.random.key(2)
  report_every = max(1, args.steps // 5)
  for step in range(1, args.steps + 1):
    key, sub = jax.random.split(key)
    params, opt_state, loss = train_step(params, opt_state, sub)
    if step % report_every == 0 or step == args.steps:
      acc, iso_layers, iso_pool, iso_embed = (float(v) for v in evaluate(params))
      print(
        f"step {step:>5}  loss {float(loss):.4f}  test acc {acc:.3f}  isometry:"
        f" layers {iso_layers:.1e}, pool {iso_pool:.1e}, embed {iso_embed:.1e}",
        flush=True,
      )
  print(
    "largest inner product between different heads:"
    f" layers/query {cross_head(params['layers']['query'], stiefax.FrameSpec(row_axis=1)):.2f}"
    " (per-head frames),"
    f" pool/query {cross_head(params['pool']['query'], stiefax.FrameSpec()):.1e}"
    " (block-orthogonal)"
  )
  print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
  main()
