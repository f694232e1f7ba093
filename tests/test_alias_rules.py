"""What stiefel_adamw promises a new user: the rate reaches the frames by one rule, the
frames are given once, and no mistake is silent (under jit included)."""

import functools
import warnings

import chex
from flax import nnx
import jax
import jax.numpy as jnp
from jax.tree_util import keystr
import numpy as np
import optax
import pytest

import stiefax
from tests.kernels import D
from tests.kernels import H
from tests.kernels import R
from tests.kernels import kernel

OFF = "not on the Stiefel manifold: max"


def _model(rng, dtype=np.float32):
  return {
    "attn": {
      "query": {"kernel": kernel(rng, dtype=dtype)},
      "key": {"kernel": kernel(rng, dtype=dtype)},
    },
    "dense": {"kernel": jnp.asarray(rng.standard_normal((D, 5)), dtype)},
  }


def _grads(rng, params, scale=1.0):
  return jax.tree.map(lambda x: jnp.asarray(scale * rng.standard_normal(x.shape), x.dtype), params)


def _norm(x):
  return float(jnp.linalg.norm(x))


# ---------------------------------------------------------------------------
# One rule for the frames' rate.
# ---------------------------------------------------------------------------


def test_warmup_schedule_at_rate_zero_gives_zero_frame_update(rng):
  params = _model(rng)
  grads = _grads(rng, params)
  sched = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 100)
  tx = stiefax.stiefel_adamw(sched, weight_decay=0.05, peak_learning_rate=1e-3)
  state = tx.init(params)
  u, state = tx.update(grads, state, params)
  assert bool(jnp.all(u["attn"]["query"]["kernel"] == 0))
  assert bool(jnp.all(u["dense"]["kernel"] == 0))
  # Step 1 of the warm-up: both move, the frames at a tenth of their peak rate.
  u, _ = tx.update(grads, state, params)
  assert _norm(u["attn"]["query"]["kernel"]) > 0 and _norm(u["dense"]["kernel"]) > 0


def test_schedule_shape_reaches_the_frames_at_their_own_scale(x64, rng):
  """frame_rate(t) = stiefel_learning_rate * lr(t) / peak: as riemannian_adam(that)."""
  params = _model(rng, np.float64)
  grads = [_grads(rng, params) for _ in range(3)]
  sched = optax.linear_schedule(2e-3, 0.0, 4)
  tx = stiefax.stiefel_adamw(
    sched, weight_decay=0.0, stiefel_learning_rate=0.05, peak_learning_rate=2e-3
  )
  want = stiefax.riemannian_adam(optax.linear_schedule(0.05, 0.0, 4))
  q = params["attn"]["query"]["kernel"]
  state, wstate = tx.init(params), want.init(q)
  for g in grads:
    u, state = tx.update(g, state, params)
    uq, wstate = want.update(g["attn"]["query"]["kernel"], wstate, q)
    np.testing.assert_allclose(u["attn"]["query"]["kernel"], uq, atol=1e-12)


def test_a_schedule_or_an_array_without_its_peak_is_an_error():
  with pytest.raises(ValueError, match=r"is a schedule.*needs peak_learning_rate"):
    stiefax.stiefel_adamw(optax.constant_schedule(1e-3))
  with pytest.raises(ValueError, match=r"is an array.*inject_hyperparams"):
    optax.inject_hyperparams(stiefax.stiefel_adamw)(learning_rate=1e-3).init(
      {"query": {"kernel": jnp.zeros((4, 1, 2))}}
    )
  with pytest.raises(ValueError, match="ready transform with its own rate"):
    stiefax.stiefel_adamw(1e-3, stiefel=stiefax.riemannian_adam(1.0), stiefel_learning_rate=0.5)


def test_inject_hyperparams_changes_the_frames_rate(rng):
  params = _model(rng)
  grads = _grads(rng, params)
  tx = optax.inject_hyperparams(stiefax.stiefel_adamw)(
    learning_rate=1e-3, weight_decay=0.0, peak_learning_rate=1e-3
  )
  state = tx.init(params)
  update = jax.jit(tx.update)

  def frame_step(lr):
    s = state._replace(hyperparams={**state.hyperparams, "learning_rate": jnp.asarray(lr)})
    u, _ = update(grads, s, params)
    return _norm(u["attn"]["query"]["kernel"]), _norm(u["dense"]["kernel"])

  # Rate 0 stops the frames (and the rest).
  assert frame_step(0.0) == (0.0, 0.0)
  # The cap tau sqrt(r) = 0.2 binds at the full rate (a first step has norm ~eta_R
  # per frame) but not at 5% and 10% of it: there the step is proportional.
  full, half, tenth = frame_step(1e-3), frame_step(5e-5), frame_step(1e-4)
  assert half[0] < tenth[0] < full[0]
  assert tenth[0] / half[0] == pytest.approx(2.0, rel=1e-3)
  assert tenth[1] / half[1] == pytest.approx(2.0, rel=1e-3)


