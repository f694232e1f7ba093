"""Flax linen and nnx integration: labels, initializers, and training end to end."""

from flax import linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax import FrameSpec

SAFE_METHODS = ["auto", "newton_schulz"]  # matrix products only: safe in fused steps


class LinenEncoder(nn.Module):
  """A tiny pre-LN transformer encoder with a classifier head."""

  depth: int = 2
  d: int = 16
  heads: int = 2

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.d)(x)
    for _ in range(self.depth):
      h = h + nn.MultiHeadDotProductAttention(num_heads=self.heads)(nn.LayerNorm()(h))
      h = h + nn.Dense(self.d)(nn.gelu(nn.Dense(2 * self.d)(nn.LayerNorm()(h))))
    return nn.Dense(3)(h.mean(axis=1))


class NnxEncoder(nnx.Module):
  def __init__(self, rngs, d=16, heads=2):
    self.embed = nnx.Linear(4, d, rngs=rngs)
    self.norm = nnx.LayerNorm(d, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(
      num_heads=heads,
      in_features=d,
      decode=False,
      rngs=rngs,
      kernel_init=stiefax.flax.orthonormal_init(),
    )
    self.head = nnx.Linear(d, 3, rngs=rngs)

  def __call__(self, x):
    h = self.embed(x)
    h = h + self.attn(self.norm(h))
    return self.head(h.mean(axis=1))


def toy_data(n=64, seq=5):
  x = jax.random.normal(jax.random.key(0), (n, seq, 4))
  y = (jnp.sum(x[:, 0, :2], -1) > 0).astype(jnp.int32) + (x[:, -1, 3] > 1).astype(jnp.int32)
  return x, y


def xent(logits, y):
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def test_qk_labels_linen_paths():
  params = LinenEncoder().init(jax.random.key(0), toy_data()[0])
  labels = stiefax.layouts.qk_labels(params)
  flat = {
    "/".join(stiefax.layouts.path_names(p)): l
    for p, l in jax.tree_util.tree_flatten_with_path(labels)[0]
  }
  frames = sorted(k for k, l in flat.items() if l == "stiefel")
  assert frames == [
    "params/MultiHeadDotProductAttention_0/key/kernel",
    "params/MultiHeadDotProductAttention_0/query/kernel",
    "params/MultiHeadDotProductAttention_1/key/kernel",
    "params/MultiHeadDotProductAttention_1/query/kernel",
  ]


def test_qk_labels_match_whole_names_only():
  tree = {
    "my_query": {"kernel": 0},
    "key": {"bias": 0, "kernel": 0},
    "value": {"kernel": 0},
    "query": {"kernel": 0, "sub": {"kernel": 0}},
  }
  labels = stiefax.layouts.qk_labels(tree)
  assert labels == {
    "my_query": {"kernel": "adamw"},
    "key": {"bias": "adamw", "kernel": "stiefel"},
    "value": {"kernel": "adamw"},
    "query": {"kernel": "stiefel", "sub": {"kernel": "adamw"}},
  }


def test_qk_labels_nnx_init_and_update_paths():
  model = NnxEncoder(nnx.Rngs(0))
  at_init = nnx.state(model, nnx.Param)  # Variables: paths end in `.value`
  at_update = nnx.as_pure(at_init)  # plain arrays
  for tree in (at_init, at_update):
    labels = jax.tree.leaves(stiefax.layouts.qk_labels(tree))
    assert labels.count("stiefel") == 2 and len(labels) == len(jax.tree.leaves(tree))


def test_orthonormal_init_is_per_frame_and_haar_like():
  w = stiefax.flax.orthonormal_init()(jax.random.key(0), (32, 4, 8))
  assert float(stiefax.diagnostics.isometry_error(w)) < 1e-5
  assert not np.allclose(w[:, 0], w[:, 1])
  stacked = stiefax.flax.orthonormal_init(FrameSpec(row_axis=1))(jax.random.key(0), (3, 32, 4, 8))
  assert float(stiefax.diagnostics.isometry_error(stacked, frames=FrameSpec(row_axis=1))) < 1e-5
  w16 = stiefax.flax.orthonormal_init()(jax.random.key(0), (32, 4, 8), jnp.bfloat16)
  assert w16.dtype == jnp.bfloat16
  with pytest.raises(ValueError, match="r <= d"):
    stiefax.flax.orthonormal_init()(jax.random.key(0), (4, 2, 8))


def test_project_params_and_penalty(rng):
  params = LinenEncoder().init(jax.random.key(0), toy_data()[0])
  assert float(stiefax.flax.orthogonality_penalty(params)) > 1.0
  snapped = stiefax.flax.project_params(params)
  assert float(stiefax.diagnostics.isometry_error(snapped, stiefax.layouts.qk_labels)) < 1e-5
  assert float(stiefax.flax.orthogonality_penalty(snapped)) < 1e-9
  # Everything else is untouched, and the snap is the nearest frame.
  kernel = params["params"]["MultiHeadDotProductAttention_0"]["query"]["kernel"]
  w = np.transpose(np.asarray(kernel, np.float64), (1, 0, 2))
  u, _, vt = np.linalg.svd(w, full_matrices=False)
  np.testing.assert_allclose(
    np.transpose(snapped["params"]["MultiHeadDotProductAttention_0"]["query"]["kernel"], (1, 0, 2)),
    u @ vt,
    atol=1e-5,
  )
  v0 = params["params"]["MultiHeadDotProductAttention_0"]["value"]["kernel"]
  np.testing.assert_array_equal(
    snapped["params"]["MultiHeadDotProductAttention_0"]["value"]["kernel"], v0
  )
  # The penalty is differentiable and pulls toward the manifold.
  g = jax.grad(stiefax.flax.orthogonality_penalty)(params)
  assert float(jnp.abs(g["params"]["MultiHeadDotProductAttention_0"]["query"]["kernel"]).max()) > 0


def _linen_setup(polar):
  model = LinenEncoder()
  x, y = toy_data()
  params = stiefax.flax.project_params(model.init(jax.random.key(1), x))
  tx = stiefax.stiefel_adamw(
    1e-2, weight_decay=0.01, stiefel=stiefax.riemannian_adam(0.5, method=polar)
  )

  def step(carry, _):
    params, state = carry
    loss, grads = jax.value_and_grad(lambda p: xent(model.apply(p, x), y))(params)
    updates, state = tx.update(grads, state, params)
    return (optax.apply_updates(params, updates), state), loss

  return params, tx.init(params), step


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
  "polar",
  # "auto" runs Newton-Schulz with the cap's fixed iteration count; the open-ended
  # iteration is the same path, behind the slow marker.
  [pytest.param(m, marks=pytest.mark.slow) if m != "auto" else m for m in SAFE_METHODS],
)
def test_linen_training_step_jit_five_calls_and_scan(polar):
  params, state, step = _linen_setup(polar)
  jstep = jax.jit(lambda c: step(c, None))
  carry = (params, state)
  losses = []
  for _ in range(5):  # repeated calls of one compiled fused step
    carry, loss = jstep(carry)
    losses.append(float(loss))
  scanned = jax.jit(lambda c: jax.lax.scan(step, c, None, length=60))
  (new, _), scan_losses = scanned(carry)
  assert float(scan_losses[-1]) < losses[0] * 0.8
  labels = stiefax.layouts.qk_labels(new)
  assert float(stiefax.diagnostics.isometry_error(new, labels)) <= 2e-5
  # Every Euclidean parameter trained; every frame moved on the manifold.
  moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), new, params)
  assert all(m > 0 for m in jax.tree.leaves(moved))


