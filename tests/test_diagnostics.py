"""Diagnostics: gauge content, equivariance violation, step statistics, isometry error."""

import math

from flax import linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax import FrameSpec
from stiefax.diagnostics import equivariance_violation
from stiefax.diagnostics import gauge_content
from stiefax.diagnostics import step_statistics
from stiefax.experiments import cli
from tests import reference as ref

D, H, R = 12, 3, 4


def kernel(rng, shape=(D, H, R), dtype=np.float64):
  """A (d, heads, r) kernel whose frames [:, h, :] are orthonormal."""
  w = ref.random_frames(rng, (shape[1], shape[0], shape[2]))
  return jnp.asarray(np.transpose(w, (1, 0, 2)), dtype)


def heads(x):
  return np.transpose(np.asarray(x, np.float64), (1, 0, 2))


# ----------------------------------------------------------------------------
# gauge_content
# ----------------------------------------------------------------------------


def linen_attention_grads(seed=0):
  """Query/key kernels and their gradient in a linen attention layer (float64)."""
  model = nn.MultiHeadDotProductAttention(
    num_heads=H, qkv_features=H * R, use_bias=False, dtype=jnp.float64, param_dtype=jnp.float64
  )
  x = jax.random.normal(jax.random.key(seed), (2, 5, D), jnp.float64)
  params = stiefax.flax.project_params(model.init(jax.random.key(1), x), stiefax.layouts.qk_labels)
  c = jax.random.normal(jax.random.key(2), (2, 5, D), jnp.float64)
  grads = jax.jit(jax.grad(lambda p: jnp.sum(jnp.tanh(model.apply(p, x)) * c)))(params)
  p, g = params["params"], grads["params"]
  return p["query"]["kernel"], p["key"]["kernel"], g["query"]["kernel"], g["key"]["kernel"]


def test_gauge_content_true_gradient_vs_random_pair(x64, rng):
  wq, wk, gq, gk = linen_attention_grads()
  assert wq.shape == (D, H, R)
  gc = gauge_content(wq, wk, gq, gk)
  assert gc.joint.shape == gc.per_frame.shape == (H,)
  assert float(jnp.max(gc.joint)) < 1e-13  # Proposition 1: machine zero
  assert float(jnp.min(gc.per_frame)) > 1e-3  # the per-frame action is no symmetry
  # Control: a random tensor pair has joint gauge content of order one.
  pair = [jnp.asarray(rng.standard_normal(wq.shape)) for _ in range(2)]
  assert float(jnp.min(gauge_content(wq, wk, *pair).joint)) > 0.05


def test_gauge_content_equals_explicit_orthogonal_projections(x64, rng):
  wq, wk = kernel(rng), kernel(rng)
  gq, gk = (jnp.asarray(rng.standard_normal((D, H, R))) for _ in range(2))
  gc = gauge_content(wq, wk, gq, gk)
  n_skew = R * (R - 1) // 2
  for h in range(H):
    Wq, Wk, Gq, Gk = (heads(a)[h] for a in (wq, wk, gq, gk))
    tangent = np.sqrt(
      np.sum(ref.stiefel_project(Wq, Gq) ** 2) + np.sum(ref.stiefel_project(Wk, Gk) ** 2)
    )
    basis = []  # orbit directions (W_Q E, W_K E) for the skew basis E
    for i, j in zip(*np.triu_indices(R, 1)):
      e = np.zeros((R, R))
      e[i, j], e[j, i] = 1.0, -1.0
      basis.append(np.concatenate([(Wq @ e).ravel(), (Wk @ e).ravel()]))
    basis = np.stack(basis, 1)
    assert basis.shape[1] == n_skew
    g = np.concatenate([Gq.ravel(), Gk.ravel()])
    coef = np.linalg.lstsq(basis, g, rcond=None)[0]
    np.testing.assert_allclose(gc.joint[h], np.linalg.norm(basis @ coef) / tangent, rtol=1e-10)
    per_frame = np.sqrt(
      np.sum((Wq @ ref.sym(Wq.T @ Gq) - Wq @ (Wq.T @ Gq)) ** 2)
      + np.sum((Wk @ (Wk.T @ Gk - ref.sym(Wk.T @ Gk))) ** 2)
    )
    np.testing.assert_allclose(gc.per_frame[h], per_frame / tangent, rtol=1e-10)


