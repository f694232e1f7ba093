"""An omitted ``frames=`` and ``labels=`` mean one thing in every public function.

Every public function that takes ``frames`` defaults to ``None``, which is
:func:`stiefax.layouts.qk_frames` (``FrameSpec()`` at the root path of a bare array),
and ``labels=None`` is :func:`stiefax.layouts.qk_labels` (docs/concepts.md). Every
public function that takes either is found by inspection and must appear in the tables
below, which call it with the argument omitted, ``None`` and its meaning, on a Gemma, a
Llama and a linen tree, and compare.
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

H, K, D, R = 2, 1, 8, 3


def _public_functions(arg: str) -> dict[str, inspect.Parameter]:
  modules = ["stiefax"] + [
    f"stiefax.{m}" for m in stiefax.__all__ if inspect.ismodule(getattr(stiefax, m))
  ]
  found = {}
  for name in modules:
    module = importlib.import_module(name)
    for attr in getattr(module, "__all__", ()):
      obj = getattr(module, attr)
      if inspect.isfunction(obj) and arg in inspect.signature(obj).parameters:
        found[obj.__name__] = inspect.signature(obj).parameters[arg]
  return found


def _grads(params, seed=1):
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return treedef.unflatten([0.1 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])


def _moved(params, seed=2):
  return jax.tree.map(lambda x, g: x + g, params, _grads(params, seed))


def _step(tx, params):
  return tx.update(_grads(params), tx.init(params), params)[0]


def _init(spec, shape, seed):
  return orthonormal_init(spec)(jax.random.key(seed), shape)


# The trees, and the FrameSpec that the layout names mean for their leaves (the Dense
# layout of Llama only with the head size, given as qk_frames(head_dim=R)).
GEMMA = {"q_einsum": {"w": jnp.swapaxes(_init(None, (D, H, R), 0), 0, 1)}}  # (H, d, r)
LINEN = {
  "params": {
    "query": {"kernel": _init(None, (D, H, R), 1)},  # (d, H, r)
    "key": {"kernel": _init(None, (D, H, R), 2)},
  }
}
SPLIT = stiefax.FrameSpec(split=(1, (-1, R)))
LLAMA = {
  "q_proj": {"kernel": _init(SPLIT, (D, H * R), 3)},  # (d, H r)
  "k_proj": {"kernel": _init(SPLIT, (D, K * R), 4)},  # (d, K r), grouped-query heads
}
TREES = {
  "gemma": (GEMMA, layouts.qk_frames(), stiefax.FrameSpec(row_axis=1)),
  "linen": (LINEN, layouts.qk_frames(), stiefax.FrameSpec()),
  "llama": (LLAMA, layouts.qk_frames(head_dim=R), SPLIT),
}


def _first(params):
  return jax.tree_util.tree_flatten_with_path(params)[0][0]


# name -> run(params, **frames): frames omitted, None, qk_frames() and its meaning.
FRAMES = {
  "stiefel_project": lambda t, **f: _step(stiefax.stiefel_project(**f), t),
  "grassmann_project": lambda t, **f: _step(stiefax.grassmann_project(**f), t),
  "canonical_gradient": lambda t, **f: _step(stiefax.canonical_gradient(**f), t),
  "scalar_moment": lambda t, **f: _step(stiefax.scalar_moment(**f), t),
  "elementwise_moment": lambda t, **f: _step(stiefax.elementwise_moment(**f), t),
  "step_norm_cap": lambda t, **f: _step(stiefax.step_norm_cap(0.01, **f), t),
  "polar_retract": lambda t, **f: _step(stiefax.polar_retract(**f), t),
  "retract": lambda t, **f: _step(stiefax.retract("qr", **f), t),
  "riemannian_adam": lambda t, **f: _step(stiefax.riemannian_adam(1.0, **f), t),
  "riemannian_sgd": lambda t, **f: _step(stiefax.riemannian_sgd(0.02, **f), t),
  "stiefel_adamw": lambda t, **f: _step(stiefax.stiefel_adamw(1e-3, **f), t),
  "manifold_muon": lambda t, **f: _step(
    stiefax.manifold_muon(0.05, iterations=2, ns_iterations=4, **f), t
  ),
  "sphere_project": lambda t, **f: _step(stiefax.sphere.sphere_project(**f), t),
  "sphere_retract": lambda t, **f: _step(stiefax.sphere.sphere_retract(**f), t),
  "sphere_moment": lambda t, **f: _step(stiefax.sphere.sphere_moment(**f), t),
  "sphere_adam": lambda t, **f: _step(stiefax.sphere.sphere_adam(1.0, **f), t),
  "project_params": lambda t, **f: project_params(_moved(t), **f),
  "orthogonality_penalty": lambda t, **f: orthogonality_penalty(_moved(t), **f),
  "isometry_error": lambda t, **f: diagnostics.isometry_error(_moved(t), **f),
  "step_statistics": lambda t, **f: diagnostics.step_statistics(t, _moved(t), _grads(t), **f),
  "left_rotation": lambda t, **f: covariance.left_rotation(jnp.eye(D)[::-1], **f)(t),
  "right_rotation": lambda t, **f: covariance.right_rotation(jnp.eye(R)[::-1], **f)(t),
  "effective_learning_rate": lambda t, **f: elr.effective_learning_rate(
    t, _moved(t), per="frame", **f
  ),
  "angular_update": lambda t, **f: elr.angular_update(t, _moved(t), per="frame", **f),
  "update_summary": lambda t, **f: elr.update_summary(t, _moved(t), **f),
  # These two take frames first and have no default: omitted is None here.
  "resolve_frames": lambda t, **f: layouts.resolve_frames(f.get("frames"), *_first(t)),
  "checked_frames": lambda t, **f: layouts.checked_frames(f.get("frames"), *_first(t)),
}

# Functions given arrays without a path see the root path: every frames gives FrameSpec().
KERNEL = LINEN["params"]["query"]["kernel"]  # (d, H, r)
ROOT = {
  "orthonormal_init": lambda **f: orthonormal_init(**f)(jax.random.key(3), (D, H, R)),
  "tangency_error": lambda **f: diagnostics.tangency_error(KERNEL, KERNEL, **f),
  "gauge_content": lambda **f: diagnostics.gauge_content(KERNEL, KERNEL, KERNEL, KERNEL, **f),
}

# Whole-parameter sphere measures refuse a FrameSpec that splits a leaf (Llama's heads).
SPLIT_REFUSED = {
  "sphere_project",
  "sphere_retract",
  "sphere_moment",
  "sphere_adam",
  "effective_learning_rate",
  "angular_update",
  "update_summary",
}


def _outcome(run, **frames):
  try:
    return run(**frames)
  except ValueError as e:
    return ValueError, str(e)


def _same(a, b):
  chex.assert_trees_all_equal_structs(a, b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    if isinstance(x, str | type | stiefax.FrameSpec | bool):
      assert x == y
    else:
      np.testing.assert_array_equal(x, y)


# The constant-norm wrappers hold whole matrices, not query/key frames: their
# ``frames=None`` is :func:`stiefax.layouts.matrix_frames` (docstrings of each).
MATRICES = {
  "hyperball": lambda t, **f: _step(stiefax.hyperball(optax.scale_by_adam(), 0.1, **f), t),
  "adamh": lambda t, **f: _step(stiefax.adamh(0.1, **f), t),
  "muonh": lambda t, **f: _step(stiefax.muonh(0.1, **f), t),
  "muon_dimension_numbers": lambda t, **f: layouts.muon_dimension_numbers(**f)(t),
}


def test_every_function_taking_frames_is_in_the_tables():
  assert set(_public_functions("frames")) == set(FRAMES) | set(ROOT) | set(MATRICES)


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_the_constant_norm_wrappers_frames_none_is_matrix_frames(name):
  params = {
    "attn": {"q_einsum": {"w": jnp.cos(jnp.arange(H * D * R, dtype=float)).reshape(H, D, R)}},
    "mlp": {"gating_einsum": {"w": jnp.sin(jnp.arange(2 * D * 4, dtype=float)).reshape(2, D, 4)}},
  }
  run = MATRICES[name]
  omitted = run(params)
  _same(omitted, run(params, frames=None))
  _same(omitted, run(params, frames=layouts.matrix_frames()))
  with pytest.raises(AssertionError):  # control: per-head frames are another grouping
    _same(omitted, run(params, frames=layouts.qk_frames()))


def test_every_frames_default_is_none():
  required = {"resolve_frames", "checked_frames"}  # the resolvers: frames is their input
  for name, param in _public_functions("frames").items():
    if name in required:
      assert param.default is inspect.Parameter.empty, name
    else:
      assert param.default is None, name


@pytest.mark.filterwarnings("ignore:stiefax.polar_retract")
@pytest.mark.parametrize("tree", sorted(TREES))
@pytest.mark.parametrize("name", sorted(FRAMES))
def test_an_omitted_frames_is_none_is_qk_frames(name, tree):
  params, named, spec = TREES[tree]
  run = FRAMES[name]
  omitted = _outcome(run, t=params)
  _same(omitted, _outcome(run, t=params, frames=None))
  _same(omitted, _outcome(run, t=params, frames=layouts.qk_frames()))
  # The frames read by name are the layout's own: the same numbers as its FrameSpec.
  by_name = _outcome(run, t=params, frames=named)
  _same(by_name, _outcome(run, t=params, frames=spec))
  if tree == "llama":
    # Without the head size, every entry point says what to give, in one line.
    assert omitted[0] is ValueError, name
    assert "\n" not in omitted[1] and "qk_frames(head_dim=...)" in omitted[1], omitted[1]
  if tree != "llama" or name not in SPLIT_REFUSED:
    assert not (isinstance(by_name, tuple) and by_name[:1] == (ValueError,)), by_name


@pytest.mark.parametrize("name", sorted(ROOT))
def test_functions_without_a_path_read_frame_spec(name):
  run = ROOT[name]
  for frames in (None, layouts.qk_frames(), stiefax.FrameSpec()):
    _same(run(), run(frames=frames))


def test_frames_none_differs_from_a_fixed_frame_spec():
  """Control: on a Gemma leaf ``(H, d, r)``, ``FrameSpec()`` is not what its name means."""
  with pytest.raises(ValueError, match="r <= d"):
    FRAMES["stiefel_project"](GEMMA, frames=stiefax.FrameSpec())


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


# The constant-norm optimizers label hidden matrices: their ``labels=None`` is
# :func:`stiefax.labels.matrix_labels`.
MATRIX_LABELS = {
  "adamh": lambda l: _step(stiefax.adamh(0.1, labels=l), P),
  "muonh": lambda l: _step(stiefax.muonh(0.1, labels=l), P),
}


def test_every_function_taking_labels_is_in_the_table():
  assert set(_public_functions("labels")) == set(LABELS) | set(MATRIX_LABELS)


@pytest.mark.parametrize("name", sorted(MATRIX_LABELS))
def test_the_constant_norm_labels_none_is_matrix_labels(name):
  run = MATRIX_LABELS[name]
  _same(run(None), run(stiefax.labels.matrix_labels))


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
    stiefax.sphere.sphere_adam,
  ):
    params = list(inspect.signature(alias).parameters.values())
    assert params[0].name == "learning_rate", alias.__name__
    assert params[0].default is inspect.Parameter.empty, alias.__name__
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:]), alias.__name__
  with pytest.raises(TypeError):
    stiefax.riemannian_adam()  # the rate is required, as in optax
  assert isinstance(stiefax.riemannian_adam(1.0), optax.GradientTransformation)
  np.testing.assert_equal(stiefax.POLAR_METHODS[0], "auto")
