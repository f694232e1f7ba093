"""Label trees: one meaning of ``labels=None`` across the library."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax import covariance as cov
from stiefax import elr
from stiefax import labels as lb
from stiefax import layouts


def attention_params(rng):
  """Query/key kernels on the manifold, an off-manifold value kernel and a bias."""
  frames = stiefax.flax.orthonormal_init()
  return {
    "query": {"kernel": frames(jax.random.key(0), (8, 2, 3))},
    "key": {"kernel": frames(jax.random.key(1), (8, 2, 3))},
    "value": {"kernel": jnp.asarray(3.0 * rng.standard_normal((8, 2, 3)), jnp.float32)},
    "out": {"bias": jnp.ones(8)},
  }


def test_resolve_labels_none_is_qk_labels_and_a_single_array_is_a_frame(rng):
  params = attention_params(rng)
  assert lb.resolve_labels(params) == stiefax.layouts.qk_labels(params)
  assert lb.resolve_labels(params)["value"]["kernel"] == layouts.EUCLIDEAN_LABEL
  assert lb.resolve_labels(params["query"]["kernel"]) == layouts.STIEFEL_LABEL
  tree = jax.tree.map(lambda _: "adamw", params)
  assert lb.resolve_labels(params, tree) is tree
  assert lb.resolve_labels(params, lambda p: tree) is tree
  assert lb.label_mask(params) == [True, False, True, False]  # key, out, query, value
  with pytest.raises(ValueError, match="labels has 1 leaves but params has 4"):
    lb.label_mask(params, {"query": "stiefel"})


def test_every_labels_none_default_selects_the_query_key_frames(rng):
  params = attention_params(rng)
  # isometry_error: the off-manifold value kernel is not measured (it was before).
  assert float(stiefax.diagnostics.isometry_error(params)) < 1e-5
  # update_summary: the query/key kernels form the "frames" group (they were matrices).
  new = jax.tree.map(lambda x: 1.1 * x, params)
  summary = elr.update_summary(params, new)
  assert float(summary["frames/radial"]) == pytest.approx(0.1, rel=1e-5)
  assert "vectors/elr" in summary and "matrices/elr" in summary
  # the covariance actions act on the query/key kernels only (they acted on every leaf).
  q = jnp.asarray(np.linalg.qr(rng.standard_normal((8, 8)))[0], jnp.float32)
  moved = cov.left_rotation(q)(params)
  np.testing.assert_array_equal(moved["value"]["kernel"], params["value"]["kernel"])
  assert float(jnp.max(jnp.abs(moved["query"]["kernel"] - params["query"]["kernel"]))) > 0.1
  doubled = cov.rescale(2.0)(params)
  np.testing.assert_array_equal(doubled["out"]["bias"], params["out"]["bias"])
  np.testing.assert_allclose(doubled["key"]["kernel"], 2 * params["key"]["kernel"])
  # step_statistics: one entry per query/key kernel.
  stats = stiefax.diagnostics.step_statistics(params, new, params)
  assert sorted(stats) == ["key/kernel", "query/kernel"]
  # a single array keeps meaning "this array".
  w = params["query"]["kernel"]
  np.testing.assert_allclose(cov.rescale(2.0)(w), 2 * w)
  assert float(stiefax.diagnostics.isometry_error(w)) < 1e-5


def test_stiefel_adamw_and_project_params_take_a_single_array(rng):
  w = jnp.asarray(rng.standard_normal((8, 2, 3)), jnp.float32)
  snapped = stiefax.flax.project_params(w)
  assert float(stiefax.diagnostics.isometry_error(snapped)) < 1e-5
  tx = stiefax.stiefel_adamw(1e-3)
  u, _ = tx.update(jnp.ones_like(w), tx.init(snapped), snapped)
  assert float(stiefax.diagnostics.isometry_error(optax.apply_updates(snapped, u))) < 1e-5


def test_euclidean_label_value_is_kept():
  assert (layouts.STIEFEL_LABEL, layouts.EUCLIDEAN_LABEL) == ("stiefel", "adamw")
  assert stiefax.layouts.EUCLIDEAN_LABEL == layouts.EUCLIDEAN_LABEL


def test_the_0_1_frames_label_is_gone():
  assert not hasattr(cov, "FRAMES_LABEL")


def test_layouts_know_which_weights_are_partly_frames():
  partial = {(l.module, l.param) for l in layouts.LAYOUTS if l.partial}
  assert partial == {("kv_einsum", "w"), ("qkv_einsum", "w"), ("c_attn", "kernel")}
  assert layouts.layout_of(("query", "kernel")) is layouts.LAYOUTS[0]
  assert layouts.layout_of(("kernel",)) is None