def test_a_factory_follows_the_rule(rng):
  params = _model(rng)
  grads = _grads(rng, params)
  sched = optax.warmup_constant_schedule(0.0, 1e-3, 5)
  tx = stiefax.stiefel_adamw(
    sched, stiefel=functools.partial(stiefax.riemannian_adam, eps=1e-3), peak_learning_rate=1e-3
  )
  u, _ = tx.update(grads, tx.init(params), params)
  assert bool(jnp.all(u["attn"]["query"]["kernel"] == 0))


def test_the_documented_manifold_muon_follows_the_schedule(x64, rng):
  """stiefel=stiefax.manifold_muon, stiefel_learning_rate=0.05: the frames run at
  0.05 * lr(t) / peak, so a warm-up from 0 moves no frame at step 0."""
  params = _model(rng, np.float64)
  grads = [_grads(rng, params) for _ in range(3)]
  sched = optax.linear_schedule(0.0, 1e-3, 2)
  tx = stiefax.stiefel_adamw(
    sched, stiefel=stiefax.manifold_muon, stiefel_learning_rate=0.05, peak_learning_rate=1e-3
  )
  want = stiefax.manifold_muon(optax.linear_schedule(0.0, 0.05, 2))
  q = params["attn"]["query"]["kernel"]
  state, wstate = tx.init(params), want.init(q)
  for t, g in enumerate(grads):
    u, state = tx.update(g, state, params)
    uq, wstate = want.update(g["attn"]["query"]["kernel"], wstate, q)
    assert (_norm(u["attn"]["query"]["kernel"]) == 0) == (t == 0)
    np.testing.assert_allclose(u["attn"]["query"]["kernel"], uq, atol=1e-12)


def test_a_ready_transform_next_to_a_schedule_warns_in_one_line():
  sched = optax.warmup_constant_schedule(0.0, 1e-3, 5)
  with pytest.warns(UserWarning, match="will not follow") as caught:
    stiefax.stiefel_adamw(sched, stiefel=stiefax.manifold_muon(0.05))
  (message,) = [str(w.message) for w in caught]
  assert (
    "\n" not in message and "stiefel=stiefax.manifold_muon, stiefel_learning_rate=0.05" in message
  )
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    stiefax.stiefel_adamw(1e-3, stiefel=stiefax.manifold_muon(0.05))  # a constant rate
    stiefax.stiefel_adamw(
      sched, stiefel=stiefax.manifold_muon, stiefel_learning_rate=0.05, peak_learning_rate=1e-3
    )


# ---------------------------------------------------------------------------
# Frames given once.
# ---------------------------------------------------------------------------


def _llama(rng, heads=2, r=4, d=12):
  init = stiefax.flax.orthonormal_init(stiefax.FrameSpec(split=(1, (heads, r))))
  keys = jax.random.split(jax.random.key(0), 3)
  return {
    "self_attn": {
      "q_proj": {"kernel": init(keys[0], (d, heads * r))},
      "k_proj": {"kernel": init(keys[1], (d, heads * r))},
      "v_proj": {"kernel": jax.random.normal(keys[2], (d, heads * r)) / 4},
    }
  }


def test_frames_given_once_train_a_llama_layout(rng):
  params = _llama(rng)
  x = jnp.asarray(rng.standard_normal((5, 12)), jnp.float32)

  def loss(p):
    a = p["self_attn"]
    q, k, v = (x @ a[n]["kernel"] for n in ("q_proj", "k_proj", "v_proj"))
    return jnp.sum(jax.nn.softmax(q @ k.T) @ v)

  frames = stiefax.layouts.qk_frames(head_dim=4)
  for tx in (
    stiefax.stiefel_adamw(1e-2, frames=frames),  # the default rule gets the frames
    stiefax.stiefel_adamw(1e-2, frames=frames, stiefel=stiefax.riemannian_sgd),  # a factory
    stiefax.stiefel_adamw(1e-2, stiefel=stiefax.riemannian_adam(1.0, frames=frames)),  # its own
  ):
    p, state = params, tx.init(params)
    step = jax.jit(lambda p, s, tx=tx: tx.update(jax.grad(loss)(p), s, p))
    for _ in range(5):
      u, state = step(p, state)
      p = optax.apply_updates(p, u)
    assert float(stiefax.diagnostics.isometry_error(p, frames=frames)) < 1e-5
  # Without frames anywhere, the error says what to give (the head size), not "off the
  # manifold".
  with pytest.raises(ValueError, match=r"head count cannot be.*head_dim"):
    stiefax.stiefel_adamw(1e-2, stiefel=stiefax.riemannian_adam(1.0)).init(params)


