"""Per-frame measures and sphere transforms on leaves whose frames are split or selected.

A Llama ``q_proj/kernel`` ``(d, H * r)`` is split into ``H`` frames of ``r`` columns,
a GPT-2 ``c_attn/kernel`` ``(d, 3 * H * r)`` into thirds whose q and k are frames;
a Gemma ``kv_einsum/w`` ``(2, K, d, r)`` has only its key slice as frames. Every
number is checked against frames sliced out by hand in numpy float64.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax import FrameSpec
from stiefax import layouts

D, H, R, K = 8, 3, 2, 2  # d_model, query heads, head_dim, kv heads

FRAMES = layouts.qk_frames(head_dim=R)


def llama_frames(x):
  """The ``H`` frames ``(d, r)`` of a ``(d, H * r)`` kernel, head-major columns."""
  return [x[:, h * R : (h + 1) * R] for h in range(H)]


def gpt2_frames(x):
  """The query and key frames ``(d, r)`` of a ``(d, 3 * H * r)`` GPT-2 ``c_attn``."""
  return [x[:, (t * H + h) * R : (t * H + h + 1) * R] for t in range(2) for h in range(H)]


def gemma_frames(x):
  """The key frames ``(d, r)`` of a ``(2, K, d, r)`` kv weight (batch ``(1, K)``)."""
  return [x[0, k] for k in range(K)]


CASES = {
  "llama_q_proj": ({"q_proj": {"kernel": (D, H * R)}}, ("q_proj", "kernel"), llama_frames, (H,)),
  "gpt2_c_attn": (
    {"c_attn": {"kernel": (D, 3 * H * R)}},
    ("c_attn", "kernel"),
    gpt2_frames,
    (2, H),
  ),
  "gemma_kv_einsum": ({"kv_einsum": {"w": (2, K, D, R)}}, ("kv_einsum", "w"), gemma_frames, (1, K)),
}


def make(rng, case):
  shapes, keys, slicer, batch = CASES[case]
  key, sub = keys
  shape = shapes[key][sub]
  old = {key: {sub: jnp.asarray(rng.standard_normal(shape))}}
  new = {key: {sub: old[key][sub] + 0.1 * jnp.asarray(rng.standard_normal(shape))}}
  return old, new, keys, slicer, batch


def reference_elr(w, w_new):
  w, delta = np.asarray(w, np.float64), np.asarray(w_new, np.float64) - np.asarray(w)
  ww = np.sum(w * w)
  radial = np.sum(delta * w) / ww
  tangential = np.linalg.norm(delta - radial * w) / np.sqrt(ww)
  return radial, tangential, np.arctan2(tangential, 1 + radial)


def leaf(tree, keys):
  return tree[keys[0]][keys[1]]


def test_frame_axes_are_axes_of_the_view():
  assert FrameSpec().frame_axes((16, 4, 8)) == (0, 2)
  assert FrameSpec(col_axes=(-2, -1)).frame_axes((16, 2, 4)) == (0, 1, 2)
  llama = FrameSpec(split=(1, (-1, R)))
  assert llama.frame_axes((D, H * R)) == (0, 2)
  assert llama.view(jnp.zeros((D, H * R))).shape == (D, H, R)
  gemma = FrameSpec(row_axis=2, select=(0, (0,)))
  assert gemma.frame_axes((2, K, D, R)) == (2, 3)
  assert FrameSpec(row_axis=1).frame_axes((4, 8, 16)) == (1, 2)  # wide frames allowed
  with pytest.raises(ValueError, match="select only along a batch axis"):
    FrameSpec(row_axis=2, select=(2, (0,))).frame_axes((2, K, D, R))
  with pytest.raises(ValueError, match="does not exist"):
    FrameSpec(row_axis=3).frame_axes((4, 8))


def test_from_view_inverts_view(rng):
  spec = FrameSpec(row_axis=2, split=(0, (2, -1)), select=(0, (1,)))
  x = jnp.asarray(rng.standard_normal((6, K, D, R)))
  back = spec.from_view(spec.view(x), x.shape, spec.rest(x))
  np.testing.assert_array_equal(back, x)
  zeroed = np.asarray(spec.from_view(spec.view(x), x.shape)).reshape(2, 3, K, D, R)
  assert not zeroed[0].any()
  np.testing.assert_array_equal(zeroed[1], np.asarray(x).reshape(2, 3, K, D, R)[1])


@pytest.mark.parametrize("case", sorted(CASES))
def test_effective_learning_rate_per_frame_matches_numpy(x64, rng, case):
  old, new, keys, slicer, batch = make(rng, case)
  elr = stiefax.elr.effective_learning_rate(old, new, FRAMES, per="frame")
  ref = np.array(
    [reference_elr(a, b) for a, b in zip(slicer(leaf(old, keys)), slicer(leaf(new, keys)))]
  )
  for i, field in enumerate(("radial", "tangential", "angle")):
    got = leaf(getattr(elr, field), keys)
    assert got.shape == batch and got.dtype == jnp.float64
    np.testing.assert_allclose(np.ravel(got), ref[:, i], rtol=1e-12, atol=1e-14)
  angle = leaf(stiefax.elr.angular_update(old, new, FRAMES, per="frame"), keys)
  np.testing.assert_allclose(np.ravel(angle), ref[:, 2], rtol=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_summary_frames_match_numpy(x64, rng, case):
  old, new, keys, slicer, _ = make(rng, case)
  labels = jax.tree.map(lambda _: stiefax.layouts.STIEFEL_LABEL, old)
  summary = stiefax.elr.update_summary(old, new, labels, FRAMES)
  ref = np.array(
    [reference_elr(a, b) for a, b in zip(slicer(leaf(old, keys)), slicer(leaf(new, keys)))]
  )
  np.testing.assert_allclose(summary["frames/radial"], ref[:, 0].mean(), rtol=1e-12)
  np.testing.assert_allclose(summary["frames/elr"], ref[:, 1].mean(), rtol=1e-12)
  np.testing.assert_allclose(summary["frames/elr_max"], ref[:, 1].max(), rtol=1e-12)
  np.testing.assert_allclose(summary["frames/angle"], ref[:, 2].mean(), rtol=1e-12)


def put_frames(shape, slicer, frames):
  """A zero array of ``shape`` with ``frames`` written where ``slicer`` reads them."""
  out = np.zeros(shape)
  idx = np.arange(out.size).reshape(shape)
  for src, positions in zip(frames, slicer(idx)):
    out.flat[np.ravel(positions)] = np.ravel(src)
  return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_sphere_project_and_retract_match_numpy(x64, rng, case):
  params, _, keys, slicer, _ = make(rng, case)
  g = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape)), params)
  w_frames = [np.asarray(f) for f in slicer(leaf(params, keys))]
  g_frames = [np.asarray(f) for f in slicer(leaf(g, keys))]
  shape = leaf(params, keys).shape

  tx = stiefax.sphere.sphere_project(frames=FRAMES)
  out, _ = tx.update(g, tx.init(params), params)
  ref = [gf - np.sum(gf * wf) / np.sum(wf * wf) * wf for wf, gf in zip(w_frames, g_frames)]
  np.testing.assert_allclose(leaf(out, keys), put_frames(shape, slicer, ref), atol=1e-13)

  for radius in (None, 2.0):
    tx = stiefax.sphere.sphere_retract(radius, frames=FRAMES)
    out, _ = tx.update(g, tx.init(params), params)
    ref = []
    for wf, gf in zip(w_frames, g_frames):
      rho = np.linalg.norm(wf) if radius is None else radius
      ref.append(rho * (wf + gf) / np.linalg.norm(wf + gf) - wf)
    np.testing.assert_allclose(leaf(out, keys), put_frames(shape, slicer, ref), atol=1e-13)


@pytest.mark.parametrize("case", sorted(CASES))
def test_sphere_adam_runs_on_split_and_selected_leaves(x64, rng, case):
  params, _, keys, slicer, batch = make(rng, case)
  state = stiefax.sphere.sphere_moment(frames=FRAMES).init(params)
  assert leaf(state.nu, keys).shape == batch
  tx = stiefax.sphere.sphere_adam(0.5, frames=FRAMES)
  state = tx.init(params)
  w = params
  for _ in range(3):
    g = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape)), w)
    updates, state = tx.update(g, state, w)
    w = optax.apply_updates(w, updates)
  before = [np.linalg.norm(f) for f in slicer(leaf(params, keys))]
  after = [np.linalg.norm(f) for f in slicer(leaf(w, keys))]
  np.testing.assert_allclose(after, before, rtol=1e-12)
  moved = np.abs(np.asarray(leaf(w, keys)) - np.asarray(leaf(params, keys)))
  assert put_frames(moved.shape, slicer, slicer(moved)).sum() == pytest.approx(moved.sum())
  assert moved.sum() > 0  # the frames moved; the rest did not
