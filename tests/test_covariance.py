"""Covariance under symmetries and the effective learning rate."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax import FrameSpec
from stiefax import covariance as cov
from stiefax import elr as elr_tools
from stiefax.experiments import cli
from tests import reference as ref

D, H, R = 6, 2, 3  # (d_model, heads, head_dim)
STEPS = 8


def kernel(rng, shape=(D, H, R)):
  """A float64 (d, heads, r) kernel whose frames [:, h, :] are orthonormal."""
  w = ref.random_frames(rng, (shape[1], shape[0], shape[2]))
  return jnp.asarray(np.transpose(w, (1, 0, 2)))


def orthogonal(rng, n):
  q, rr = np.linalg.qr(rng.standard_normal((n, n)))
  return jnp.asarray(q * np.sign(np.diag(rr)))


def brockett(rng):
  """f(W) = -sum_h tr(W_h^T A W_h N): neither O(d)- nor O(r)-invariant."""
  a = rng.standard_normal((D, D))
  a = jnp.asarray(a + a.T)
  n = jnp.asarray(np.arange(R, 0, -1) / R)
  return lambda w: -jnp.einsum("dhr,de,ehr,r->", w, a, w, n)


def action(name, rng):
  return {
    "left": lambda: cov.left_rotation(orthogonal(rng, D)),
    "right": lambda: cov.right_rotation(orthogonal(rng, R)),
    "rescale": lambda: cov.rescale(3.0),
    "loss": lambda: cov.gradient_scale(1e3),
  }[name]()


OPTIMIZERS = {
  "radam": lambda: stiefax.riemannian_adam(1.0, eps=0.0),
  "radam-elementwise": lambda: stiefax.riemannian_adam(0.03, eps=0.0, moment="elementwise"),
  "adamw": lambda: optax.adamw(1e-2, eps=0.0, weight_decay=0.1),
  "sgd": lambda: optax.sgd(1e-2),
  "hyperball": lambda: stiefax.sphere.sphere_adam(1.0, eps=0.0),
  "hyperball-absolute": lambda: stiefax.sphere.sphere_adam(1.0, eps=0.0, relative=False),
  # The published Hyperball, one sphere per head frame, over Adam's and Muon's directions.
  "adamh": lambda: stiefax.hyperball(optax.scale_by_adam(eps=0.0), 1e-2, frames=FrameSpec()),
  "muonh": lambda: stiefax.hyperball(
    optax.contrib.scale_by_muon(
      eps=0.0, weight_dimension_numbers=stiefax.layouts.muon_dimension_numbers(FrameSpec())
    ),
    1e-2,
    frames=FrameSpec(),
  ),
}

# (optimizer, action, covariant?): each covariant claim has a failing control.
CLAIMS = [
  ("radam", "left", True),
  ("radam-elementwise", "left", False),
  ("radam", "right", True),
  ("radam-elementwise", "right", False),
  ("radam", "loss", True),
  ("sgd", "loss", False),
  ("adamw", "rescale", False),
  ("hyperball", "rescale", True),
  ("hyperball-absolute", "rescale", False),
  ("adamh", "rescale", True),
  ("adamh", "loss", True),
  ("adamh", "left", False),
  ("muonh", "left", True),
  ("muonh", "right", True),
  ("muonh", "rescale", True),
]


@pytest.mark.parametrize("opt,act,covariant", CLAIMS, ids=[f"{o}-{a}" for o, a, _ in CLAIMS])
def test_covariance_claims_float64(x64, rng, opt, act, covariant):
  loss = brockett(rng)
  w0 = kernel(rng)
  v = float(cov.covariance_violation(OPTIMIZERS[opt](), loss, w0, action(act, rng), STEPS))
  if covariant:
    assert v < 1e-12, v  # float64 rounding
  else:
    assert v > 1e-3, v  # of the order of the parameters: nine orders above rounding


def test_covariance_violation_is_measured_along_the_trajectory(x64, rng):
  """The deviation grows with T for a non-covariant optimizer (not just step 1)."""
  loss, w0 = brockett(rng), kernel(rng)
  act = action("left", rng)
  tx = OPTIMIZERS["radam-elementwise"]
  short = float(cov.covariance_violation(tx(), loss, w0, act, 1))
  long = float(cov.covariance_violation(tx(), loss, w0, act, STEPS))
  assert long > 2 * short > 0


def test_actions_invert_and_respect_labels(x64, rng):
  params = {"query": {"kernel": kernel(rng)}, "value": {"kernel": kernel(rng)}}
  labels = stiefax.layouts.qk_labels(params)
  for act in (
    cov.left_rotation(orthogonal(rng, D), labels=labels),
    cov.right_rotation(orthogonal(rng, R), labels=labels),
    cov.rescale(2.5, labels=labels),
  ):
    moved = act(params)
    back = act.inverse(moved)
    assert float(jnp.max(jnp.abs(back["query"]["kernel"] - params["query"]["kernel"]))) < 1e-14
    assert float(jnp.max(jnp.abs(moved["query"]["kernel"] - params["query"]["kernel"]))) > 1e-2
    assert moved["value"]["kernel"] is params["value"]["kernel"]  # unlabelled: untouched
  # Per-head rotations broadcast over the frames' batch shape.
  qs = jnp.stack([orthogonal(rng, D) for _ in range(H)])
  w = params["query"]["kernel"]
  moved = cov.left_rotation(qs)(w)
  assert float(jnp.max(jnp.abs(moved[:, 1, :] - qs[1] @ w[:, 1, :]))) < 1e-14
  assert float(jnp.max(jnp.abs(moved[:, 1, :] - qs[0] @ w[:, 1, :]))) > 1e-2


def test_joint_right_rotation_is_a_symmetry_of_attention(x64, rng):
  """Proposition 1's gauge: the same R on W_Q and W_K leaves the logits unchanged."""
  x = jnp.asarray(rng.standard_normal((5, D)))
  params = {"query": {"kernel": kernel(rng)}, "key": {"kernel": kernel(rng)}}

  def logits(p):
    return jnp.einsum("td,dhr,se,ehr->hts", x, p["query"]["kernel"], x, p["key"]["kernel"])

  r = orthogonal(rng, R)
  joint = cov.right_rotation(r)
  q_only = cov.right_rotation(
    r, labels={"query": {"kernel": "stiefel"}, "key": {"kernel": "adamw"}}
  )
  assert float(jnp.max(jnp.abs(logits(joint(params)) - logits(params)))) < 1e-12
  assert float(jnp.max(jnp.abs(logits(q_only(params)) - logits(params)))) > 1e-2