def test_a_ready_transform_keeps_its_own_frames(rng):
  """``frames=`` is not passed on to a ready transform: where it matters, init refuses."""
  params = _llama(rng)
  frames = stiefax.layouts.qk_frames(head_dim=4)
  ready = stiefax.riemannian_adam(1.0)  # frames=None: the q_proj head count is unknown
  tx = stiefax.stiefel_adamw(1e-2, frames=frames, stiefel=ready)
  with pytest.raises(ValueError, match=r"^stiefax.stiefel_adamw: frames= reads .*factory") as e:
    tx.init(params)
  assert "\n" not in str(e.value) and "self_attn/k_proj/kernel" in str(e.value)
  # Also when the ready transform was built with other frames than frames=.
  own = stiefax.riemannian_adam(1.0, frames=stiefax.FrameSpec())
  with pytest.raises(ValueError, match="keeps its own frames"):
    stiefax.stiefel_adamw(1e-2, frames=frames, stiefel=own).init(params)
  # Control: frames= that read every frame parameter as frames=None does are accepted.
  tree = {
    "attn": {"query": {"kernel": stiefax.flax.orthonormal_init()(jax.random.key(1), (8, 2, 4))}}
  }
  for same in (None, stiefax.layouts.qk_frames(), stiefax.FrameSpec()):
    tx = stiefax.stiefel_adamw(1e-2, frames=same, stiefel=ready)
    tx.update(jax.tree.map(jnp.ones_like, tree), tx.init(tree), tree)


# ---------------------------------------------------------------------------
# The on-manifold check under jit.
# ---------------------------------------------------------------------------


def test_jitted_init_refuses_params_off_the_manifold(rng):
  params = _model(rng)
  params["attn"]["key"]["kernel"] = params["attn"]["key"]["kernel"] * 1.2
  tx = stiefax.stiefel_adamw(1e-3)
  with pytest.raises(ValueError, match=OFF) as eager:
    tx.init(params)
  with pytest.raises(Exception, match=OFF) as jitted:
    jax.block_until_ready(jax.jit(tx.init)(params))
  # The same message, with the same path and error.
  assert str(eager.value) in str(jitted.value)
  # Control: on the manifold, the jitted init returns the eager state.
  params["attn"]["key"]["kernel"] = params["attn"]["key"]["kernel"] / 1.2
  state = jax.jit(tx.init)(params)
  assert jax.tree.structure(state) == jax.tree.structure(tx.init(params))


class _Attn(nnx.Module):
  def __init__(self, rngs, kernel_init):
    self.attn = nnx.MultiHeadAttention(
      num_heads=2, in_features=8, qkv_features=8, decode=False, rngs=rngs, kernel_init=kernel_init
    )

  def __call__(self, x):
    return self.attn(x)


def test_nnx_jit_optimizer_refuses_params_off_the_manifold():
  tx = stiefax.stiefel_adamw(1e-3)
  make = nnx.jit(lambda m: nnx.Optimizer(m, tx, wrt=nnx.Param))
  off = _Attn(nnx.Rngs(0), nnx.initializers.lecun_normal())
  with pytest.raises(Exception, match=OFF):
    jax.block_until_ready(make(off))
  on = _Attn(nnx.Rngs(0), stiefax.flax.orthonormal_init())
  assert isinstance(make(on), nnx.Optimizer)


# ---------------------------------------------------------------------------
# Never silent.
# ---------------------------------------------------------------------------


def test_project_params_without_frames_says_what_stiefel_adamw_says():
  tree = {"mlp": {"kernel": jnp.ones((4, 4))}}
  with pytest.raises(ValueError) as opt:
    stiefax.stiefel_adamw(1e-3).init(tree)
  with pytest.raises(ValueError) as proj:
    stiefax.flax.project_params(tree)
  assert str(proj.value) == str(opt.value).replace("stiefel_adamw:", "project_params:", 1)
  assert "no parameter is labelled 'stiefel'" in str(proj.value)


@pytest.mark.parametrize("jit", [False, True])
def test_a_gradient_of_the_wrong_shape_names_its_path(rng, jit):
  params = _model(rng)
  tx = stiefax.stiefel_adamw(1e-3)
  grads = _grads(rng, params)
  for where, bad in ((("attn", "query"), (H, D, R)), (("dense",), (5, D))):
    g = jax.tree.map(lambda x: x, grads)
    node = g
    for k in where:
      node = node[k]
    node["kernel"] = jnp.zeros(bad)
    update = jax.jit(tx.update) if jit else tx.update
    want = rf"\['{where[-1]}'\]\['kernel'\] has shape \({bad[0]}, .* but its parameter has shape"
    with pytest.raises(ValueError, match=want):
      update(g, tx.init(params), params)
  # The transforms say it too.
  w = params["attn"]["query"]["kernel"]
  with pytest.raises(ValueError, match=r"riemannian_adam: the update at <root> has shape"):
    stiefax.riemannian_adam(1.0).update(
      jnp.zeros((H, D, R)), stiefax.riemannian_adam(1.0).init(w), w
    )


