"""Query/key layouts of widely used JAX model code, found by name and handled per head.

The fixtures reproduce the parameter names and shapes of each model family (no
third-party model library is imported; the ones that exist pull in PyTorch or
TensorFlow):

* Gemma (google-deepmind/gemma, ``gemma/modules.py``: ``Attention`` with ``Einsum``
  modules whose weight is ``w``): ``layer_<i>/attn/q_einsum/w`` ``(H, D, r)`` and
  ``kv_einsum/w`` ``(2, K, D, r)`` with grouped-query attention (``K < H``), or one
  fused ``qkv_einsum/w`` ``(3, H, D, r)`` when ``K == H``; ``attn_vec_einsum/w``
  ``(H, r, D)`` is the output projection.
* Llama in Flax (huggingface/transformers, ``modeling_flax_llama.py``):
  ``model/layers/<i>/self_attn/{q,k,v,o}_proj/kernel``, Dense kernels ``(D, H r)``,
  ``(D, K r)``, ``(D, K r)``, ``(H r, D)``.
* GPT-2 in Flax (huggingface/transformers, ``modeling_flax_gpt2.py``; nanoGPT ports
  alike): ``transformer/h/<i>/attn/c_attn/kernel`` ``(D, 3 H r)`` split into q, k, v
  thirds, each heads-major, and ``c_proj/kernel`` ``(H r, D)``.
"""

import contextlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from tests import reference as ref

D, H, K, R = 16, 4, 2, 4  # d_model, query heads, key/value heads, head_dim


def _normal(rng, shape, dtype):
  return jnp.asarray(0.3 * rng.standard_normal(shape), dtype)


def gemma(rng, dtype=np.float32):
  """Two Gemma layers: grouped-query (q_einsum + kv_einsum), then fused qkv_einsum."""
  n = lambda *s: _normal(rng, s, dtype)
  return {
    "params": {
      "embedder": {"input_embedding": n(32, D)},
      "layer_0": {
        "pre_attention_norm": {"scale": n(D)},
        "attn": {
          "q_einsum": {"w": n(H, D, R)},
          "kv_einsum": {"w": n(2, K, D, R)},
          "attn_vec_einsum": {"w": n(H, R, D)},
        },
        "mlp": {"gating_einsum": n(2, 2 * D, D), "linear": n(2 * D, D)},
      },
      "layer_1": {
        "attn": {"qkv_einsum": {"w": n(3, H, D, R)}, "attn_vec_einsum": {"w": n(H, R, D)}},
      },
    }
  }


def llama(rng, dtype=np.float32):
  """One Llama layer in the Flax port's names, grouped-query attention (K < H)."""
  n = lambda *s: _normal(rng, s, dtype)
  return {
    "params": {
      "model": {
        "embed_tokens": {"embedding": n(32, D)},
        "layers": {
          "0": {
            "input_layernorm": {"weight": n(D)},
            "self_attn": {
              "q_proj": {"kernel": n(D, H * R)},
              "k_proj": {"kernel": n(D, K * R)},
              "v_proj": {"kernel": n(D, K * R)},
              "o_proj": {"kernel": n(H * R, D)},
            },
            "mlp": {"gate_proj": {"kernel": n(D, 2 * D)}, "down_proj": {"kernel": n(2 * D, D)}},
          }
        },
      },
      "lm_head": {"kernel": n(D, 32)},
    }
  }


def gpt2(rng, dtype=np.float32):
  """One GPT-2 block in the Flax port's names: fused c_attn (D, 3 H r)."""
  n = lambda *s: _normal(rng, s, dtype)
  return {
    "params": {
      "transformer": {
        "wte": {"embedding": n(32, D)},
        "h": {
          "0": {
            "ln_1": {"scale": n(D), "bias": n(D)},
            "attn": {
              "c_attn": {"kernel": n(D, 3 * H * R), "bias": n(3 * H * R)},
              "c_proj": {"kernel": n(H * R, D), "bias": n(D)},
            },
            "mlp": {"c_fc": {"kernel": n(D, 4 * D)}},
          }
        },
      }
    }
  }


