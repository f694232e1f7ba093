"""An arm is one registry entry: an entry added to the registry, and nothing else, is
offered, described, built, trained and reported by every command that lists arms."""

import argparse
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax.experiments import arm as arm_lib
from stiefax.experiments import arms
from stiefax.experiments import cli
from stiefax.experiments import flags
from stiefax.experiments import optim
from stiefax.experiments.grok import command as grok_command
from stiefax.experiments.grok import config as grok_config
from stiefax.experiments.grok import runs as grok_runs
from stiefax.experiments.lm import command as lm_command
from stiefax.experiments.lm import config as lm_config
from stiefax.experiments.lm import runs as lm_runs
from stiefax.experiments.lm import sweep_tables
from stiefax.experiments.patches import command as patches_command
from stiefax.experiments.patches import config as patches_config
from stiefax.experiments.patches import tables as patches_tables
from tests import harness

NAME = "B2-half"
ARM = arms.Arm(
  NAME,
  "Riemannian Adam, QR retraction, half the frame rate",
  "riemannian_adam",
  {"retraction": "qr"},
  frame_lr=0.5,
  grid=(0.25, 0.5),
  base="B2",
  commands=arm_lib.COMMANDS,
)


@pytest.fixture
def new_arm(monkeypatch):
  """The registry with one more entry (and only that)."""
  monkeypatch.setitem(arms._REGISTRY, NAME, ARM)
  return ARM


def test_every_command_offers_the_new_entry(new_arm):
  for offered in (grok_config.ARMS, lm_config.ARMS, patches_config.ARMS):
    assert list(offered)[-1] == NAME and offered[NAME] is new_arm
    assert arms.lookup(NAME.lower(), offered) is new_arm
    assert flags.parse_arms(f"A2,{NAME}", offered, ()) == ["A2", NAME]
  assert list(grok_config.ARMS)[:3] == ["A2", "B2", "B2m"]  # each command's order first
  every = patches_command.select_arms(argparse.Namespace(arms="all", protocol="run"))
  assert [a.name for a in every] == list(patches_config.PAPER_ARMS)  # named, not in "all"


def test_without_the_entry_no_command_offers_it():
  for offered in (grok_config.ARMS, lm_config.ARMS, patches_config.ARMS):
    assert NAME not in offered and arms.lookup(NAME, offered) is None


def test_an_entry_naming_an_unknown_command_is_a_one_line_error():
  with pytest.raises(ValueError, match=r"Arm 'X': commands=.*'gpt'; choose from grok, lm, patches"):
    arms.Arm("X", "?", "adamw", commands=("gpt",))


def test_every_help_lists_the_new_entry(new_arm):
  line = f"{NAME} {new_arm.description}"
  assert line in " ".join(grok_command.help_text().split())
  assert line in " ".join(lm_command.help_text().split())
  parser = argparse.ArgumentParser()
  patches_command.add_arguments(parser)
  assert f"{line}; frame_lr 0.5" in " ".join(parser.format_help().split())


def test_runs_record_the_entry(new_arm):
  grok = grok_runs.arm_definition(new_arm)
  assert grok["description"] == new_arm.description and grok["rule"] == "riemannian-qr"
  name = grok_runs.run_file_name(grok_config.QUICK, NAME, 0, "quick")
  assert name.startswith(f"{NAME}-quick-e{grok_config.QUICK.epochs}-")
  lm = lm_runs.arm_definition(new_arm)
  assert lm["options"] == {"retraction": "qr"} and not lm["frozen"]
  setting = patches_config.Setting(n_train=256, epochs=1)
  assert patches_config.arm_hparams(new_arm, setting, None)["frame_lr"] == 0.5


def test_the_reports_add_the_contrast_with_its_base(new_arm):
  assert (NAME, NAME, "B2", new_arm.description) in patches_tables.CONTRASTS
  assert (NAME, "B2") in sweep_tables.CONTRASTS
  assert len(patches_tables.CONTRASTS) == len(patches_tables.CONTRASTS._listed) + 1


def _params():
  init = stiefax.flax.orthonormal_init()
  k = jax.random.split(jax.random.key(0), 3)
  return {
    "attn": {
      "query": {"kernel": init(k[0], (8, 2, 4))},
      "key": {"kernel": init(k[1], (8, 2, 4))},
      "value": {"kernel": 0.3 * jax.random.normal(k[2], (8, 2, 4))},
    },
    "dense": {"kernel": jnp.eye(8), "bias": jnp.ones(8)},
  }