def test_per_frame_fraction_of_a_random_tangent_is_about_a_quarter(rng):
  d, h, r = 128, 8, 16
  wq, wk = kernel(rng, (d, h, r), np.float32), kernel(rng, (d, h, r), np.float32)
  gq, gk = (jnp.asarray(rng.standard_normal((d, h, r)), jnp.float32) for _ in range(2))
  gc = gauge_content(wq, wk, gq, gk)
  expected = math.sqrt((r - 1) / (2 * (d - r) + (r - 1)))  # dimension count: 0.2505
  assert 0.22 < float(jnp.mean(gc.per_frame)) < 0.28
  assert abs(float(jnp.mean(gc.per_frame)) - expected) < 0.02
  assert 0.15 < float(jnp.mean(gc.joint)) < 0.21  # sqrt((r-1)/(4(d-r)+2(r-1))) = 0.177
  # Control: a horizontal (Grassmann-projected) gradient has no per-frame content.
  hq, hk = (
    stiefax.geometry.grassmann_horizontal(jnp.swapaxes(w, 0, 1), jnp.swapaxes(g, 0, 1))
    for w, g in ((wq, gq), (wk, gk))
  )
  flat = gauge_content(wq, wk, jnp.swapaxes(hq, 0, 1), jnp.swapaxes(hk, 0, 1))
  assert float(jnp.max(flat.per_frame)) < 1e-5


def test_gauge_content_jit_stacked_frames_and_errors(rng):
  w = jnp.stack([kernel(rng, dtype=np.float32) for _ in range(2)])  # (L, d, H, r)
  g = jnp.asarray(rng.standard_normal(w.shape), jnp.float32)
  spec = FrameSpec(row_axis=1)
  eager = gauge_content(w, w, g, g, frames=spec)
  jitted = jax.jit(lambda *a: gauge_content(*a, frames=spec))(w, w, g, g)
  assert eager.joint.shape == (2, H)
  np.testing.assert_allclose(jitted.joint, eager.joint, rtol=1e-5)
  np.testing.assert_allclose(jitted.per_frame, eager.per_frame, rtol=1e-5)
  zero = gauge_content(w, w, jnp.zeros_like(g), jnp.zeros_like(g), frames=spec)
  assert float(jnp.max(zero.joint)) == 0.0 == float(jnp.max(zero.per_frame))
  with pytest.raises(ValueError, match=r"\(2, 12, 3, 4\).*\(12, 3, 4\)"):
    gauge_content(w, w[0], g, g, frames=spec)


# ----------------------------------------------------------------------------
# equivariance_violation (Table 9)
# ----------------------------------------------------------------------------


def test_equivariance_violation_adam_elementwise_corrected(x64):
  key = jax.random.key(0)
  adam = float(equivariance_violation(optax.adamw(1e-2, weight_decay=0.0), key=key))
  naive = float(
    equivariance_violation(stiefax.riemannian_adam(0.03, moment="elementwise"), key=key)
  )
  corrected_tx = stiefax.riemannian_adam(1.0)
  corrected = float(equivariance_violation(corrected_tx, key=key))
  assert adam > 0.1  # of the order of W itself
  assert naive > 1e-6
  assert corrected < 1e-12
  # Usable under jit with the transform closed over.
  jitted = jax.jit(lambda k: equivariance_violation(corrected_tx, key=k, steps=4))(key)
  assert float(jitted) < 1e-12
  with pytest.raises(ValueError, match="r=8 > d=4"):
    equivariance_violation(corrected_tx, d=4, r=8)


