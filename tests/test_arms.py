"""The arm registry and the optimizer factory shared by the experiment commands."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax.experiments import arms
from stiefax.experiments import optim
from stiefax.experiments.grok import config as grok_config
from stiefax.experiments.lm import config as lm_config
from stiefax.experiments.patches import config as patches_config
from tests import kernels


def test_one_arm_per_name_across_commands():
  for offered in (patches_config.ARMS, grok_config.ARMS, lm_config.ARMS):
    for name, arm in offered.items():
      assert arm is arms.ARMS[name]
  assert set(patches_config.ARMS) | set(grok_config.ARMS) | set(lm_config.ARMS) == set(arms.ARMS)
  assert list(patches_config.ARMS)[:3] == ["A2", "A2-orth", "B2"]  # each command's own order
  assert list(grok_config.ARMS)[:3] == ["A2", "B2", "B2m"]


def test_lookup_by_case_and_alias():
  assert arms.lookup("b2-sgd", patches_config.ARMS).name == "B2-SGD"
  assert arms.lookup("PA16", patches_config.ARMS).name == "B2-SGD"
  assert arms.lookup("soft_penalty", patches_config.ARMS).name == "soft"
  assert arms.lookup("pa16", grok_config.ARMS) is None  # not offered there
  assert arms.lookup("C9", arms.ARMS) is None


def test_a_bad_frame_rule_is_a_one_line_error():
  with pytest.raises(ValueError, match="Arm 'X': frames='newton'"):
    arms.Arm("X", "?", "newton")
  with pytest.raises(ValueError, match="trained by AdamW"):
    optim.frame_rule(arms.ARMS["A2"], optim.Hyper())


def test_decay_mask_is_rank_two_and_up():
  mask = optim.decay_mask(kernels.toy_params())["params"]
  assert mask["dense"]["kernel"] and mask["attn"]["query"]["kernel"]
  assert not mask["dense"]["bias"]


@pytest.mark.parametrize("name", list(arms.ARMS))
def test_every_arm_builds_a_working_optimizer(name):
  arm = arms.ARMS[name]
  h = optim.Hyper(
    adamw_lr=1e-2,
    frame_lr=0.05 if arm.frames == "muon" else 0.1,
    weight_decay=0.5,
    matrix_lr=0.02,
  )
  tx = optim.make_optimizer(arm, h)
  params = kernels.toy_params()
  # Zero gradient: only decoupled decay acts, -lr * wd * w, on the rank >= 2 non-frames.
  zero = jax.tree.map(jnp.zeros_like, params)
  u, _ = tx.update(zero, tx.init(params), params)
  w, u = params["params"], u["params"]
  if arm.matrices == "adamw":
    np.testing.assert_allclose(u["dense"]["kernel"], -1e-2 * 0.5 * w["dense"]["kernel"], rtol=1e-5)
  elif arm.matrices == "muon":  # Muon's own decoupled decay, at the matrix rate
    np.testing.assert_allclose(u["dense"]["kernel"], -0.02 * 0.5 * w["dense"]["kernel"], rtol=1e-5)
  else:  # the constant-norm rules have no decay: a zero gradient moves nothing
    np.testing.assert_allclose(u["dense"]["kernel"], 0.0, atol=1e-8)
  np.testing.assert_allclose(u["dense"]["bias"], 0.0, atol=1e-8)
  # A gradient moves the frames (but for the zero rule) and the Stiefel rules keep them on St.
  grads = jax.tree.map(lambda x: jnp.full_like(x, 0.1), params)
  u, _ = tx.update(grads, tx.init(params), params)
  new = optax.apply_updates(params, u)["params"]
  moved = float(jnp.abs(u["params"]["attn"]["query"]["kernel"]).max())
  assert (moved == 0.0) if arm.frames == "zero" else (moved > 1e-4)
  if arm.frames in ("riemannian_adam", "riemannian_sgd", "manifold_muon"):
    assert float(stiefax.diagnostics.isometry_error(new["attn"]["query"]["kernel"])) < 1e-5
  if arm.matrices in ("adamh", "muonh", "sphere_adam"):  # each matrix keeps its norm
    before, after = jnp.linalg.norm(w["dense"]["kernel"]), jnp.linalg.norm(new["dense"]["kernel"])
    assert abs(float(after / before) - 1) < 1e-5
