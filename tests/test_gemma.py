"""stiefel_adamw on the Transformer of Google DeepMind's `gemma` library (tiny, random init).

Runs when `gemma.transformer` (the Flax Gemma of the `gemma` package, version 2.0.x) is
importable. Its package metadata requires `kauldron`, which requires TensorFlow, but
`gemma.transformer` itself imports only jax, flax and orbax, so install it without its
dependencies: `pip install --no-deps "gemma==2.0.8"`. No weights are downloaded.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax

T = pytest.importorskip(
  "gemma.transformer", reason='needs the gemma library: pip install --no-deps "gemma==2.0.8"'
)
modules = pytest.importorskip("gemma.modules")

SEQ, BATCH, STEPS = 8, 4, 3


def tiny(kv_heads, layers=2):
  """A 2-layer Gemma with d = 32, 4 heads of width 8 and ``kv_heads`` key/value heads."""
  config = T.TransformerConfig(
    num_layers=layers,
    num_embed=64,
    embed_dim=32,
    hidden_dim=64,
    num_heads=4,
    head_dim=8,
    num_kv_heads=kv_heads,
    final_logit_softcap=None,
    use_post_attn_norm=False,
    use_post_ffw_norm=False,
    attention_types=[modules.AttentionType.GLOBAL] * layers,
    max_cache_length=None,
  )
  return T.Transformer(config)


def inputs(tokens):
  b, t = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(t), (b, t))
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
  return tokens, positions, None, mask


def frames_found(params):
  """(path, shape, number of frames) of every parameter labelled a frame."""
  labels = stiefax.layouts.qk_labels(params)
  view = stiefax.layouts.qk_frames()
  out = []
  for (path, w), label in zip(
    jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(labels)
  ):
    if label == "stiefel":
      n = int(np.prod(view(path, w).batch_shape(w.shape)))
      out.append(("/".join(stiefax.layouts.path_names(path)), w.shape, n))
  return out


@pytest.mark.parametrize(
  "kv_heads,expected",
  [
    (2, {"q_einsum/w": ((4, 32, 8), 4), "kv_einsum/w": ((2, 2, 32, 8), 2)}),
    (4, {"qkv_einsum/w": ((3, 4, 32, 8), 8)}),
  ],
  ids=["grouped-query", "multi-head"],
)
def test_frames_are_exactly_the_query_and_key_heads(kv_heads, expected):
  model = tiny(kv_heads)
  params = model.init(jax.random.key(0), *inputs(jnp.zeros((1, SEQ), jnp.int32)))
  found = frames_found(params)
  assert len(found) == 2 * len(expected), found  # per layer
  for path, shape, n in found:
    name = "/".join(path.split("/")[-2:])
    assert path.startswith(("params/layer_0/attn/", "params/layer_1/attn/")), path
    assert expected[name] == (shape, n), (path, shape, n)


@pytest.mark.timeout(300)
def test_trains_under_jit_frames_orthonormal_values_as_adamw():
  model = tiny(kv_heads=2)
  params = model.init(jax.random.key(0), *inputs(jnp.zeros((1, SEQ), jnp.int32)))
  params = stiefax.flax.project_params(params)
  assert float(stiefax.diagnostics.isometry_error(params)) <= 1e-5
  tx = stiefax.stiefel_adamw(1e-2, weight_decay=0.05)
  adamw = optax.adamw(1e-2, weight_decay=0.05, mask=stiefax.layouts.decay_mask)
  state, ref_state = tx.init(params), adamw.init(params)

  def loss_fn(params, tokens):
    logits, _ = model.apply(params, *inputs(tokens[:, :-1]))
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  @jax.jit
  def step(params, state, ref_state, tokens):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    updates, state = tx.update(grads, state, params)
    # AdamW fed the same gradients: what the non-frame entries must do.
    ref_updates, ref_state = adamw.update(grads, ref_state, params)
    return optax.apply_updates(params, updates), state, ref_state, updates, ref_updates, loss

  losses = []
  for i in range(STEPS):
    tokens = jax.random.randint(jax.random.key(10 + i), (BATCH, SEQ + 1), 0, 64)
    params, state, ref_state, updates, ref_updates, loss = step(params, state, ref_state, tokens)
    losses.append(float(loss))
    for layer in ("layer_0", "layer_1"):
      kv = updates["params"][layer]["attn"]["kv_einsum"]["w"]
      ref_kv = ref_updates["params"][layer]["attn"]["kv_einsum"]["w"]
      np.testing.assert_allclose(kv[1], ref_kv[1], rtol=1e-5, atol=1e-8)  # value slice
      assert float(jnp.max(jnp.abs(kv[0] - ref_kv[0]))) > 1e-4  # key slice: Riemannian
      mlp = updates["params"][layer]["mlp"]["linear"]
      np.testing.assert_allclose(
        mlp, ref_updates["params"][layer]["mlp"]["linear"], rtol=1e-5, atol=1e-8
      )
  assert np.all(np.isfinite(losses)), losses
  assert float(stiefax.diagnostics.isometry_error(params)) <= 1e-5
