"""``frames=None`` and ``labels=None`` mean one thing in every public function.

``frames=None`` is :func:`stiefax.layouts.qk_frames` (``FrameSpec()`` at the root
path of a bare array) and ``labels=None`` is :func:`stiefax.layouts.qk_labels`
(docs/concepts.md). Every public function that takes either is found by inspection
and must appear in the tables below, which call it both ways and compare.
"""

from __future__ import annotations

import importlib
import inspect

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax import covariance
from stiefax import diagnostics
from stiefax import elr
from stiefax import layouts
from stiefax.flax import orthogonality_penalty
from stiefax.flax import orthonormal_init
from stiefax.flax import project_params

H, D, R = 2, 8, 3


def _public_functions(arg: str) -> set[str]:
  modules = ["stiefax"] + [
    f"stiefax.{m}" for m in stiefax.__all__ if inspect.ismodule(getattr(stiefax, m))
  ]
  found = set()
  for name in modules:
    module = importlib.import_module(name)
    for attr in getattr(module, "__all__", ()):
      obj = getattr(module, attr)
      if inspect.isfunction(obj) and arg in inspect.signature(obj).parameters:
        found.add(obj.__name__)
  return found


def _einsum_params():
  """A Gemma ``q_einsum/w`` leaf ``(H, d, r)``: ``qk_frames`` views it with row axis 1."""
  w = orthonormal_init()(jax.random.key(0), (D, H, R))
  return {"q_einsum": {"w": jnp.swapaxes(w, 0, 1)}}


def _grads(params, seed=1):
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return treedef.unflatten([0.1 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])


def _step(tx, params):
  return tx.update(_grads(params), tx.init(params), params)[0]


W = _einsum_params()
W1 = jax.tree.map(lambda x, g: x + g, W, _grads(W, 2))
LEAF = W["q_einsum"]["w"]
KERNEL = jnp.swapaxes(LEAF, 0, 1)  # (d, H, r): FrameSpec() at the root path

# name -> run(frames); run(None) must equal run(qk_frames()).
FRAMES = {
  "stiefel_project": lambda f: _step(stiefax.stiefel_project(frames=f), W),
  "grassmann_project": lambda f: _step(stiefax.grassmann_project(frames=f), W),
  "canonical_gradient": lambda f: _step(stiefax.canonical_gradient(frames=f), W),
  "scalar_moment": lambda f: _step(stiefax.scalar_moment(frames=f), W),
  "elementwise_moment": lambda f: _step(stiefax.elementwise_moment(frames=f), W),
  "step_norm_cap": lambda f: _step(stiefax.step_norm_cap(0.01, frames=f), W),
  "polar_retract": lambda f: _step(stiefax.polar_retract(frames=f), W),
  "retract": lambda f: _step(stiefax.retract("qr", frames=f), W),
  "riemannian_adam": lambda f: _step(stiefax.riemannian_adam(1.0, frames=f), W),
  "riemannian_sgd": lambda f: _step(stiefax.riemannian_sgd(0.02, frames=f), W),
  "stiefel_adamw": lambda f: _step(stiefax.stiefel_adamw(1e-3, frames=f), W),
  "manifold_muon": lambda f: _step(
    stiefax.manifold_muon(0.05, iterations=2, ns_iterations=4, frames=f), W
  ),
  "sphere_project": lambda f: _step(stiefax.sphere_project(frames=f), W),
  "sphere_retract": lambda f: _step(stiefax.sphere_retract(frames=f), W),
  "sphere_moment": lambda f: _step(stiefax.sphere.sphere_moment(frames=f), W),
  "hyperball_adam": lambda f: _step(stiefax.hyperball_adam(1.0, frames=f), W),
  "project_params": lambda f: project_params(W1, frames=f),
  "orthogonality_penalty": lambda f: orthogonality_penalty(W1, frames=f),
  "isometry_error": lambda f: diagnostics.isometry_error(W1, frames=f),
  "step_statistics": lambda f: diagnostics.step_statistics(W, W1, _grads(W), frames=f),
  "left_rotation": lambda f: covariance.left_rotation(jnp.eye(D)[::-1], frames=f)(W),
  "right_rotation": lambda f: covariance.right_rotation(jnp.eye(R)[::-1], frames=f)(W),
  "effective_learning_rate": lambda f: elr.effective_learning_rate(W, W1, frames=f),
  "angular_update": lambda f: elr.angular_update(W, W1, frames=f),
  "update_summary": lambda f: elr.update_summary(W, W1, frames=f),
  "resolve_frames": lambda f: layouts.resolve_frames(f, _path(), LEAF),
  "checked_frames": lambda f: layouts.checked_frames(f, _path(), LEAF),
  # Functions without a path see the root path: qk_frames gives FrameSpec() there.
  "orthonormal_init": lambda f: orthonormal_init(_spec(f))(jax.random.key(3), (D, H, R)),
  "tangency_error": lambda f: diagnostics.tangency_error(KERNEL, KERNEL, frames=f),
  "gauge_content": lambda f: diagnostics.gauge_content(KERNEL, KERNEL, KERNEL, KERNEL, frames=f),
}


