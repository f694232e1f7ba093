"""The published Hyperball (stiefax.hyperball, adamh, muonh): its equation in float64,
constant norms over 1 000 steps, and every Optax wrapper it must live under."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax import FrameSpec


def _params(rng, dtype=jnp.float32):
  return {
    "attn": {"q_einsum": {"w": jnp.asarray(rng.normal(size=(4, 16, 8)), dtype)}},
    "mlp": {"linear": {"w": jnp.asarray(rng.normal(size=(32, 16)) / 4, dtype)}},
  }


def _reference_adam_step(w, g, lr, radius, eps=1e-8):
  """One first step of hyperball(scale_by_adam()) for one matrix, in float64 NumPy.

  Adam's first direction is ``m_hat / (sqrt(v_hat) + eps) = g / (|g| + eps)``; then
  ``W <- R Normalize(W - lr R Normalize(u))``."""
  u = g / (np.abs(g) + eps)
  a = w - lr * radius * u / np.linalg.norm(u)
  return radius * a / np.linalg.norm(a)


def test_one_step_equals_the_papers_equation_in_float64(x64, rng):
  params = _params(rng, jnp.float64)
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape)), params)
  tx = stiefax.hyperball(optax.scale_by_adam(), 0.05)
  u, _ = tx.update(grads, tx.init(params), params)
  new = optax.apply_updates(params, u)
  for path in (("attn", "q_einsum", "w"), ("mlp", "linear", "w")):
    w = np.asarray(params[path[0]][path[1]][path[2]])
    g = np.asarray(grads[path[0]][path[1]][path[2]])
    want = _reference_adam_step(w, g, 0.05, np.linalg.norm(w))  # whole leaf: one matrix
    got = np.asarray(new[path[0]][path[1]][path[2]])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("cos", [-0.9, -0.3, 0.0, 0.5, 0.95])
@pytest.mark.parametrize("lr", [0.01, 0.2])
def test_a_hyperball_steps_elr_keeps_the_inner_product_term(x64, rng, cos, lr):
  """docs/covariance.md, "An AdamH step": with ``c = <W, u> / (||W|| ||u||)`` and
  ``s = sqrt(1 - 2 eta c + eta^2)``, one step has radial part ``(1 - eta c)/s - 1``,
  ELR ``eta sqrt(1 - c^2)/s`` and angle ``atan2(eta sqrt(1 - c^2), 1 - eta c)``,
  whatever ``||W||`` and ``||u||``."""
  w = rng.normal(size=(6, 4)) * 3.0
  e = rng.normal(size=w.shape)
  e -= np.sum(e * w) / np.sum(w * w) * w  # orthogonal to w
  u = 7.0 * (cos * w / np.linalg.norm(w) + np.sqrt(1 - cos**2) * e / np.linalg.norm(e))
  tx = stiefax.hyperball(optax.identity(), lr)  # the base's direction is the gradient
  step, _ = tx.update(jnp.asarray(u), tx.init(jnp.asarray(w)), jnp.asarray(w))
  got = stiefax.elr.effective_learning_rate(jnp.asarray(w), jnp.asarray(w) + step)
  s = np.sqrt(1 - 2 * lr * cos + lr**2)
  np.testing.assert_allclose(float(got.radial), (1 - lr * cos) / s - 1, rtol=1e-10, atol=1e-14)
  np.testing.assert_allclose(float(got.tangential), lr * np.sqrt(1 - cos**2) / s, rtol=1e-10)
  angle = np.arctan2(lr * np.sqrt(1 - cos**2), 1 - lr * cos)
  np.testing.assert_allclose(float(got.angle), angle, rtol=1e-10)


def test_per_head_frames_hold_each_head_at_its_norm(x64, rng):
  params = _params(rng, jnp.float64)
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape)), params)
  frames = stiefax.layouts.qk_frames()  # q_einsum (H, d, r): one frame per head
  tx = stiefax.hyperball(optax.scale_by_adam(), 0.1, frames=frames)
  state = tx.init(params)
  assert state.radius["attn"]["q_einsum"]["w"].shape == (4,)
  u, _ = tx.update(grads, state, params)
  new = optax.apply_updates(params, u)
  w, g = np.asarray(params["attn"]["q_einsum"]["w"]), np.asarray(grads["attn"]["q_einsum"]["w"])
  got = np.asarray(new["attn"]["q_einsum"]["w"])
  for h in range(4):
    want = _reference_adam_step(w[h], g[h], 0.1, np.linalg.norm(w[h]))
    np.testing.assert_allclose(got[h], want, rtol=1e-12, atol=1e-13)


def test_fused_gemma_weights_are_one_matrix_per_slice():
  frames = stiefax.layouts.matrix_frames()
  key = lambda *n: tuple(jax.tree_util.DictKey(x) for x in n)
  kv = frames(key("kv_einsum", "w"), jnp.zeros((2, 4, 64, 16)))
  assert kv.frame_axes((2, 4, 64, 16)) == (1, 2, 3)  # keys and values apart
  gate = frames(key("gating_einsum", "w"), jnp.zeros((2, 64, 256)))
  assert gate.frame_axes((2, 64, 256)) == (1, 2)
  q = frames(key("q_einsum", "w"), jnp.zeros((4, 64, 16)))
  assert q.axes(3)[0] == 1  # rows: the model width, so Muon sees d x (H r)
  out = frames(key("attn_vec_einsum", "w"), jnp.zeros((4, 16, 64)))
  assert out.axes(3)[0] == 2


@pytest.mark.parametrize("name", ["adam", "muon"])
def test_norms_stay_at_their_initial_value_for_1000_steps(rng, name):
  params = _params(rng)
  if name == "adam":
    tx = stiefax.hyperball(optax.scale_by_adam(), 0.05)
  else:
    tx = stiefax.muonh(0.05, rest_learning_rate=1e-3)
  norms = lambda p: [float(jnp.linalg.norm(x)) for x in jax.tree.leaves(p)]
  before = norms(params)
  keys = jax.random.split(jax.random.key(0), 1000)

  def step(carry, k):
    p, s = carry
    g = jax.tree.map(lambda x: jax.random.normal(k, x.shape) + x, p)
    u, s = tx.update(g, s, p)
    return (optax.apply_updates(p, u), s), None

  (after_p, _), _ = jax.jit(lambda p: jax.lax.scan(step, (p, tx.init(p)), keys))(params)
  after = norms(after_p)
  np.testing.assert_allclose(after, before, rtol=2e-6)  # float32 rounding, not drift
  moved = [
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(jax.tree.leaves(after_p), jax.tree.leaves(params))
  ]
  assert min(moved) > 0.1


def test_muonh_step_equals_its_equation_in_float64(x64, rng):
  params = {"mlp": {"w": jnp.asarray(rng.normal(size=(12, 6)))}, "scale": jnp.zeros(6)}
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape)), params)
  tx = stiefax.muonh(0.1, rest_learning_rate=1e-3, nesterov=False)
  u, _ = tx.update(grads, tx.init(params), params)
  w = np.asarray(params["mlp"]["w"])
  # Muon's direction (one step, no Nesterov): the Newton-Schulz iterate of g, close to
  # the polar factor; the equation is checked on the direction the base gives.
  dims = {"w": optax.contrib.MuonDimensionNumbers()}
  base = optax.contrib.scale_by_muon(nesterov=False, weight_dimension_numbers=dims)
  d, _ = base.update({"w": grads["mlp"]["w"]}, base.init({"w": params["mlp"]["w"]}))
  d = np.asarray(d["w"])
  r = np.linalg.norm(w)
  a = w - 0.1 * r * d / np.linalg.norm(d)
  np.testing.assert_allclose(np.asarray(u["mlp"]["w"]), r * a / np.linalg.norm(a) - w, atol=1e-12)
  s = np.linalg.svd(d, compute_uv=False)
  assert s.min() > 0.5 and s.max() < 1.5  # Muon's direction: near-orthogonal
  assert float(jnp.abs(u["scale"]).max()) > 0  # the vector trains with AdamW


def test_radius_puts_each_matrix_on_its_sphere(rng):
  params = _params(rng)
  tx = stiefax.hyperball(optax.scale_by_adam(), 0.01, radius=3.0)
  g = jax.tree.map(jnp.ones_like, params)
  new = optax.apply_updates(params, tx.update(g, tx.init(params), params)[0])
  for x in jax.tree.leaves(new):
    assert abs(float(jnp.linalg.norm(x)) - 3.0) < 1e-5


def test_a_warm_up_schedule_moves_nothing_at_step_0(rng):
  params = _params(rng)
  sched = optax.linear_schedule(0.0, 0.1, 10)
  tx = stiefax.adamh(sched, rest_learning_rate=sched)
  g = jax.tree.map(jnp.ones_like, params)
  state = tx.init(params)
  u, state = tx.update(g, state, params)
  assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(u))
  u, state = tx.update(g, state, params)
  assert all(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(u))


def test_a_non_finite_matrix_skips_alone_and_the_state_stays_finite(rng):
  params = _params(rng)
  tx = stiefax.hyperball(optax.scale_by_adam(), 0.1, frames=stiefax.layouts.qk_frames())
  g = jax.tree.map(jnp.ones_like, params)
  g["attn"]["q_einsum"]["w"] = g["attn"]["q_einsum"]["w"].at[1, 0, 0].set(jnp.nan)
  u, state = jax.jit(tx.update)(g, tx.init(params), params)
  q = u["attn"]["q_einsum"]["w"]
  assert float(jnp.abs(q[1]).max()) == 0  # the bad head keeps its point
  assert float(jnp.abs(q[0]).max()) > 0 and float(jnp.abs(u["mlp"]["linear"]["w"]).max()) > 0
  assert state.skipped["attn"]["q_einsum"]["w"].tolist() == [0, 1, 0, 0]
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(state))


def test_vectors_are_refused_with_one_line():
  with pytest.raises(ValueError, match=r"holds matrices: the parameter at b has shape \(4,\)") as e:
    stiefax.hyperball(optax.scale_by_adam(), 0.1).init({"b": jnp.zeros(4)})
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["hyperball", "adamh", "muonh"])
def test_a_zero_matrix_at_init_is_refused_with_one_line(rng, name):
  """A zero-initialised matrix would sit on a sphere of radius 0 for ever: the error
  names the function called and the parameter; with radius= it trains."""
  params = {"out": {"w": jnp.zeros((8, 4))}, "up": {"w": jnp.asarray(rng.normal(size=(8, 4)))}}
  make = {
    "hyperball": lambda **kw: stiefax.hyperball(optax.scale_by_adam(), 0.1, **kw),
    "adamh": lambda **kw: stiefax.adamh(0.1, **kw),
    "muonh": lambda **kw: stiefax.muonh(0.1, **kw),
  }[name]
  with pytest.raises(
    ValueError, match=rf"stiefax.{name}: the matrix at \['out'\]\['w'\] has norm 0"
  ) as e:
    make().init(params)
  assert "\n" not in str(e.value) and "radius=" in str(e.value)
  jax.jit(make().init)(params)  # traced, the norms are unknown: nothing to refuse
  tx = make(radius=2.0)
  g = jax.tree.map(jnp.ones_like, params)
  new = optax.apply_updates(params, tx.update(g, tx.init(params), params)[0])
  np.testing.assert_allclose(float(jnp.linalg.norm(new["out"]["w"])), 2.0, rtol=1e-5)


def test_adamh_with_no_matrix_says_so():
  with pytest.raises(ValueError, match="no parameter is labelled 'hyperball'"):
    stiefax.adamh(0.1).init({"embedder": {"input_embedding": jnp.zeros((8, 4))}})


def test_bad_arguments_name_themselves():
  with pytest.raises(ValueError, match="hyperball: learning_rate"):
    stiefax.hyperball(optax.scale_by_adam(), -1.0)
  with pytest.raises(TypeError, match=r"base must be an optax\.GradientTransformation"):
    stiefax.hyperball(0.1, 0.1)  # type: ignore[arg-type]
  with pytest.raises(ValueError, match="muonh: frames gave"):
    tx = stiefax.muonh(0.1, frames=FrameSpec(row_axis=2, select=(0, (0,))))
    p = {"kv_einsum": {"w": jnp.ones((2, 2, 8, 4))}}
    tx.update(p, tx.init(p), p)


def test_adamh_labels_hidden_matrices_and_leaves_embeddings_to_adamw(rng):
  params = {
    "embedder": {"input_embedding": jnp.asarray(rng.normal(size=(32, 8)), jnp.float32)},
    "mlp": {"w": jnp.asarray(rng.normal(size=(8, 8)), jnp.float32)},
    "norm": {"scale": jnp.zeros(8)},
  }
  tx = stiefax.adamh(0.1, rest_learning_rate=1e-2, weight_decay=0.0)
  g = jax.tree.map(jnp.ones_like, params)
  new = optax.apply_updates(params, tx.update(g, tx.init(params), params)[0])
  assert abs(float(jnp.linalg.norm(new["mlp"]["w"]) - jnp.linalg.norm(params["mlp"]["w"]))) < 1e-4
  step = new["embedder"]["input_embedding"] - params["embedder"]["input_embedding"]
  np.testing.assert_allclose(np.asarray(step), -1e-2, rtol=1e-4)  # AdamW's first step


def test_linen_attention_biases_and_gains_are_not_hidden_matrices():
  """linen's attention biases are (heads, head_dim) and a LayerNorm over two axes has a
  rank-2 scale: matrix_labels leaves them to AdamW, and labels each kernel a matrix."""
  import flax.linen as nn

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.LayerNorm(reduction_axes=(-2, -1), feature_axes=(-2, -1))(x)
      x = x + nn.MultiHeadDotProductAttention(num_heads=2)(x)
      return nn.Dense(4, name="lm_head")(nn.Dense(16)(x))

  params = Block().init(jax.random.key(0), jnp.zeros((1, 3, 8)))["params"]
  labels = stiefax.labels.matrix_labels(params)
  attn = labels["MultiHeadDotProductAttention_0"]
  assert params["MultiHeadDotProductAttention_0"]["query"]["bias"].shape == (2, 4)
  assert params["LayerNorm_0"]["scale"].shape == (3, 8)
  for part in ("query", "key", "value", "out"):
    assert attn[part]["kernel"] == stiefax.labels.HYPERBALL_LABEL, part
    assert attn[part]["bias"] == "adamw", part
  assert labels["LayerNorm_0"] == {"scale": "adamw", "bias": "adamw"}
  assert labels["Dense_0"] == {"kernel": stiefax.labels.HYPERBALL_LABEL, "bias": "adamw"}
  assert labels["lm_head"] == {"kernel": "adamw", "bias": "adamw"}


def test_works_under_optax_wrappers_jit_and_donation(rng):
  params = _params(rng)
  g = jax.tree.map(jnp.ones_like, params)
  base = lambda lr: stiefax.hyperball(optax.scale_by_adam(), lr)
  plain = base(0.1)
  want = optax.apply_updates(params, plain.update(g, plain.init(params), params)[0])

  injected = optax.inject_hyperparams(base)(lr=0.1)
  got = optax.apply_updates(params, injected.update(g, injected.init(params), params)[0])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)

  part = optax.partition({"h": base(0.1), "z": optax.set_to_zero()}, {"attn": "h", "mlp": "z"})
  u, _ = part.update(g, part.init(params), params)
  assert float(jnp.abs(u["mlp"]["linear"]["w"]).max()) == 0
  np.testing.assert_allclose(
    optax.apply_updates(params, u)["attn"]["q_einsum"]["w"],
    want["attn"]["q_einsum"]["w"],
    rtol=1e-5,
    atol=1e-6,
  )

  multi = optax.MultiSteps(base(0.1), every_k_schedule=2)
  s = multi.init(params)
  u1, s = multi.update(g, s, params)
  assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(u1))
  u2, s = multi.update(g, s, params)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
    optax.apply_updates(params, u2),
    want,
  )

  guarded = optax.apply_if_finite(base(0.1), max_consecutive_errors=3)
  bad = jax.tree.map(lambda x: x * jnp.nan, g)
  u, s = guarded.update(bad, guarded.init(params), params)
  assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(u))

  @jax.jit
  def train_step(p, s):
    u, s = plain.update(g, s, p)
    return optax.apply_updates(p, u), s

  donated = jax.jit(train_step.__wrapped__, donate_argnums=(0, 1))
  p2, _ = donated(jax.tree.map(jnp.copy, params), plain.init(params))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), p2, want)


def test_bfloat16_parameters_keep_their_dtype_and_norm(rng):
  params = _params(rng, jnp.bfloat16)
  tx = stiefax.adamh(0.05, rest_learning_rate=1e-3)
  state = tx.init(params)
  update = jax.jit(tx.update)
  for i in range(50):
    g = jax.tree.map(lambda p, i=i: jax.random.normal(jax.random.key(i), p.shape, p.dtype), params)
    u, state = update(g, state, params)
    params = optax.apply_updates(params, u)
  r0 = jax.tree.leaves(state.inner_states["hyperball"].inner_state.radius)
  for x, r in zip(jax.tree.leaves(params), r0):
    assert x.dtype == jnp.bfloat16
    assert abs(float(jnp.linalg.norm(x.astype(jnp.float32))) / float(r) - 1) < 1e-2  # bf16


def test_deprecated_name_says_so_and_is_the_sphere_adam():
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tx = stiefax.sphere.hyperball_adam(1.0)
  assert any("stiefax.sphere.sphere_adam" in str(w.message) for w in caught)
  w = jnp.ones((4, 2))
  a = tx.update(jnp.ones_like(w) * jnp.arange(2.0)[None, :], tx.init(w), w)[0]
  ref = stiefax.sphere.sphere_adam(1.0)
  b = ref.update(jnp.ones_like(w) * jnp.arange(2.0)[None, :], ref.init(w), w)[0]
  np.testing.assert_array_equal(a, b)


_SHARDED = textwrap.dedent(
  """
  import json, jax, jax.numpy as jnp, optax, stiefax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  mesh = Mesh(jax.devices(), ("heads",))
  w = {"q_einsum": {"w": jax.random.normal(jax.random.key(0), (8, 32, 16))}}
  g = {"q_einsum": {"w": jax.random.normal(jax.random.key(1), (8, 32, 16))}}
  tx = stiefax.hyperball(optax.scale_by_adam(), 0.1, frames=stiefax.layouts.qk_frames())
  def run(w, g):
    s = tx.init(w)
    for _ in range(3):
      u, s = jax.jit(tx.update)(g, s, w)
      w = optax.apply_updates(w, u)
    return w
  plain = run(w, g)
  shard = NamedSharding(mesh, P("heads", None, None))
  sharded = run(jax.device_put(w, shard), jax.device_put(g, shard))
  leaf = sharded["q_einsum"]["w"]
  print(json.dumps({"diff": float(jnp.max(jnp.abs(leaf - plain["q_einsum"]["w"]))),
                    "spec": str(leaf.sharding.spec)}))
  """
)


def test_head_sharded_frames_update_as_unsharded():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
  out = subprocess.run(
    [sys.executable, "-c", _SHARDED], env=env, capture_output=True, text=True, timeout=240
  )
  assert out.returncode == 0, out.stderr[-2000:]
  got = json.loads(out.stdout.strip().splitlines()[-1])
  assert got["diff"] < 1e-5
  assert "heads" in got["spec"]