def test_action_errors_name_the_shape(rng):
  w = jnp.asarray(kernel(rng), jnp.float32)
  with pytest.raises(ValueError, match=r"d=6 rows.*\(6, 6\) matrix"):
    cov.left_rotation(jnp.eye(4))(w)
  with pytest.raises(ValueError, match="does not broadcast"):
    cov.right_rotation(jnp.stack([jnp.eye(R)] * 3))(w)
  with pytest.raises(ValueError, match="positive factor"):
    cov.rescale(-1.0)
  with pytest.raises(ValueError, match="steps >= 1"):
    cov.covariance_violation(optax.sgd(0.1), jnp.sum, w, cov.rescale(2.0), steps=0)


# ----------------------------------------------------------------------------
# Effective learning rate.
# ----------------------------------------------------------------------------


def test_effective_learning_rate_by_hand(x64):
  old = {"a": jnp.array([3.0, 4.0]), "b": jnp.array(2.0)}
  new = {"a": jnp.array([4.0, 2.0]), "b": jnp.array(3.0)}
  elr = jax.jit(elr_tools.effective_learning_rate)(old, new)
  # a: Delta = (1, -2), <Delta, w> = -5, ||w||^2 = 25, Delta + 0.2 w = (1.6, -1.2).
  assert float(elr.radial["a"]) == pytest.approx(-0.2, abs=1e-15)
  assert float(elr.tangential["a"]) == pytest.approx(0.4, abs=1e-15)
  cos = (3 * 4 + 4 * 2) / (5 * math.sqrt(20))
  assert float(elr.angle["a"]) == pytest.approx(math.acos(cos), abs=1e-14)
  # The orthogonality assumption would give ||Delta|| / ||w|| = sqrt(5) / 5 instead.
  assert abs(float(elr.tangential["a"]) - math.sqrt(5) / 5) > 0.04
  # b: a purely radial update.
  assert float(elr.radial["b"]) == pytest.approx(0.5, abs=1e-15)
  assert float(elr.tangential["b"]) == 0.0 and float(elr.angle["b"]) == 0.0
  angle = elr_tools.angular_update(old, new)
  assert float(angle["a"]) == pytest.approx(float(elr.angle["a"]), abs=1e-15)