@pytest.mark.parametrize(
  "hyper",
  [
    lambda arm: grok_config.hyper(arm, harness.TINY_GROK),
    lambda arm: grok_config.hyper(arm, grok_config.QUICK),  # AdamW warm-up: a schedule
    lambda arm: patches_config.hyper(
      patches_config.Setting(n_train=256, epochs=2),
      patches_config.arm_hparams(arm, patches_config.Setting(n_train=256, epochs=2), None),
    ),
  ],
  ids=["grok", "grok-warmup", "patches"],
)
def test_each_command_builds_the_entrys_optimizer(new_arm, hyper):
  """The frames run at frame_lr times the AdamW schedule over its peak (stiefel_adamw's
  rule), stay on St(d, r), and a few steps train."""
  h = hyper(new_arm)
  tx = optim.make_optimizer(new_arm, h)
  params = _params()
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    grads = jax.tree.map(lambda x: 0.1 * jnp.ones_like(x) + 0.01 * x, params)
    u, state = tx.update(grads, state, params)
    return optax.apply_updates(params, u), state

  for _ in range(3):
    params, state = step(params, state)
  assert float(stiefax.diagnostics.isometry_error(params["attn"]["query"]["kernel"])) < 1e-5
  rate = optim.frame_rate(h)
  peak = h.peak_lr
  if callable(h.adamw_lr):
    for t in (0, 3, 50):
      np.testing.assert_allclose(float(rate(t)), h.frame_lr * float(h.adamw_lr(t)) / peak)
  else:
    assert rate == h.frame_lr


def test_lm_builds_the_entrys_optimizer(new_arm):
  config = lm_config.LMConfig(steps=10, warmup_steps=2)
  h = lm_config.hyper(new_arm, config)
  assert h.frame_lr == config.frame_lr and h.peak_lr == config.adamw_lr
  rate = optim.frame_rate(h)
  np.testing.assert_allclose(float(rate(2)), config.frame_lr, rtol=1e-6)  # at the peak


@pytest.mark.slow
def test_every_command_trains_and_reports_the_new_entry(new_arm, tmp_path, capsys, monkeypatch):
  monkeypatch.setitem(
    grok_config.PRESETS, "tiny", dict(config=harness.TINY_GROK, arms=("A2", "B2"), seeds=(0,))
  )
  grok_out = tmp_path / "grok"
  argv = ["grok", "--preset", "tiny", "--epochs", "20", "--arms", NAME, "--seeds", "0"]
  assert cli.main([*argv, "--out", str(grok_out)]) == 0
  (rec,) = [json.loads(f.read_text()) for f in grok_out.glob("*.json")]
  assert rec["arm"] == NAME and rec["config"]["riemannian_lr"] == 1.0
  assert rec["config"]["arm"]["rule"] == "riemannian-qr"
  assert cli.main(["report", str(grok_out)]) == 0
  assert NAME in capsys.readouterr().out

  lm_out = tmp_path / "lm"
  argv = ["lm", "--arms", NAME, "--steps", "4", "--eval-every", "2", "--no-progress"]
  assert cli.main([*argv, "--out", str(lm_out)]) == 0
  (rec,) = [json.loads(f.read_text()) for f in lm_out.glob("*.json")]
  assert rec["arm"] == NAME and rec["config"]["arm"]["options"] == {"retraction": "qr"}
  assert cli.main(["report", str(lm_out)]) == 0
  assert NAME in capsys.readouterr().out

  patches_out = tmp_path / "patches"
  argv = ["patches", "--arms", f"B2,{NAME}", "--seeds", "0,1", "--epochs", "1"]
  argv += ["--n-train", "256", "--warmup-epochs", "1", "--mlp-ratio", "1", "--no-progress"]
  argv += ["--out", str(patches_out), "--cache", str(tmp_path / "cache")]
  assert cli.main(argv) == 0
  recs = [json.loads(f.read_text()) for f in patches_out.glob("*.json")]
  assert {r["arm"] for r in recs} == {"B2", NAME}
  assert {r["config"]["riemannian_lr"] for r in recs if r["arm"] == NAME} == {0.5}
  assert cli.main(["report", str(patches_out)]) == 0
  assert f"{NAME} - B2" in capsys.readouterr().out  # the contrast with its base


def test_a_zero_frame_rate_is_the_constant_zero():
  """Frozen frames: the rate stiefel_adamw's rule gives is 0 at every step; built as the
  constant 0.0, so the optimizer state is the one earlier runs' checkpoints hold."""
  sched = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10, 0.0)
  h = optim.Hyper(adamw_lr=sched, frame_lr=0.0, peak_lr=1e-2)
  assert optim.frame_rate(h) == 0.0
  frozen = optim.make_optimizer(arms.ARMS["frozen"], h)
  b2 = optim.make_optimizer(arms.ARMS["B2"], dataclasses.replace(h, frame_lr=1.0))
  schedules = lambda tx: str(jax.tree.structure(tx.init(_params()))).count("ScaleBySchedule")
  assert (schedules(frozen), schedules(b2)) == (1, 2)  # AdamW's; AdamW's and the frames'