# Per model: the frames selected, and (leaf path, q/k frames, v slice) as plain numpy,
# written out independently of FrameSpec.
def gemma_parts(p):
  a0, a1 = p["params"]["layer_0"]["attn"], p["params"]["layer_1"]["attn"]
  q, kv, qkv = (
    np.asarray(a, np.float64)
    for a in (a0["q_einsum"]["w"], a0["kv_einsum"]["w"], a1["qkv_einsum"]["w"])
  )
  frames = np.concatenate([q, kv[0], qkv[0], qkv[1]])  # (heads, D, r)
  return frames, [kv[1], qkv[2]]


def llama_parts(p):
  a = p["params"]["model"]["layers"]["0"]["self_attn"]
  q = np.asarray(a["q_proj"]["kernel"], np.float64).reshape(D, H, R)
  k = np.asarray(a["k_proj"]["kernel"], np.float64).reshape(D, K, R)
  return np.concatenate([q, k], 1).transpose(1, 0, 2), []


def gpt2_parts(p):
  c = np.asarray(p["params"]["transformer"]["h"]["0"]["attn"]["c_attn"]["kernel"], np.float64)
  q, k, v = np.split(c, 3, axis=1)
  heads = lambda x: x.reshape(D, H, R).transpose(1, 0, 2)
  return np.concatenate([heads(q), heads(k)]), [v]


MODELS = {
  "gemma": (
    gemma,
    gemma_parts,
    None,
    ["layer_0/attn/kv_einsum/w", "layer_0/attn/q_einsum/w", "layer_1/attn/qkv_einsum/w"],
  ),
  "llama": (
    llama,
    llama_parts,
    dict(head_dim=R),
    ["model/layers/0/self_attn/k_proj/kernel", "model/layers/0/self_attn/q_proj/kernel"],
  ),
  "gpt2": (gpt2, gpt2_parts, dict(num_heads=H), ["transformer/h/0/attn/c_attn/kernel"]),
}


def _frames_arg(counts):
  return None if counts is None else stiefax.layouts.qk_frames(**counts)


def _selected(labels):
  flat = jax.tree_util.tree_flatten_with_path(labels)[0]
  return sorted("/".join(stiefax.layouts.path_names(p)[1:]) for p, l in flat if l == "stiefel")


def _iso(frames):
  gram = np.swapaxes(frames, -1, -2) @ frames
  return float(np.max(np.abs(gram - np.eye(frames.shape[-1]))))


@pytest.mark.parametrize("name", MODELS)
def test_labels_select_exactly_the_query_key_weights(rng, name):
  make, _, _, expected = MODELS[name]
  assert _selected(stiefax.layouts.qk_labels(make(rng))) == expected


@pytest.mark.parametrize("name", MODELS)
def test_project_params_orthonormalizes_every_head_and_keeps_v_bit_identical(rng, name):
  make, parts, counts, _ = MODELS[name]
  params = make(rng)
  snapped = stiefax.flax.project_params(params, frames=_frames_arg(counts))
  frames, vs = parts(snapped)
  frames0, vs0 = parts(params)
  assert frames.shape[0] == {"gemma": H + K + 2 * H, "llama": H + K, "gpt2": 2 * H}[name]
  assert _iso(frames0) > 0.1 and _iso(frames) < 1e-5
  u, _, vt = np.linalg.svd(frames0, full_matrices=False)  # the nearest frames
  np.testing.assert_allclose(frames, u @ vt, atol=1e-5)
  for v, v0 in zip(vs, vs0):
    np.testing.assert_array_equal(v, v0)
  # Every other parameter too.
  labels = stiefax.layouts.qk_labels(params)
  for lab, a, b in zip(jax.tree.leaves(labels), jax.tree.leaves(snapped), jax.tree.leaves(params)):
    if lab == "adamw":
      np.testing.assert_array_equal(a, b)
  iso = stiefax.diagnostics.isometry_error(snapped, stiefax.layouts.qk_labels, _frames_arg(counts))
  assert float(iso) < 1e-5