def test_effective_learning_rate_per_frame(x64):
  old = jnp.array([[[1.0], [0.0]], [[0.0], [2.0]]])  # (d=2, heads=2, r=1)
  new = jnp.array([[[1.0], [0.0]], [[1.0], [2.0]]])  # head 0: (1, 0) -> (1, 1); head 1 still
  elr = elr_tools.effective_learning_rate(old, new, FrameSpec(), per="frame")
  np.testing.assert_allclose(elr.tangential, [1.0, 0.0], atol=1e-15)
  np.testing.assert_allclose(elr.angle, [math.pi / 4, 0.0], atol=1e-15)
  whole = elr_tools.effective_learning_rate(old, new)  # one value for the whole leaf
  assert whole.tangential.shape == () and 0 < float(whole.tangential) < 1
  # frames= reads frames only per frame; per="leaf" with frames is refused, not ignored.
  with pytest.raises(
    ValueError, match=r"^stiefax.elr.effective_learning_rate: frames= .*per='frame'"
  ):
    elr_tools.effective_learning_rate(old, new, FrameSpec())
  with pytest.raises(ValueError, match=r"^stiefax.elr.angular_update: per must be"):
    elr_tools.angular_update(old, new, per="head")


@pytest.mark.parametrize("tau", [0.05, 0.1])
def test_capped_stiefel_step_has_elr_tau(x64, rng, tau):
  """A binding cap moves every frame by tau sqrt(r) / ||W||_F = tau, up to O(tau^2)."""
  w = kernel(rng, (12, 3, 4))
  g = jnp.asarray(rng.standard_normal(w.shape))
  tx = stiefax.riemannian_adam(1.0, max_norm=tau)  # lr 1: first step has norm 1 > tau sqrt(r)
  u, _ = jax.jit(tx.update)(g, tx.init(w), w)
  elr = elr_tools.effective_learning_rate(w, optax.apply_updates(w, u), per="frame")
  assert elr.tangential.shape == (3,)
  assert float(jnp.max(jnp.abs(elr.tangential - tau))) < tau**2
  assert float(jnp.max(jnp.abs(elr.radial))) < tau**2  # the retraction's radial part
  # Control: the uncapped step of the same gradient is far from tau.
  tx = stiefax.riemannian_adam(1.0, max_norm=None)
  u, _ = jax.jit(tx.update)(g, tx.init(w), w)
  loose = elr_tools.effective_learning_rate(w, optax.apply_updates(w, u), per="frame")
  assert float(jnp.min(jnp.abs(loose.tangential - tau))) > tau


def test_update_summary_groups():
  import flax.linen as nn

  model = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)
  x = jax.random.normal(jax.random.key(1), (1, 3, 8))
  params = stiefax.flax.project_params(model.init(jax.random.key(0), x), stiefax.layouts.qk_labels)
  tx = stiefax.stiefel_adamw(1e-2, weight_decay=0.05)
  grads = jax.grad(lambda p: jnp.sum(jnp.sin(model.apply(p, x))))(params)
  u, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  new = optax.apply_updates(params, u)
  stats = jax.jit(elr_tools.update_summary, static_argnums=2)(
    params, new, stiefax.layouts.qk_labels
  )
  groups = {k.split("/")[0] for k in stats}
  assert groups == {"frames", "matrices", "vectors"}
  assert all(v.shape == () for v in stats.values())
  per_frame = elr_tools.effective_learning_rate(
    params["params"]["query"]["kernel"], new["params"]["query"]["kernel"], per="frame"
  )
  per_frame_k = elr_tools.effective_learning_rate(
    params["params"]["key"]["kernel"], new["params"]["key"]["kernel"], per="frame"
  )
  expected = jnp.mean(jnp.concatenate([per_frame.tangential, per_frame_k.tangential]))
  assert float(stats["frames/elr"]) == pytest.approx(float(expected), rel=1e-6)
  # The frames' ELR is the cap (tau = 0.1); AdamW's matrices move by ~1e-2 instead.
  assert abs(float(stats["frames/elr"]) - 0.1) < 0.01
  assert float(stats["matrices/elr"]) < 0.05
  renamed = elr_tools.update_summary(params, new, groups=jax.tree.map(lambda _: "all", params))
  assert set(renamed) == {"all/elr", "all/elr_max", "all/radial", "all/angle"}