def test_equivariance_command(capsys):
  rc = cli.main(["equivariance", "--steps", "8", "--rotations", "3"])
  out = capsys.readouterr().out
  assert rc == 0
  rows = {}
  for line in out.splitlines():
    parts = line.rsplit(None, 2)
    if len(parts) == 3 and parts[2] in ("yes", "no"):
      rows[parts[0].strip()] = float(parts[1])
  assert set(rows) == {
    "AdamW (decay 0)",
    "Riemannian Adam, elementwise v",
    "Riemannian Adam, scalar v (B2)",
    "Riemannian SGD (PA16)",
  }
  assert rows["AdamW (decay 0)"] > 0.1
  assert rows["Riemannian Adam, elementwise v"] > 1e-6
  assert rows["Riemannian Adam, scalar v (B2)"] < 1e-12
  assert rows["Riemannian SGD (PA16)"] < 1e-12
  assert cli.main(["equivariance", "--r", "30"]) == 2
  assert "exceeds --d 24" in capsys.readouterr().err


# ----------------------------------------------------------------------------
# step_statistics (section 4.7)
# ----------------------------------------------------------------------------


def check_stats(stats, old, new, grads):
  """``stats[path]`` against a float64 NumPy computation on the leaves."""
  flat = {
    "/".join(stiefax.layouts.path_names(p)): x
    for p, x in jax.tree_util.tree_flatten_with_path(old)[0]
  }
  flat_new = dict(zip(flat, jax.tree.leaves(new)))
  flat_g = dict(zip(flat, jax.tree.leaves(grads)))
  for name, s in stats.items():
    w, wn, g = heads(flat[name]), heads(flat_new[name]), heads(flat_g[name])
    grad = np.array([np.linalg.norm(ref.stiefel_project(w[h], g[h])) for h in range(len(w))])
    step = np.linalg.norm(wn - w, axis=(1, 2))
    np.testing.assert_allclose(s.grad_norm, grad, rtol=1e-4)
    np.testing.assert_allclose(s.step_norm, step, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(s.ratio, step / grad, rtol=1e-3)
    assert float(np.min(step)) > 0  # every frame moved


class LinenBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(2):
      x = x + nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)(x)
    return nn.Dense(3)(x.mean(axis=1))


def test_step_statistics_linen_under_jit():
  x = jax.random.normal(jax.random.key(0), (4, 5, 8))
  model = LinenBlock()
  params = stiefax.flax.project_params(model.init(jax.random.key(1), x), stiefax.layouts.qk_labels)
  loss = lambda p: jnp.sum(model.apply(p, x) ** 2)
  grads = jax.jit(jax.grad(loss))(params)
  tx = stiefax.stiefel_adamw(1e-2, weight_decay=0.05)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  new = optax.apply_updates(params, updates)
  stats = jax.jit(lambda o, n, g: step_statistics(o, n, g, stiefax.layouts.qk_labels))(
    params, new, grads
  )
  assert sorted(stats) == [
    f"params/MultiHeadDotProductAttention_{i}/{m}/kernel" for i in (0, 1) for m in ("key", "query")
  ]
  assert all(s.ratio.shape == (2,) for s in stats.values())
  check_stats(stats, params, new, grads)


class NnxBlock(nnx.Module):
  def __init__(self, rngs):
    self.attn = nnx.MultiHeadAttention(
      num_heads=2,
      in_features=8,
      decode=False,
      rngs=rngs,
      kernel_init=stiefax.flax.orthonormal_init(),
    )
    self.head = nnx.Linear(8, 3, rngs=rngs)

  def __call__(self, x):
    return self.head((x + self.attn(x)).mean(axis=1))


def test_step_statistics_nnx_under_jit():
  model = NnxBlock(nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(0), (4, 5, 8))
  optimizer = nnx.Optimizer(model, stiefax.stiefel_adamw(1e-2, weight_decay=0.05), wrt=nnx.Param)
  old = jax.tree.map(jnp.copy, nnx.as_pure(nnx.state(model, nnx.Param)))

  @nnx.jit
  def train_step(model, optimizer):
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)
    optimizer.update(model, grads)
    return grads

  grads = nnx.as_pure(train_step(model, optimizer))
  new = nnx.as_pure(nnx.state(model, nnx.Param))
  stats = jax.jit(lambda o, n, g: step_statistics(o, n, g, stiefax.layouts.qk_labels))(
    old, new, grads
  )
  assert sorted(stats) == ["attn/key/kernel", "attn/query/kernel"]
  check_stats(stats, old, new, grads)