@pytest.mark.timeout(120)
def test_nnx_optimizer_trains_and_keeps_frames():
  model = NnxEncoder(nnx.Rngs(0))
  x, y = toy_data()
  optimizer = nnx.Optimizer(model, stiefax.stiefel_adamw(1e-2, weight_decay=0.01), wrt=nnx.Param)
  before = jax.tree.map(jnp.copy, nnx.as_pure(nnx.state(model, nnx.Param)))

  @nnx.jit
  def train_step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: xent(m(x), y))(model)
    optimizer.update(model, grads)
    return loss

  losses = [float(train_step(model, optimizer)) for _ in range(40)]
  assert losses[-1] < 0.8 * losses[0]
  after = nnx.as_pure(nnx.state(model, nnx.Param))
  assert float(stiefax.diagnostics.isometry_error(after, stiefax.layouts.qk_labels)) <= 2e-5
  moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), after, before)
  assert all(m > 0 for m in jax.tree.leaves(moved))


def test_qk_labels_raise_on_unrecognized_attention_names():
  tree = {
    "blocks_0": {
      "self_attn": {"wq": {"kernel": jnp.ones((8, 2, 4))}, "wk": {"kernel": jnp.ones((8, 2, 4))}}
    }
  }
  with pytest.raises(
    ValueError, match=r"selects no frame.*blocks_0/self_attn/wq/kernel \(8, 2, 4\)"
  ):
    stiefax.layouts.qk_labels(tree)
  with pytest.raises(ValueError, match="selects no frame"):  # a wrong modules= too
    stiefax.layouts.qk_labels(tree, modules=("w_q", "w_k"))
  with pytest.raises(ValueError, match="selects no frame"):
    stiefax.diagnostics.isometry_error(tree, stiefax.layouts.qk_labels)
  labels = stiefax.layouts.qk_labels(tree, modules=("wq", "wk"))
  assert jax.tree.leaves(labels) == ["stiefel", "stiefel"]
  # A tree with nothing attention-like is all AdamW, without an error.
  assert jax.tree.leaves(stiefax.layouts.qk_labels({"mlp": {"kernel": jnp.ones((4, 4))}})) == [
    "adamw"
  ]
  assert stiefax.layouts.attention_like({"mlp": {"kernel": jnp.ones((4, 4))}}) == []