# ----------------------------------------------------------------------------
# The command.
# ----------------------------------------------------------------------------


def test_covariance_command_prints_the_table(capsys):
  argv = [
    "covariance",
    "--steps",
    "4",
    "--heads",
    "1",
    "--d",
    "4",
    "--r",
    "2",
    "--trials",
    "1",
    "--optimizers",
    "adam,radam,hyperball",
    "--problems",
    "brockett",
    "--actions",
    "left,rescale",
  ]
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  rows = {}
  for line in out.splitlines():
    for label in ("optax.adam(1e-2)", "riemannian_adam (B2)", "sphere_adam"):
      if line.strip().startswith(label):
        rows[label] = line.strip()[len(label) :].split()
  assert "left O(d)" in out and "rescale x3" in out
  adam, radam, hyper = (
    rows[k] for k in ("optax.adam(1e-2)", "riemannian_adam (B2)", "sphere_adam")
  )
  assert float(adam[0]) > 1e-3 and float(radam[0]) < 1e-12  # left O(d)
  assert radam[1] == "n/a" and float(hyper[1]) < 1e-12  # rescale
  assert float(adam[1]) > 1e-3


def test_covariance_command_rejects_unknown_names(capsys):
  assert cli.main(["covariance", "--optimizers", "lion"]) == 2
  err = capsys.readouterr().err
  assert "stiefax covariance: error: unknown optimizer 'lion'" in err
  assert "Traceback" not in err


def test_reference_elr_schedule_recursion_and_errors(x64):
  ref = elr_tools.reference_elr_schedule(1e-2, 0.1, 50, 0.05, update_rms=0.2)
  eta = 1e-2 * (1 - np.arange(50) / 50)
  rms2 = 0.05**2
  for t in range(50):  # the recursion of the docstring, step by step
    np.testing.assert_allclose(ref.weight_rms[t], np.sqrt(rms2), rtol=1e-12)
    np.testing.assert_allclose(ref.elr[t], eta[t] * 0.2 / np.sqrt(rms2), rtol=1e-12)
    rms2 = (1 - eta[t] * 0.1) ** 2 * rms2 + (eta[t] * 0.2) ** 2
  per_step = elr_tools.reference_elr_schedule(1e-2, 0.1, 50, 0.05, update_rms=np.full(50, 0.2))
  np.testing.assert_allclose(per_step.elr, ref.elr)
  for kwargs, match in (
    (dict(learning_rate=0.0), "learning_rate must be > 0"),
    (dict(weight_decay=-1.0), "weight_decay must be >= 0"),
    (dict(steps=0), "steps must be a positive int"),
  ):
    args = dict(learning_rate=1e-2, weight_decay=0.1, steps=10, init_rms=0.1) | kwargs
    with pytest.raises(ValueError, match=match):
      elr_tools.reference_elr_schedule(**args)


def test_reference_elr_schedule_has_the_shape_of_a_real_adamw_run():
  from benchmarks import elr_reference  # pylint: disable=g-import-not-at-top

  steps = 300
  elr, u_rms, _, init_rms = elr_reference.measure_adamw_elr(3e-2, 0.1, steps, 32)
  ref = elr_tools.reference_elr_schedule(3e-2, 0.1, steps, init_rms)
  # The premise: Adam's update RMS is about 0.2 once gradients are noisy (step 0 is ~1).
  assert 0.1 < float(np.median(u_rms[steps // 4 : 3 * steps // 4])) < 0.4
  assert u_rms[0] > 0.9
  # The shape: high start, decline, to zero with the rate (the level is not fitted).
  corr, _, _ = elr_reference.fit(elr, ref.elr)
  assert corr > 0.8, corr
  for curve in (elr, ref.elr):
    assert np.mean(curve[-5:]) < 0.1 * np.mean(curve[steps // 4 - 5 : steps // 4 + 5])
  # Control: a schedule of the opposite shape does not fit.
  assert elr_reference.fit(elr, ref.elr[::-1])[0] < 0
