"""The attention variants of the experiment arms: QK-norm, σReparam, and the probe."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from stiefax.experiments import arms
from stiefax.experiments import attention
from stiefax.experiments import optim
from stiefax.experiments.patches import model as patch_model
from stiefax.experiments.patches import training as patch_training
from stiefax.experiments.patches.config import Setting

D, H, R = 8, 2, 3


def _layer(kind, **kw):
  return attention.attention_module(
    kind, num_heads=H, qkv_features=H * R, out_features=D, deterministic=True, **kw
  )


def _x(n=5, key=1, dtype=jnp.float32):
  return jax.random.normal(jax.random.key(key), (2, n, D), dtype)


def test_spectral_norm_step_matches_numpy_in_float64():
  with jax.enable_x64(True):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(D, H * R))
    u = rng.normal(size=D)
    u /= np.linalg.norm(u)
    sigma, u_new = attention.spectral_norm_step(jnp.asarray(w), jnp.asarray(u))
    v = w.T @ u
    v /= np.linalg.norm(v)
    u_ref = w @ v
    u_ref /= np.linalg.norm(u_ref)
    np.testing.assert_allclose(np.asarray(u_new), u_ref, rtol=1e-12)
    np.testing.assert_allclose(float(sigma), u_ref @ w @ v, rtol=1e-12)
    # The gradient flows through W only: d sigma / d W = u' v^T.
    g = jax.grad(lambda m: attention.spectral_norm_step(m, jnp.asarray(u))[0])(jnp.asarray(w))
    np.testing.assert_allclose(np.asarray(g), np.outer(u_ref, v), rtol=1e-10, atol=1e-12)


def test_qknorm_is_one_layernorm_per_head_on_q_and_on_k():
  layer = _layer("qknorm")
  variables = layer.init(jax.random.key(0), _x())
  p = variables["params"]
  assert set(p) == {"query", "key", "value", "out", "query_ln", "key_ln"}
  assert p["query_ln"] == {"scale": p["query_ln"]["scale"]}  # no bias
  assert p["query_ln"]["scale"].shape == (R,) and p["key_ln"]["scale"].shape == (R,)
  # Each head's q, k are normalised over their r features: mean 0, variance 1.
  _, inter = layer.apply(
    variables, _x(), capture_intermediates=lambda m, _: m.name in ("query_ln", "key_ln")
  )
  for name in ("query_ln", "key_ln"):
    (q,) = inter["intermediates"][name]["__call__"]
    assert q.shape == (2, 5, H, R)
    np.testing.assert_allclose(np.asarray(q.mean(-1)), 0.0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(q.var(-1)), 1.0, atol=1e-3)


def test_sigma_reparam_parameters_state_and_effective_weight():
  layer = _layer("sigma")
  variables = layer.init(jax.random.key(0), _x())
  p, state = variables["params"], variables[attention.SIGMA_COLLECTION]
  assert set(p) == {"query", "key", "value", "out"}
  for name in ("query", "key"):
    assert set(p[name]) == {"kernel", "bias", "gamma"}
    assert p[name]["kernel"].shape == (D, H, R) and p[name]["gamma"].shape == ()
    assert state[name]["u"].shape == (D,)
    w = np.asarray(p[name]["kernel"], np.float64).reshape(D, -1)
    s_top = np.linalg.svd(w, compute_uv=False)[0]
    # gamma starts at sigma(W_0) (so W_hat = W at init), u at the top right vector.
    np.testing.assert_allclose(float(p[name]["gamma"]), s_top, rtol=1e-3)
    u_top = np.linalg.svd(w)[0][:, 0]
    assert abs(abs(float(np.asarray(state[name]["u"]) @ u_top)) - 1) < 1e-3
  # W_hat = gamma W / sigma(W): the query output is x W_hat + b for any W and gamma.
  p2 = jax.tree.map(lambda a: a, p)
  p2["query"] = {**p["query"], "gamma": jnp.float32(2.5), "kernel": 3.0 * p["query"]["kernel"]}
  v2 = {"params": p2, attention.SIGMA_COLLECTION: state}
  _, inter = layer.apply(v2, _x(), capture_intermediates=lambda m, _: m.name == "query")
  (q,) = inter["intermediates"]["query"]["__call__"]
  w = 3.0 * np.asarray(p["query"]["kernel"], np.float64).reshape(D, -1)
  u = np.asarray(state["query"]["u"], np.float64)
  v = w.T @ u / np.linalg.norm(w.T @ u)
  u1 = w @ v / np.linalg.norm(w @ v)
  w_hat = 2.5 * w / (u1 @ w @ v)
  ref = np.asarray(_x(), np.float64) @ w_hat
  np.testing.assert_allclose(np.asarray(q).reshape(2, 5, -1), ref, rtol=2e-5, atol=2e-5)


def test_sigma_state_advances_in_training_and_is_never_trained():
  layer = _layer("sigma")
  variables = layer.init(jax.random.key(0), _x())
  tx = attention.freeze_state(optax.adam(0.1))
  opt_state = tx.init(variables)

  def loss(v):
    out, state = attention.apply_train(layer, v, _x())
    return jnp.sum(out**2), state

  (_, state), grads = jax.value_and_grad(loss, has_aux=True)(variables)
  updates, _ = tx.update(grads, opt_state, variables)
  new = attention.with_state(optax.apply_updates(variables, updates), state)
  u_old = variables[attention.SIGMA_COLLECTION]["query"]["u"]
  w = variables["params"]["query"]["kernel"].reshape(D, -1)
  _, u_expected = attention.spectral_norm_step(w, u_old)
  np.testing.assert_allclose(new[attention.SIGMA_COLLECTION]["query"]["u"], u_expected, rtol=1e-6)
  zero = jax.tree.leaves(updates[attention.SIGMA_COLLECTION])
  assert all(np.all(np.asarray(z) == 0) for z in zero)
  assert not np.allclose(new["params"]["query"]["gamma"], variables["params"]["query"]["gamma"])
  # Evaluation reads u without storing it.
  out = layer.apply(new, _x())
  assert out.shape == (2, 5, D)


def test_plain_is_flax_attention_and_unknown_is_an_error():
  import flax.linen as nn

  assert isinstance(_layer("plain"), nn.MultiHeadDotProductAttention)
  assert not _layer("plain").normalize_qk
  with pytest.raises(ValueError, match="attention='rms'"):
    _layer("rms")
  with pytest.raises(ValueError, match="attention="):
    arms.Arm("x", "x", "adamw", attention="rms")


@pytest.mark.parametrize("kind", attention.ATTENTION)
def test_probe_matches_a_direct_computation(kind):
  layer = _layer(kind)
  variables = layer.init(jax.random.key(0), _x())
  for causal in (False, True):
    got = attention.probe(layer, variables, _x(), causal=causal)
    names = ("query_ln", "key_ln") if kind == "qknorm" else ("query", "key")
    _, inter = layer.apply(variables, _x(), capture_intermediates=lambda m, _, n=names: m.name in n)
    q, k = (np.asarray(inter["intermediates"][n]["__call__"][0], np.float64) for n in names)
    logits = np.einsum("bqhr,bkhr->bhqk", q, k) / np.sqrt(R)
    mask = np.tril(np.ones((5, 5), bool)) if causal else np.ones((5, 5), bool)
    ref_max = np.max(np.abs(np.where(mask, logits, 0.0)))
    z = np.where(mask, logits, -np.inf)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), -1).mean()
    np.testing.assert_allclose(float(got["max_logit"]), ref_max, rtol=1e-5)
    np.testing.assert_allclose(float(got["entropy"]), ent, rtol=1e-5)


def test_new_arms_share_the_seed_init_and_build_their_optimizers():
  setting = Setting(n_train=64, epochs=1, d=D, heads=H, head_dim=R)
  inits = {}
  for name in ("A2", "A2-qknorm", "A2-sigma", "B2-qknorm"):
    arm = arms.ARMS[name]
    model = patch_model.make_model(setting, 4, 10, arm.attention)
    inits[name] = patch_training.init_model(model, arm, 3, 4, D)
    tx = optim.make_optimizer(arm, optim.Hyper())
    params = inits[name]
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    if name == "A2-sigma":
      leaves = jax.tree.leaves(updates[attention.SIGMA_COLLECTION])
      assert leaves and all(np.all(np.asarray(u) == 0) for u in leaves)
  a2 = inits["A2"]["params"]
  for name in ("A2-qknorm", "A2-sigma"):
    p = inits[name]["params"]
    np.testing.assert_array_equal(p["pos_embedding"], a2["pos_embedding"])
    for mod in ("query", "key", "value", "out"):
      np.testing.assert_array_equal(p["attn_0"][mod]["kernel"], a2["attn_0"][mod]["kernel"])
  np.testing.assert_array_equal(
    inits["B2-qknorm"]["params"]["attn_0"]["value"]["kernel"], a2["attn_0"]["value"]["kernel"]
  )