def test_step_statistics_degree_one_vs_degree_zero(rng):
  w = kernel(rng, dtype=np.float32)
  g = jnp.asarray(rng.standard_normal(w.shape), jnp.float32)

  def ratio(tx, scale):
    new = optax.apply_updates(w, tx.update(scale * g, tx.init(w), w)[0])
    return step_statistics(w, new, scale * g, projector="grassmann")[""].ratio

  sgd = stiefax.riemannian_sgd(0.02)
  for scale in (1e-2, 1.0):  # degree one: the ratio is the learning rate
    np.testing.assert_allclose(ratio(sgd, scale), 0.02, rtol=2e-2)
  adam = stiefax.riemannian_adam(0.01, projector="grassmann")
  small, large = ratio(adam, 1e-2), ratio(adam, 1.0)  # degree zero: ratio ~ 1 / scale
  np.testing.assert_allclose(small / large, 100.0, rtol=1e-2)


def test_step_statistics_edge_cases_and_errors(rng):
  w = kernel(rng, dtype=np.float32)
  zero = jnp.zeros_like(w)
  s = step_statistics(w, w, zero)[""]
  assert float(jnp.max(s.ratio)) == 0.0
  moved = w.at[0, 0, 0].add(0.1)
  s = step_statistics(w, moved, zero)[""]
  assert bool(jnp.isinf(s.ratio[0])) and float(s.ratio[1]) == 0.0
  with pytest.raises(ValueError, match="leaves"):
    step_statistics({"a": w, "b": w}, {"a": w}, {"a": w, "b": w})
  with pytest.raises(ValueError, match=r"\(12, 3, 4\) \(old\), \(12, 3, 3\) \(new\)"):
    step_statistics({"a": w}, {"a": w[..., :3]}, {"a": w}, labels={"a": "stiefel"})
  with pytest.raises(ValueError, match="unknown projector 'euclid'"):
    step_statistics(w, w, w, projector="euclid")


# ----------------------------------------------------------------------------
# isometry_error and tangency_error
# ----------------------------------------------------------------------------


def test_isometry_error_with_labels(rng):
  params = {
    "attn": {
      "query": {"kernel": kernel(rng, dtype=np.float32)},
      "key": {"kernel": kernel(rng, dtype=np.float32)},
      "value": {"kernel": 3.0 * kernel(rng, dtype=np.float32)},
    }
  }
  labels = stiefax.layouts.qk_labels(params)
  assert float(stiefax.diagnostics.isometry_error(params, stiefax.layouts.qk_labels)) < 1e-5
  assert float(stiefax.diagnostics.isometry_error(params, labels)) < 1e-5
  # labels=None means the query/key frames (qk_labels), so the value kernel is left out.
  assert float(stiefax.diagnostics.isometry_error(params)) < 1e-5
  every = lambda p: jax.tree.map(lambda _: "stiefel", p)
  assert float(stiefax.diagnostics.isometry_error(params, every)) > 7.0  # value: |9 - 1|
  bumped = jax.tree.map(lambda x: x, params)
  bumped["attn"]["query"]["kernel"] = 1.01 * params["attn"]["query"]["kernel"]
  np.testing.assert_allclose(
    float(stiefax.diagnostics.isometry_error(bumped, labels)), 1.01**2 - 1, rtol=1e-3
  )
  none = jax.tree.map(lambda _: "adamw", labels)
  with pytest.raises(ValueError, match="no leaf of the params is labelled 'stiefel'"):
    stiefax.diagnostics.isometry_error(params, none)  # never 0.0 for nothing measured
  with pytest.raises(ValueError, match="labels has 2 leaves but params has 3"):
    stiefax.diagnostics.isometry_error(params, {"a": "stiefel", "b": "adamw"})


def test_tangency_error_detects_normal_components(rng):
  w = kernel(rng, dtype=np.float32)
  g = jnp.asarray(rng.standard_normal(w.shape), jnp.float32)
  xi, _ = stiefax.stiefel_project().update(g, optax.EmptyState(), w)
  assert float(stiefax.diagnostics.tangency_error(w, xi)) < 1e-5
  assert float(stiefax.diagnostics.tangency_error(w, g)) > 0.1