def test_a_scheduled_stiefel_learning_rate_multiplies_the_rule(rng):
  params = _model(rng)
  grads = _grads(rng, params)
  frames_sched = optax.linear_schedule(0.0, 0.1, 10)  # the frames' own warm-up
  tx = stiefax.stiefel_adamw(1e-3, stiefel_learning_rate=frames_sched)
  u, _ = tx.update(grads, tx.init(params), params)
  assert bool(jnp.all(u["attn"]["query"]["kernel"] == 0))
  assert _norm(u["dense"]["kernel"]) > 0
  tx = stiefax.stiefel_adamw(0.0)  # a zero rate is a zero rate for the frames too
  u, _ = tx.update(grads, tx.init(params), params)
  assert all(float(jnp.max(jnp.abs(x))) == 0.0 for x in jax.tree.leaves(u))


# ---------------------------------------------------------------------------
# The AdamW part takes optax.adamw's mask= and nesterov=.
# ---------------------------------------------------------------------------


def _with_embedding():
  init = stiefax.flax.orthonormal_init()
  return {
    "embed": {"embedding": jnp.ones((6, 8))},
    "attn": {"query": {"kernel": init(jax.random.key(0), (8, 2, 4))}},
    "mlp": {"kernel": jnp.ones((8, 8)), "bias": jnp.ones(8)},
  }


def test_mask_chooses_the_decayed_parameters():
  params = _with_embedding()
  zeros = jax.tree.map(jnp.zeros_like, params)

  def moved(**kw):
    tx = stiefax.stiefel_adamw(0.1, weight_decay=0.5, **kw)
    u, _ = tx.update(zeros, tx.init(params), params)
    return {keystr(k): bool(jnp.any(v != 0)) for k, v in jax.tree_util.tree_leaves_with_path(u)}

  def no_embedding(p):
    return jax.tree_util.tree_map_with_path(
      lambda path, x: x.ndim >= 2 and "embed" not in keystr(path), p
    )

  emb, mlp, bias = "['embed']['embedding']", "['mlp']['kernel']", "['mlp']['bias']"
  default = moved()  # rank >= 2: the embedding is decayed, the bias is not
  assert default[emb] and default[mlp] and not default[bias]
  for mask in (no_embedding, no_embedding(params)):  # a callable or a tree, as in optax
    masked = moved(mask=mask)
    assert not masked[emb] and masked[mlp] and not masked[bias]
  assert moved(mask=None) == default  # None: the rank >= 2 rule
  everything = moved(mask=lambda p: jax.tree.map(lambda _: True, p))
  assert everything[emb] and everything[mlp] and everything[bias]
  # Frames are never decayed, whatever the mask.
  assert not moved(mask=lambda p: jax.tree.map(lambda _: True, p))["['attn']['query']['kernel']"]


def test_nesterov_is_optax_adamw_nesterov_on_the_other_parameters(rng):
  params = _with_embedding()
  rest = {"embed": params["embed"], "mlp": params["mlp"]}
  ours = stiefax.stiefel_adamw(1e-2, weight_decay=0.1, nesterov=True)
  theirs = optax.adamw(1e-2, weight_decay=0.1, mask=stiefax.layouts.decay_mask, nesterov=True)
  plain = optax.adamw(1e-2, weight_decay=0.1, mask=stiefax.layouts.decay_mask)
  s, t, q = ours.init(params), theirs.init(rest), plain.init(rest)
  for _ in range(3):
    g = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), params)
    g_rest = {"embed": g["embed"], "mlp": g["mlp"]}
    u, s = ours.update(g, s, params)
    v, t = theirs.update(g_rest, t, rest)
    w, q = plain.update(g_rest, q, rest)
    chex.assert_trees_all_close({"embed": u["embed"], "mlp": u["mlp"]}, v, rtol=1e-6, atol=0)
  # Control: Nesterov momentum changes the step.
  assert not np.allclose(v["mlp"]["kernel"], w["mlp"]["kernel"], rtol=1e-3)
  with pytest.raises(ValueError, match=r"^stiefax.stiefel_adamw: nesterov must be a bool"):
    stiefax.stiefel_adamw(1e-2, nesterov="yes")