@pytest.mark.parametrize("name", MODELS)
def test_ten_steps_match_the_float64_references(x64, rng, name):
  """q/k heads follow the reference Riemannian Adam, v slices follow AdamW."""
  make, parts, counts, _ = MODELS[name]
  params = stiefax.flax.project_params(make(rng, np.float64), frames=_frames_arg(counts))
  grads = [
    jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape)), params) for _ in range(10)
  ]
  tx = stiefax.stiefel_adamw(1e-2, weight_decay=0.05, frames=_frames_arg(counts))
  state, p = tx.init(params), params
  update = jax.jit(tx.update)
  for g in grads:
    u, state = update(g, state, p)
    p = optax.apply_updates(p, u)

  frames, vs = parts(p)
  reference = ref.RiemannianAdam()
  w = parts(params)[0]
  for g in grads:
    w = reference.step(w, parts(g)[0])
  np.testing.assert_allclose(frames, w, atol=1e-8)
  assert _iso(frames) < 1e-12 and np.max(np.abs(frames - parts(params)[0])) > 0.05

  adamw = optax.adamw(1e-2, weight_decay=0.05)
  v_params = parts(params)[1]
  v_state = adamw.init(v_params)
  for g in grads:
    v_u, v_state = adamw.update(parts(g)[1], v_state, v_params)
    v_params = optax.apply_updates(v_params, v_u)
  for v, v_ref, v0 in zip(vs, v_params, parts(params)[1]):
    np.testing.assert_allclose(v, v_ref, atol=1e-12)
    assert np.max(np.abs(v - v0)) > 0.01  # the v slice trained


@pytest.mark.parametrize("name", MODELS)
def test_ten_float32_steps_keep_query_key_heads_orthonormal(rng, name):
  make, parts, counts, _ = MODELS[name]
  params = stiefax.flax.project_params(make(rng), frames=_frames_arg(counts))
  tx = stiefax.stiefel_adamw(1e-2, weight_decay=0.05, frames=_frames_arg(counts))
  state, p = tx.init(params), params
  update = jax.jit(tx.update)
  for i in range(10):
    g = jax.tree.map(
      lambda x, i=i: jax.random.normal(jax.random.fold_in(jax.random.key(0), i), x.shape), p
    )
    u, state = update(g, state, p)
    p = optax.apply_updates(p, u)
  frames, vs = parts(p)
  assert _iso(frames.astype(np.float32)) <= 1e-5
  for v, v0 in zip(vs, parts(params)[1]):
    assert np.max(np.abs(v - v0)) > 0.01


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_dense_layouts_need_the_head_count(rng, name):
  make, _, counts, expected = MODELS[name]
  params = make(rng)
  where = expected[0].replace("/", r"/")
  with pytest.raises(ValueError, match=rf"params/{where}.*head count cannot be read"):
    stiefax.stiefel_adamw(1e-3).init(params)
  with pytest.raises(ValueError, match="head count cannot be read"):
    stiefax.flax.project_params(params)
  with pytest.raises(ValueError, match=r"not a multiple of 5|cannot split"):
    stiefax.flax.project_params(params, frames=stiefax.layouts.qk_frames(head_dim=5))
  stiefax.stiefel_adamw(1e-3, frames=stiefax.layouts.qk_frames(**counts)).init(
    stiefax.flax.project_params(params, frames=stiefax.layouts.qk_frames(**counts))
  )


def test_llama_key_heads_are_not_guessed_from_query_heads(rng):
  params = llama(rng)
  with pytest.raises(ValueError, match=r"k_proj/kernel.*num_kv_heads"):
    stiefax.flax.project_params(params, frames=stiefax.layouts.qk_frames(num_heads=H))
  both = stiefax.layouts.qk_frames(num_heads=H, num_kv_heads=K)
  by_dim = stiefax.layouts.qk_frames(head_dim=R)
  a = stiefax.flax.project_params(params, frames=both)
  b = stiefax.flax.project_params(params, frames=by_dim)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_a_known_name_with_another_rank_raises(rng):
  stacked = {"layers": {"attn": {"q_einsum": {"w": jnp.ones((3, H, D, R))}}}}
  with pytest.raises(ValueError, match=r"layers/attn/q_einsum/w.*\(3, 4, 16, 4\)"):
    stiefax.flax.project_params(stacked)
  spec = stiefax.FrameSpec(row_axis=2)  # the caller states the layout
  out = stiefax.flax.project_params(stacked, frames=spec)
  assert float(stiefax.diagnostics.isometry_error(out, stiefax.layouts.qk_labels, spec)) < 1e-5


def test_gemma_default_recipe_needs_no_arguments(rng):
  params = stiefax.flax.project_params(gemma(rng))
  tx = stiefax.stiefel_adamw(1e-3, weight_decay=0.05)
  state = tx.init(params)
  rest = state.inner_states["stiefel"].inner_state.rest
  shapes = sorted(x.shape for x in jax.tree.leaves(rest[0].mu))
  assert shapes == sorted([(1, H, D, R), (1, K, D, R)])  # AdamW moments of the v slices only