def _spec(frames):
  """An initializer takes a FrameSpec: a callable is read at the root path."""
  return frames if frames is None else layouts.resolve_frames(frames, (), None)


def _path():
  return jax.tree_util.tree_flatten_with_path(W)[0][0][0]


def _same(a, b):
  chex.assert_trees_all_equal_structs(a, b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    if isinstance(x, str | stiefax.FrameSpec | bool):
      assert x == y
    else:
      np.testing.assert_array_equal(x, y)


def test_every_function_taking_frames_is_in_the_table():
  assert _public_functions("frames") == set(FRAMES)


@pytest.mark.filterwarnings("ignore:stiefax.polar_retract")
@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frames_none_is_qk_frames(name):
  run = FRAMES[name]
  _same(run(None), run(layouts.qk_frames()))


def test_frames_none_differs_from_the_transforms_default():
  """Control: on a Gemma leaf ``(H, d, r)``, ``FrameSpec()`` is not ``qk_frames``."""
  with pytest.raises(ValueError, match="r <= d"):
    FRAMES["stiefel_project"](stiefax.FrameSpec())


P = {
  "query": {"kernel": orthonormal_init()(jax.random.key(4), (D, H, R))},
  "dense": {"kernel": 2.0 * jnp.ones((4, 4)), "bias": jnp.ones(4)},
}
P1 = jax.tree.map(lambda x, g: x + g, P, _grads(P, 5))

# name -> run(labels); run(None) must equal run(qk_labels).
LABELS = {
  "project_params": lambda l: project_params(P1, l),
  "orthogonality_penalty": lambda l: orthogonality_penalty(P1, l),
  "isometry_error": lambda l: diagnostics.isometry_error(P1, l),
  "step_statistics": lambda l: diagnostics.step_statistics(P, P1, _grads(P), l),
  "left_rotation": lambda l: covariance.left_rotation(jnp.eye(D)[::-1], labels=l)(P),
  "right_rotation": lambda l: covariance.right_rotation(jnp.eye(R)[::-1], labels=l)(P),
  "rescale": lambda l: covariance.rescale(2.0, labels=l)(P),
  "update_summary": lambda l: elr.update_summary(P, P1, l),
  "stiefel_adamw": lambda l: _step(stiefax.stiefel_adamw(1e-3, labels=l), P),
  "resolve_labels": lambda l: stiefax.labels.resolve_labels(P, l),
  "label_mask": lambda l: stiefax.labels.label_mask(P, l),
  "checked_labels": lambda l: stiefax.labels.checked_labels(l)(P),
}


def test_every_function_taking_labels_is_in_the_table():
  assert _public_functions("labels") == set(LABELS)


@pytest.mark.parametrize("name", sorted(LABELS))
def test_labels_none_is_qk_labels(name):
  run = LABELS[name]
  _same(run(None), run(layouts.qk_labels))


def test_arguments_after_the_learning_rate_are_keyword_only():
  with pytest.raises(TypeError):
    stiefax.stiefel_adamw(1e-3, 0.05)
  for alias in (
    stiefax.riemannian_adam,
    stiefax.riemannian_sgd,
    stiefax.stiefel_adamw,
    stiefax.manifold_muon,
    stiefax.hyperball_adam,
  ):
    params = list(inspect.signature(alias).parameters.values())
    assert params[0].name == "learning_rate", alias.__name__
    assert params[0].default is inspect.Parameter.empty, alias.__name__
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:]), alias.__name__
  with pytest.raises(TypeError):
    stiefax.riemannian_adam()  # the rate is required, as in optax
  assert isinstance(stiefax.riemannian_adam(1.0), optax.GradientTransformation)
  np.testing.assert_equal(stiefax.POLAR_METHODS[0], "auto")