def test_orthonormal_init_with_a_selection_draws_every_slice(rng):
  spec = stiefax.FrameSpec(row_axis=2, select=(0, (0, 1)))
  w = stiefax.flax.orthonormal_init(spec)(jax.random.key(0), (3, H, D, R))
  assert _iso(np.asarray(w, np.float64).reshape(3 * H, D, R)) < 1e-5


# ---------------------------------------------------------------------------
# Dense layouts: the warnings and errors point at qk_frames, and following them works.
# ---------------------------------------------------------------------------


def _one_line(message):
  assert "\n" not in message, message
  return message


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_an_explicit_framespec_on_a_dense_kernel_warns_in_one_line(rng, name):
  make, _, counts, expected = MODELS[name]
  params = stiefax.flax.project_params(make(rng), frames=stiefax.layouts.qk_frames(**counts))
  if name == "llama":  # c_attn with FrameSpec() has r = 3 H r > d: refused anyway
    with pytest.warns(UserWarning) as caught, pytest.raises(ValueError, match="not on the"):
      # Heads orthonormal one by one are not one orthonormal frame: init refuses them.
      stiefax.stiefel_adamw(1e-3, frames=stiefax.FrameSpec()).init(params)
    messages = [_one_line(str(w.message)) for w in caught]
    assert all(m.startswith("stiefax.stiefel_adamw: frames=stiefax.FrameSpec(") for m in messages)
    assert all("stiefax.layouts.qk_frames(head_dim=...)" in m for m in messages)
    assert sorted(m.split(" at ")[1].split(" ")[0] for m in messages) == [
      "params/" + p for p in expected
    ]
  project = r"^stiefax\.flax\.project_params: .*qk_frames\(head_dim"
  # c_attn has more columns than rows: refused, after the warning.
  with pytest.warns(UserWarning, match=project), contextlib.suppress(ValueError):
    stiefax.flax.project_params(params, frames=stiefax.FrameSpec())
  # The per-head reading draws no warning.
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    stiefax.stiefel_adamw(1e-3, frames=stiefax.layouts.qk_frames(**counts)).init(params)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
@pytest.mark.parametrize("rule", ["stiefel_adamw", "riemannian_adam", "manifold_muon"])
def test_the_off_manifold_error_names_the_call_and_its_hint_works(rng, name, rule):
  make, _, counts, _ = MODELS[name]
  params = make(rng)  # Gaussian kernels: off the manifold
  frames = stiefax.layouts.qk_frames(**counts)
  if rule == "stiefel_adamw":
    tx = stiefax.stiefel_adamw(1e-3, frames=frames)
  else:  # the whole tree would be frames: give the labels as stiefel_adamw does
    factory = getattr(stiefax, rule)
    tx = stiefax.stiefel_adamw(1e-3, frames=frames, stiefel=factory, stiefel_learning_rate=0.05)
  with pytest.raises(ValueError) as raised:
    tx.init(params)
  message = _one_line(str(raised.value))
  assert message.startswith("stiefax.stiefel_adamw: init was given the parameter at")
  assert "polar_retract" not in message and "frameSpec" not in message
  hint = f"stiefax.flax.project_params(params, frames=stiefax.layouts.qk_frames(head_dim={R}))"
  assert hint in message
  snapped = eval(hint, {"stiefax": stiefax, "params": params})  # following the hint
  tx.init(snapped)


def test_a_frame_rule_called_alone_is_named_and_its_hint_works(rng):
  w = jnp.asarray(rng.standard_normal((16, 4)), jnp.float32)
  for rule, tx in [
    ("riemannian_adam", stiefax.riemannian_adam(1e-3)),
    ("riemannian_sgd", stiefax.riemannian_sgd(1e-3)),
    ("manifold_muon", stiefax.manifold_muon(0.05)),
    ("polar_retract", stiefax.polar_retract()),
  ]:
    with pytest.raises(ValueError) as raised:
      tx.init(w)
    message = _one_line(str(raised.value))
    assert message.startswith(f"stiefax.{rule}: init was given the parameter at <root>")
    call = "stiefax.flax.project_params(params)"
    assert call in message
    tx.init(eval(call, {"stiefax": stiefax, "params": w}))
