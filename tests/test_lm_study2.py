"""Study 2 of ``stiefax lm``: the new arms, the frame rate, the logging and the grid."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stiefax
from stiefax.experiments import arms
from stiefax.experiments import optim
from stiefax.experiments.flags import CommandError
from stiefax.experiments.lm import command
from stiefax.experiments.lm import config as lm_config
from stiefax.experiments.lm import data
from stiefax.experiments.lm import fair
from stiefax.experiments.lm import fair_tables
from stiefax.experiments.lm import grid
from stiefax.experiments.lm import runs as lm_runs
from stiefax.experiments.lm import training
from stiefax.experiments.lm.model import DecoderLM
from stiefax.experiments.lm.model import logit_bounds
from stiefax.experiments.store import write_json
from tests import columns
from tests import harness

TINY = dataclasses.replace(lm_config.PRESETS["quick"], steps=6, warmup_steps=0, eval_every=3)
TINY = dataclasses.replace(TINY, val_windows=8, test_windows=8, probe_windows=2, seq=32)
NEW = ("B2-temp", "B2-fold", "A2-temp", "B2-diag")


def _params(name, seed=0):
  return training.init_params(TINY, arms.ARMS[name], seed)["params"]


def _keyed(tree):
  return {jax.tree_util.keystr(k): x for k, x in jax.tree_util.tree_leaves_with_path(tree)}


def _extra_params(arm, c):
  want = set()
  for i in range(c.depth):
    if arm.temperature:
      want.add(f"['layer_{i}']['attn']['temperature']")
    if arm.frame_gain:
      want |= {f"['layer_{i}']['attn']['q_gain']", f"['layer_{i}']['attn']['k_gain']"}
  return want


def test_new_arms_add_only_their_parameters():
  c = TINY.model
  tokens = jnp.zeros((1, 8), jnp.int32)
  base = _keyed(jax.eval_shape(DecoderLM(c).init, jax.random.key(0), tokens)["params"])
  for name in NEW:
    arm = arms.ARMS[name]
    model = DecoderLM(c, arm.attention, arm.temperature, arm.qk_input, arm.frame_gain)
    shapes = _keyed(jax.eval_shape(model.init, jax.random.key(0), tokens)["params"])
    assert set(shapes) == set(base) | _extra_params(arm, c), name
    for key in _extra_params(arm, c):
      n = c.heads if "temperature" in key or "q_gain" in key else c.kv_heads
      assert shapes[key].shape == ((n,) if "temperature" in key else (n * c.head_dim,))


def test_new_parameters_start_neutral_and_the_rest_is_the_seeds():
  for name, base in (("B2-diag", "B2"),):  # A2-temp's zeros: the temperature test
    mine, theirs = _keyed(_params(name)), _keyed(_params(base))
    for key, x in mine.items():
      if key in theirs:
        np.testing.assert_array_equal(x, theirs[key], err_msg=f"{name} {key}")
      elif "temperature" in key:
        assert not x.any()
      else:
        assert (x == 1).all(), key


def test_temperatures_and_gains_are_adamw_parameters_without_decay():
  p = _params("B2-diag")
  labels = stiefax.layouts.qk_labels(p)
  mask = optim.decay_mask(p)
  for i in range(TINY.depth):
    attn_labels, attn_mask = labels[f"layer_{i}"]["attn"], mask[f"layer_{i}"]["attn"]
    assert attn_labels["q_gain"] != stiefax.layouts.STIEFEL_LABEL
    assert not attn_mask["q_gain"] and not attn_mask["k_gain"]
  assert not optim.decay_mask({"temperature": jnp.zeros(TINY.heads)})["temperature"]


def test_the_temperature_scales_every_logit_of_its_head():
  c = TINY.model
  model = DecoderLM(c, "plain", temperature=True)
  tokens = jnp.asarray(data.windows(data.load().val, 16, 2)[:, :-1])
  v = model.init(jax.random.key(0), tokens)
  assert not v["params"]["layer_0"]["attn"]["temperature"].any()  # init 0: exp(t) = 1
  v2 = jax.tree_util.tree_map_with_path(
    lambda k, x: x + jnp.log(2.0) if "temperature" in jax.tree_util.keystr(k) else x, v
  )
  _, a = model.apply(v, tokens, mutable=["intermediates"])
  _, b = model.apply(v2, tokens, mutable=["intermediates"])
  h1 = a["intermediates"]["layer_0"]["attn"]["head_max_logit"][0]
  h2 = b["intermediates"]["layer_0"]["attn"]["head_max_logit"][0]
  np.testing.assert_allclose(h2, 2 * h1, rtol=1e-5)  # layer 0's input is unchanged


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fold_bound_holds_and_the_gain_in_front_breaks_it(dtype):
  """Every logit of a fold model is within its certified bound on random inputs, with
  large gains and temperatures; the same frames read through the gain are not."""
  c = TINY.model
  tokens = jax.random.randint(jax.random.key(3), (4, c.seq), 0, 256)
  for qk_input, must_hold in (("fold", True), ("gained", False)):
    model = DecoderLM(c, "plain", temperature=True, qk_input=qk_input)
    v = model.init(jax.random.key(1), tokens)
    v = stiefax.flax.project_params(v, frames=stiefax.layouts.qk_frames())
    # Align each query head with its key head so logits approach the bound, then add
    # a large gain (which fold must ignore) and temperatures of either sign.
    params = jax.tree.map(lambda x: x, v["params"])
    for i in range(c.depth):
      attn = params[f"layer_{i}"]["attn"]
      keys = attn["kv_einsum"]["w"][0]
      attn["q_einsum"]["w"] = jnp.repeat(keys, c.heads // c.kv_heads, axis=0)
      attn["temperature"] = jnp.linspace(-1.0, 1.5, c.heads)
      params[f"layer_{i}"]["pre_attention_norm"]["scale"] = jnp.full((c.d_model,), 2.0)
    cast = jax.tree.map(lambda x: x.astype(dtype), params)
    _, inter = model.apply({"params": cast}, tokens, mutable=["intermediates"])
    seen = np.stack(
      [
        np.asarray(inter["intermediates"][f"layer_{i}"]["attn"]["head_max_logit"][0], np.float64)
        for i in range(c.depth)
      ]
    )
    fold_bound = logit_bounds(params, c, "fold")
    slack = 1.0 + (2e-2 if dtype == jnp.bfloat16 else 1e-5)  # the logits' own rounding
    if must_hold:
      assert (seen <= fold_bound * slack).all()
      assert seen.max() > 0.3 * fold_bound.max()  # the check is not vacuous
    else:
      assert (seen > fold_bound * slack).any()
      assert (seen <= logit_bounds(params, c, "gained") * slack).all()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fold_bound_holds_after_training(dtype):
  """B2-fold trained for a few steps at a high rate (the temperatures and the gains
  move): every logit of a validation batch, evaluated in ``dtype``, is within the
  bound of the trained parameters."""
  config = dataclasses.replace(TINY, adamw_lr=0.1, frame_lr=1.0)
  arm = arms.ARMS["B2-fold"]
  progs = training.programs(config, arm)
  variables = training.init_params(config, arm, 0)
  state = progs.opt_init(variables)
  train = jnp.asarray(data.load().train[:50_000])
  positions = jnp.asarray(data.train_positions(50_000, config.seq, 8, config.batch, 0))
  variables, state, _ = progs.chunk(variables, state, train, positions)
  params = variables["params"]
  assert np.abs(np.asarray(params["layer_0"]["attn"]["temperature"])).max() > 0.1
  c = config.model
  windows = jnp.asarray(data.windows(data.load().val, c.seq, 8)[:, :-1])
  cast = jax.tree.map(lambda x: x.astype(dtype), params)
  model = DecoderLM(c, "plain", temperature=True, qk_input="fold")
  _, inter = model.apply({"params": cast}, windows, mutable=["intermediates"])
  seen = np.stack(
    [
      np.asarray(inter["intermediates"][f"layer_{i}"]["attn"]["head_max_logit"][0], np.float64)
      for i in range(c.depth)
    ]
  )
  slack = 1.0 + (2e-2 if dtype == jnp.bfloat16 else 1e-5)
  assert (seen <= logit_bounds(params, c, "fold") * slack).all()


def test_frame_rate_reaches_only_arms_with_their_own_rule(tmp_path):
  parser = __import__("argparse").ArgumentParser()
  command.add_arguments(parser)
  facts = data.load().facts
  config = dataclasses.replace(lm_config.PRESETS["quick"], frame_lr=0.3)
  for name, own in (("B2", True), ("B2-fold", True), ("A2-temp", False), ("frozen", False)):
    assert command._own_frame_rate(name) is own
    cfg = lm_runs.run_config(arms.ARMS[name], config, facts, "quick")
    assert ("-flr0.3-" in lm_runs.run_name(name, cfg, 0)) is own
    assert "--frame-lr 0.3" in lm_runs.run_command(name, cfg, 0, tmp_path)
  # Study 1's file names and hashes do not change (no frame rate in the stem at 1.0).
  cfg = lm_runs.run_config(arms.ARMS["B2"], lm_config.PRESETS["sweep"], facts, "sweep")
  assert "flr" not in lm_runs.run_name("B2", cfg, 0)
  assert "--frame-lr" not in lm_runs.run_command("B2", cfg, 0, tmp_path)


@pytest.mark.slow
def test_a_short_run_logs_study_twos_entries_and_keeps_frames_orthonormal():
  """Three steps of B2-fold, evaluated after each. At step 1, m_hat = xi and v_hat =
  |xi|^2, so |eta| = lr (eps aside): the logged cap ratio is lr / (tau sqrt(r))."""
  config = dataclasses.replace(TINY, steps=3, eval_every=1, frame_lr=0.2, max_norm=0.1)
  r = training.train(arms.ARMS["B2-fold"], config, 0, progress=False)
  h, c = r["history"], config.model
  assert not r["metrics"]["diverged"] and max(h["isometry"]) < 1e-5
  assert len(h["step"]) == 4 and h["cap_ratio_mean"][0] is None
  want = 0.2 / (0.1 * np.sqrt(c.head_dim))
  np.testing.assert_allclose([h["cap_ratio_mean"][1], h["cap_ratio_max"][1]], want, rtol=1e-4)
  assert h["cap_fraction"][1] == 0.0
  for k in ("head_max_logit", "head_entropy", "temperature", "logit_bound"):
    assert np.asarray(h[k][-1]).shape == (c.depth, c.heads), k
  assert len(h["norm_gain"][-1]) == c.depth
  for seen, bound in zip(h["head_max_logit"], h["logit_bound"]):
    assert (np.asarray(seen) <= np.asarray(bound)).all()
  np.testing.assert_allclose(
    h["logit_bound"][-1],
    c.d_model / np.sqrt(c.head_dim) * np.exp(np.asarray(h["temperature"][-1])),
    rtol=1e-4,
  )
  assert training._cap_ratio_fn(arms.ARMS["A2-temp"], config) is None
  assert training._cap_ratio_fn(arms.ARMS["frozen"], config) is None


def _record(tmp_path, arm, lr, frame, seed, val, config=None):
  config = config or lm_config.PRESETS["sweep"]
  facts = data.load().facts
  c = dataclasses.replace(config, adamw_lr=lr, frame_lr=frame)
  cfg = lm_runs.run_config(arms.ARMS[arm], c, facts, "sweep")
  rec = {
    "experiment": "lm",
    "arm": arm,
    "seed": seed,
    "config": cfg,
    "metrics": {"val_bpb": val, "test_bpb": val, "init_val_bpb": 8.0, "diverged": False},
  }
  write_json(tmp_path / lm_runs.run_name(arm, cfg, seed), harness.complete_lm_record(rec))


def test_the_best_cell_needs_both_selection_seeds_of_every_cell(tmp_path):
  config, facts = lm_config.PRESETS["sweep"], data.load().facts
  loss = {(3e-3, 0.1): 2.0, (1e-2, 0.1): 1.9, (3e-3, 0.3): 1.85, (1e-2, 0.3): 1.9}
  loss |= {(3e-3, 1.0): 1.95, (1e-2, 1.0): 1.83}
  for (a, f), v in loss.items():
    _record(tmp_path, "B2", a, f, 0, v)
  with pytest.raises(CommandError, match="not finished"):
    grid.best_cell(tmp_path, "B2", config, facts, "sweep")
  for (a, f), v in loss.items():
    _record(tmp_path, "B2", a, f, 1, v + (0.05 if (a, f) == (1e-2, 1.0) else 0.0))
  # (1e-2, 1.0) leads on seed 0 alone; over both seeds (3e-3, 0.3) does.
  assert grid.best_cell(tmp_path, "B2", config, facts, "sweep") == (3e-3, 0.3)
  for s in range(2, 6):  # later seeds at another cell never move the choice
    _record(tmp_path, "B2", 1e-2, 1.0, s, 1.0)
  assert grid.best_cell(tmp_path, "B2", config, facts, "sweep") == (3e-3, 0.3)
  # E2's arms are chosen at E1's best frame rate only.
  assert fair.cells("B2-fold", 0.3) == [(a, 0.3) for a in fair.E2_ADAMW_RATES]
  with pytest.raises(ValueError, match="frame_best"):
    fair.cells("B2-fold")
  with pytest.raises(ValueError, match="not in study 2"):
    fair.cells("A2-sigma")


def _study_record(arm, cell, seed, val, preset="sweep", seen=20.0):
  cfg = lm_config.PRESETS[preset]
  c = dataclasses.replace(cfg, adamw_lr=cell[0], frame_lr=cell[1])
  rc = lm_runs.run_config(arms.ARMS[arm], c, data.load().facts, preset)
  return harness.complete_lm_record(
    {
      "experiment": "lm",
      "arm": arm,
      "seed": seed,
      "config": rc,
      "metrics": {
        "val_bpb": val,
        "test_bpb": val + 0.01,
        "init_val_bpb": 8.0,
        "diverged": False,
        "max_logit_max": 20.0,
        "entropy": 1.5,
        "isometry": 1e-7,
      },
      "history": {
        "head_max_logit": [[[seen] * 8] * 2],
        "logit_bound": [[[32.0] * 8] * 2],
        "cap_fraction": [0.25],
      },
    }
  )


#: The synthetic study 2's best cells and offsets (B2-fold is its best Stiefel arm).
_TARGET = {"B2": (3e-3, 0.3), "A2": (5.5e-3, 1.0), "A2-qknorm": (1e-2, 1.0)}
_TARGET |= {a: (1e-2, 0.3) for a in fair.E2_ARMS} | {"A2-temp": (3e-3, 1.0)}
_OFFSET = {"A2": 0.0, "A2-qknorm": -0.03, "B2": 0.01, "B2-fold": -0.04}


def _synthetic_study2(tmp_path):
  """Every cell of study 2 at seeds 0-1, then seeds 2-5 at the best cells; a run's
  loss grows with its log-distance from its arm's target cell."""
  rng = np.random.default_rng(0)

  def write(arm, cell, seed):
    target = _TARGET[arm]
    dist = abs(np.log(cell[0] / target[0])) + abs(np.log(cell[1] / target[1]))
    val = 1.8 + _OFFSET.get(arm, 0.02) + 0.01 * dist + 0.002 * rng.standard_normal()
    rec = _study_record(arm, cell, seed, val, seen=40.0 if arm == "B2-temp" else 20.0)
    write_json(tmp_path / lm_runs.run_name(arm, rec["config"], seed), rec)

  grid = {a: fair.cells(a, 0.3) for a in ("B2", "A2", "A2-qknorm", "A2-temp", *fair.E2_ARMS)}
  for arm, cs in grid.items():
    for cell in cs:
      for s in (0, 1):
        write(arm, cell, s)
    for s in range(2, 6):
      write(arm, _TARGET[arm], s)
  for s in range(2, 6):
    write("B2", (1e-2, 1.0), s)


def test_the_report_of_a_whole_study_two(tmp_path):
  """A synthetic study 2 (every cell, seeds 0-1, then 0-5 at the best cells): the
  report picks the protocol's cells, pairs six seeds and checks the bound."""
  from stiefax.experiments import report as report_lib
  from stiefax.experiments.lm import tables

  _synthetic_study2(tmp_path)
  target = _TARGET
  for s in (0, 1):  # the best Stiefel arm's later sweep: rates outside its grid
    rec = _study_record("B2-diag", (3e-4, 0.3), s, 1.7)
    write_json(tmp_path / lm_runs.run_name("B2-diag", rec["config"], s), rec)
  groups, warnings = report_lib.load_runs(tmp_path)
  assert warnings == []
  assert fair.best_cells(groups["lm"]) == target
  text = tables.report(groups["lm"], None)
  assert "study 2, E1 (the frame step)" in text and "B2, frame rate 0.3" in text
  best_table = text.split("each arm at its best cell")[1].split("\n\n")[0]
  rows = {ln.split()[0]: ln for ln in best_table.splitlines()[3:-1]}
  assert "0.003 / 0.3" in rows["B2"] and rows["A2"].split()[1] == "0.0055"
  attn = text.split("the same runs' attention")[1].split("\n\n")[0]
  ratio = {ln.split()[0]: ln.split()[2] for ln in attn.splitlines()[5:]}
  assert ratio["B2-fold"] == "0.62" and ratio["B2-temp"] == "1.25"
  assert "(6)" in rows["B2-fold"] and "better" in rows["B2-fold"]
  assert "B2 - B2@study1" in text and "B2-fold - B2-temp" in text
  assert text.count("A2-temp - A2 ") == 1
  budget = text.split("tuning budget")[1].split("\n\n")[0]
  assert "A2         9" in budget and "B2         6" in budget
  # The sweep's rates are neither in B2-diag's budget nor candidates for its best cell.
  assert "B2-diag    3      AdamW 0.01, frame 0.3" in budget
  # B2-diag is not the best Stiefel arm: its extra rates make no sweep row.
  assert "over study 1's sweep" not in text


def test_the_best_stiefel_arms_sweep_sits_beside_study_ones_rates(tmp_path):
  """Once the best Stiefel arm (B2-fold here) runs rates outside E2's, the report shows
  it over study 1's seven rates beside A2 and A2-qknorm; its sensitivity once all seven
  have both selection seeds, with the same definition as study 1's table."""
  from stiefax.experiments import report as report_lib  # pylint: disable=g-import-not-at-top

  _synthetic_study2(tmp_path)
  extra = [r for r in lm_config.SWEEP_RATES if r not in fair.E2_ADAMW_RATES]

  def sweep(rates, seeds):
    for lr in rates:
      for s in seeds:
        rec = _study_record("B2-fold", (lr, 0.3), s, 1.9 + abs(np.log(lr / 1e-2)) / 10)
        write_json(tmp_path / lm_runs.run_name("B2-fold", rec["config"], s), rec)

  sweep(extra[:1], (0, 1))
  sweep(extra[1:], (0,))  # seed 1 of the other three still running
  small = report_lib.load_runs(tmp_path)[0]["lm"]
  assert fair.best_stiefel_arm(small) == "B2-fold"
  text = "\n".join(fair_tables.report(small))
  rows = text.split("over study 1's sweep")[1].split("\n\n")[0].splitlines()[4:]
  row = {ln.split("  ")[0]: ln.split() for ln in rows}
  assert set(row) == {"A2", "A2-qknorm", "B2-fold, frame 0.3"}
  assert row["B2-fold, frame 0.3"][-3:] == ["(4/7", "rates)", "-"]
  sweep(extra[1:], (1,))
  small = report_lib.load_runs(tmp_path)[0]["lm"]
  text = "\n".join(fair_tables.report(small))
  rows = text.split("over study 1's sweep")[1].split("\n\n")[0].splitlines()[4:]
  row = {ln.split("  ")[0]: ln.split() for ln in rows}
  mine = [r for r in small if r["arm"] == "B2-fold" and r["seed"] < 2 and fair.cell_of(r)[1] == 0.3]
  assert len(mine) == 14
  assert row["B2-fold, frame 0.3"][-2:] == [f"{lm_runs.sensitivity(mine):.3f}", "0.01"]
  attn = text.split("over study 1's sweep")[1].split("the same runs' attention")[1]
  attn_rows = {ln.split("  ")[0]: ln for ln in attn.split("\n\n")[0].splitlines()[4:]}
  assert attn_rows["B2-fold, frame 0.3"].count("20.0 / 1.50") == 7
  assert (
    row["A2"][-2]
    == f"{lm_runs.sensitivity([r for r in small if r['arm'] == 'A2' and r['seed'] < 2 and r['config']['adamw_lr'] in lm_config.SWEEP_RATES]):.3f}"
  )


def test_the_larger_models_arms_and_cells_follow_the_small_models_study(tmp_path):
  """The best Stiefel arm, its QK-norm partner and each arm's three cells on the
  larger model come from study 2's small-model runs, by the protocol's rules."""
  facts = data.load().facts
  with pytest.raises(CommandError, match="not finished"):
    grid.study2_arm("best-stiefel", tmp_path, facts)
  _synthetic_study2(tmp_path)
  assert grid.study2_arm("best-stiefel", tmp_path, facts) == "B2-fold"
  assert grid.study2_arm("best-stiefel-partner", tmp_path, facts) == "B2-qknorm"
  assert fair.qknorm_partner("B2") == "B2-qknorm" and fair.qknorm_partner("B2-qknorm") == "B2"
  with pytest.raises(ValueError, match="Stiefel arms"):
    fair.qknorm_partner("A2")
  # x3 either side, rounded so that 3 x 1e-2 is the sweep's 3e-2; the frame rate kept.
  assert fair.around((1e-2, 0.3)) == [(0.00333333, 0.3), (1e-2, 0.3), (3e-2, 0.3)]
  assert grid.around_cells(tmp_path, "A2", facts) == [
    (0.00183333, 1.0),
    (5.5e-3, 1.0),
    (0.0165, 1.0),
  ]
  assert grid.around_cells(tmp_path, "B2-fold", facts) == fair.around((1e-2, 0.3))
  assert grid.around_cells(tmp_path, "A2-qknorm", facts) == fair.around((1e-2, 1.0))


def test_the_report_of_the_larger_model(tmp_path):
  """The larger model's runs are a setting of their own: a table of each arm's three
  cells and the paired table at the best, without study 1's sections."""
  from stiefax.experiments import report as report_lib
  from stiefax.experiments.lm import tables

  best = {"A2": (5.5e-3, 1.0), "A2-qknorm": (1e-2, 1.0), "B2-fold": (3e-2, 0.3)}
  for arm, small in (("A2", (5.5e-3, 1.0)), ("A2-qknorm", (1e-2, 1.0)), ("B2-fold", (1e-2, 0.3))):
    for cell in fair.around(small):
      for s in (0, 1):
        val = 1.7 + 0.01 * abs(np.log(cell[0] / best[arm][0])) + 0.001 * s
        rec = _study_record(arm, cell, s, val, preset="large")
        write_json(tmp_path / lm_runs.run_name(arm, rec["config"], s), rec)
  groups, warnings = report_lib.load_runs(tmp_path)
  assert warnings == [] and fair.is_large(groups["lm"])
  assert fair.best_cells(groups["lm"]) == best
  text = tables.report(groups["lm"], None)
  assert "lm (large)" in text and "the larger model" in text
  assert "0.0165: 1.711 / 1.711" in text  # A2's upper cell: seed 0 / mean over 0-1
  assert "study 1's arms" not in text and "E1 (the frame step)" not in text
  # The best is chosen by seed 0 alone (the budget rule): without the cells' seed 1
  # it is the same, and a seed 1 that disagrees does not move it.
  for f in tmp_path.glob("*-large-*-s1.json"):
    f.unlink()
  groups, _ = report_lib.load_runs(tmp_path)
  assert fair.best_cells(groups["lm"]) == best
  text = tables.report(groups["lm"], None)
  assert "0.0165: 1.711" in text and "0.0165: 1.711 /" not in text  # seed 0 alone
  rec = _study_record("A2", (0.0165, 1.0), 1, 1.0, preset="large")
  write_json(tmp_path / lm_runs.run_name("A2", rec["config"], 1), rec)
  groups, _ = report_lib.load_runs(tmp_path)
  assert fair.best_cells(groups["lm"])["A2"] == (5.5e-3, 1.0)
  # An arm with a cell not begun has no best yet, though its other cells are complete.
  for f in tmp_path.glob("B2-fold-large-lr0.03-*"):
    f.unlink()
  groups, _ = report_lib.load_runs(tmp_path)
  assert fair.best_cells(groups["lm"]) == {k: v for k, v in best.items() if k != "B2-fold"}


def test_the_docs_quote_study_twos_report_on_the_small_model():
  """Every line of the small model's study-2 tables that ``stiefax report
  results/lm-fair`` prints from the committed runs is in docs/lm.md, and every cell of
  E1, E2 and E3 has both selection seeds and every best cell six seeds."""
  import pathlib  # pylint: disable=g-import-not-at-top

  from stiefax.experiments import report as report_lib  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).parent.parent
  groups, warnings = report_lib.load_runs(root / "results/lm-fair")
  assert warnings == []
  small = [r for r in groups["lm"] if r["config"]["preset"] == fair.SMALL_PRESET]
  best = fair.best_cells(small)
  assert set(best) == {"B2", "A2", "A2-qknorm", "A2-temp", *fair.E2_ARMS}
  for arm, cell in best.items():
    seeds = {r["seed"] for r in small if r["arm"] == arm and fair.cell_of(r) == cell}
    assert seeds == set(range(6)), arm
  doc = (root / "docs/lm.md").read_text()
  text = columns.fit("\n".join(fair_tables.report(small)))  # in parts of 80 characters
  missing = [ln for ln in text.splitlines() if ln.strip() and ln not in doc]
  assert missing == [], missing


def test_the_docs_quote_study_twos_report_on_the_larger_model():
  """Every line of the larger model's study-2 tables that ``stiefax report
  results/lm-fair`` prints from the committed runs is in docs/lm.md, and each of its
  runs is one of its arms' three cells."""
  import pathlib  # pylint: disable=g-import-not-at-top

  from stiefax.experiments import report as report_lib  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).parent.parent
  groups, warnings = report_lib.load_runs(root / "results/lm-fair")
  assert warnings == []
  small = [r for r in groups["lm"] if r["config"]["preset"] == fair.SMALL_PRESET]
  large = [r for r in groups["lm"] if r["config"]["preset"] == fair.LARGE_PRESET]
  assert large, "the larger model's runs are committed"
  best_small = fair.best_cells(small)
  arms = {"A2", "A2-qknorm", fair.best_stiefel_arm(small)}
  arms.add(fair.qknorm_partner(fair.best_stiefel_arm(small)))
  for r in large:
    assert r["arm"] in arms
    assert fair.cell_of(r) in fair.around(best_small[r["arm"]]), r["arm"]
  doc = (root / "docs/lm.md").read_text()
  text = columns.fit("\n".join(fair_tables.report(large)))  # in parts of 80 characters
  missing = [ln for ln in text.splitlines() if ln.strip() and ln not in doc]
  assert missing == [], missing


def test_the_larger_models_best_cell_waits_only_for_seed_0(tmp_path, capsys):
  """``--lr best --select-from around`` chooses among an arm's three larger-model
  cells once each has seed 0 (the budget rule); seed 1 of a cell is not waited for."""
  from stiefax.experiments import cli  # pylint: disable=g-import-not-at-top

  _synthetic_study2(tmp_path)
  cells = grid.around_cells(tmp_path, "A2", data.load().facts)
  for cell in cells[:2]:
    rec = _study_record("A2", cell, 0, 1.6, preset="large")
    write_json(tmp_path / lm_runs.run_name("A2", rec["config"], 0), rec)
  argv = ["lm", "--preset", "large", "--arms", "A2", "--lr", "best", "--out", str(tmp_path)]
  argv += ["--select-from", "around", "--seeds", "1,2"]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "A2's cells" in err[0] and "(1 run(s) missing)" in err[0], err


def test_no_committed_fold_run_records_a_logit_above_its_bound():
  """Every evaluation of every committed ``B2-fold`` run, on either model, has each
  head's largest logit within that head's certified bound, and docs/lm.md quotes the
  largest ratio."""
  import json  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).parent.parent
  ratios = []
  for path in sorted((root / "results/lm-fair").glob("B2-fold-*.json")):
    h = json.loads(path.read_text())["history"]
    assert len(h["head_max_logit"]) == len(h["logit_bound"]) > 0, path.name
    for seen, bound in zip(h["head_max_logit"], h["logit_bound"]):
      ratios.append(float(np.max(np.asarray(seen) / np.asarray(bound))))
  assert ratios and max(ratios) <= 1.0
  doc = (root / "docs/lm.md").read_text()
  assert f"{max(ratios):.2f} over all ten `B2-fold` runs" in doc
  assert len(list((root / "results/lm-fair").glob("B2-fold-*.json"))) == 10


def _committed_best_contrasts(preset):
  """``(runs, best, contrast)`` of one model's committed study-2 runs: ``contrast(b,
  a)`` pairs the test losses of arms ``b`` and ``a`` at their best cells, seeds 0-5."""
  import pathlib  # pylint: disable=g-import-not-at-top

  from stiefax.experiments import report as report_lib  # pylint: disable=g-import-not-at-top
  from stiefax.experiments import stats  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).parent.parent
  groups, warnings = report_lib.load_runs(root / "results/lm-fair")
  assert warnings == []
  runs = [r for r in groups["lm"] if r["config"]["preset"] == preset]
  best = fair.best_cells(runs)

  def losses(arm):
    at = [r for r in runs if r["arm"] == arm and fair.cell_of(r) == best[arm]]
    return {r["seed"]: lm_runs.loss_of(r, "test_bpb") for r in at}

  def contrast(b, a):
    lb, la = losses(b), losses(a)
    assert sorted(lb) == sorted(la) == list(range(6)), (b, a)
    return stats.paired([la[s] for s in range(6)], [lb[s] for s in range(6)])

  return runs, best, contrast


def test_the_larger_models_answer_in_the_docs_is_its_runs():
  """docs/lm.md's paragraph on the larger model quotes its paired contrasts and their
  verdicts (6 seeds, both intervals agreeing), the small model's gaps it compares them
  with, and that every arm's best is the lowest rate of its three cells."""
  import pathlib  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).parent.parent
  doc = " ".join((root / "docs/lm.md").read_text().split())
  para = doc.split("**The larger model's answer**", 1)[1].split("###", 1)[0]
  large, best, contrast = _committed_best_contrasts(fair.LARGE_PRESET)
  assert set(best) == {"A2", "A2-qknorm", "B2-diag", "B2-qknorm"}
  qk = contrast("A2-qknorm", "A2")
  assert qk.verdict == "no difference"
  assert (
    f"(`A2-qknorm` - A2: {qk.mean:+.3f}, t interval [{qk.t_low:+.3f}, {qk.t_high:+.3f}]," in para
  )
  assert "no difference between QK-norm and AdamW is detected" in para
  stiefel = [("B2-diag", "ends "), ("B2-qknorm", "")]
  vs_adamw = [contrast(arm, "A2") for arm, _ in stiefel]
  vs_qk = [contrast(arm, "A2-qknorm") for arm, _ in stiefel]
  assert all(p.verdict == "b > a" for p in vs_adamw + vs_qk)  # worse, settled
  first, second = (f"`{arm}` {verb}{a.mean:+.3f}" for (arm, verb), a in zip(stiefel, vs_adamw))
  assert f"{first} above AdamW and {vs_qk[0].mean:+.3f} above QK-norm" in para
  assert f"{second} and {vs_qk[1].mean:+.3f}, each worse" in para
  _, _, small_contrast = _committed_best_contrasts(fair.SMALL_PRESET)
  small = [small_contrast(arm, "A2-qknorm").mean for arm, _ in stiefel]
  assert f"ended {small[0]:+.3f} and {small[1]:+.3f} above QK-norm" in para
  assert all(small_contrast(arm, "A2").verdict == "not settled" for arm, _ in stiefel)
  for arm, cell in best.items():
    tried = {fair.cell_of(r) for r in large if r["arm"] == arm}
    assert len(tried) == 3 and cell == min(tried), arm
  minutes = [r["wall_time"] / 60 for r in large]
  hours = sum(minutes) / 60
  assert f"{len(large)} runs, whose wall times add up to {hours:.1f} core-hours" in doc
  assert f"({min(minutes):.0f} to {max(minutes):.0f} core-minutes a run)" in doc


def test_study_twos_sentences_are_its_runs():
  """Every number docs/lm.md writes by hand in study 2's decisions, the larger model's
  budget and "Study 2 in plain words" is recomputed from the committed runs of
  results/lm-fair (and study 1's, results/lm): the cells the rules chose, the copies
  of study 1's files, the budget, the share of B2's gap the frame step removed, the
  paired contrasts with their intervals, and the sweep's sensitivities and logits."""
  import filecmp  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top

  from stiefax.experiments import report as report_lib  # pylint: disable=g-import-not-at-top
  from stiefax.experiments import stats  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).parent.parent
  text = (root / "docs/lm.md").read_text()
  doc = " ".join(text.split("## Study 2:", 1)[1].split("## Study 3:", 1)[0].split())
  groups, warnings = report_lib.load_runs(root / "results/lm-fair")
  assert warnings == []
  small = [r for r in groups["lm"] if r["config"]["preset"] == fair.SMALL_PRESET]
  large = [r for r in groups["lm"] if r["config"]["preset"] == fair.LARGE_PRESET]
  best = fair.best_cells(small)

  def at(arm, cell, seeds=range(6), runs=small):
    got = {r["seed"]: r for r in runs if r["arm"] == arm and fair.cell_of(r) == cell}
    assert set(seeds) <= set(got), (arm, cell)
    return [got[s] for s in seeds]

  def val(arm, cell):  # the selection's mean over seeds 0-1
    return f"{np.mean([lm_runs.loss_of(r, 'val_bpb') for r in at(arm, cell, (0, 1))]):.4f}"

  def test(arm, cell, runs=small):
    return [lm_runs.loss_of(r, "test_bpb") for r in at(arm, cell, runs=runs)]

  def contrast(b, a, runs=small):
    of = fair.best_cells(runs)
    return stats.paired(test(a, of[a], runs), test(b, of[b], runs))

  def ci(p, digits=3):
    return f"[{p.t_low:+.{digits}f}, {p.t_high:+.{digits}f}]"

  # Decisions the rules took.
  diag, qk, temp, b2, fold = (best[a] for a in ("B2-diag", "B2-qknorm", "B2-temp", "B2", "B2-fold"))
  assert fair.best_stiefel_arm(small) == "B2-diag"
  assert (
    f"(mean validation loss {val('B2-diag', diag)} over seeds 0-1 at AdamW 1e-2, against"
    f" {val('B2-qknorm', qk)} for `B2-qknorm`, {val('B2-temp', temp)} for `B2-temp`,"
    f" {val('B2', b2)} for B2 and {val('B2-fold', fold)} for `B2-fold`)" in doc
  )
  frame_rates = sorted({fair.cell_of(r)[1] for r in small if r["arm"] == "B2"})
  assert b2 == (1e-2, 0.1) and frame_rates[0] == 0.1  # the lowest rate: not bracketed
  assert "It is the smallest rate of the grid, so the frame rate's optimum is not bracketed" in doc
  assert (
    f"(mean validation loss {val('B2', b2)} over seeds 0-1, against {val('B2', (1e-2, 0.3))}"
    f" at 0.3 and {val('B2', (1e-2, 1.0))} at 1.0)" in doc
  )
  assert best["A2"] == (5.5e-3, 1.0)
  assert f"5.5e-3 ({val('A2', best['A2'])} over seeds 0-1, against {val('A2', (3e-3, 1.0))}" in doc
  cap = max(
    v
    for r in small
    if r["arm"] == "B2" and r["config"]["max_norm"] == 0.1
    for v in r["history"].get("cap_ratio_max", [])  # study 1's copies did not log it
    if v is not None
  )
  assert cap < 1 and f"`|eta|_F / (tau sqrt(r))` was {cap:.2f}, at frame rate 1.0)" in doc
  rerun = at("B2", (3e-3, 1.0), (0,))[0]
  (first,) = [
    json.loads(p.read_text())
    for p in (root / "results/lm").glob("B2-sweep-lr0.003-*-s0.json")
    if json.loads(p.read_text())["config"]["frame_lr"] == 1.0
  ]
  again, before = (lm_runs.loss_of(r, "val_bpb") for r in (rerun, first))
  assert f"seed 0: {again:.4f} against {before:.4f}" in doc

  # The copies of study 1's files.
  copied: dict = {}
  for path in sorted((root / "results/lm-fair").glob("*.json")):
    twin = root / "results/lm" / path.name
    if twin.exists() and filecmp.cmp(path, twin, shallow=False):
      r = json.loads(path.read_text())
      copied.setdefault(r["arm"], []).append((fair.cell_of(r), r["seed"]))
  assert sorted(copied) == ["A2", "A2-qknorm", "B2"]
  n_qk = sum(r["arm"] == "A2-qknorm" for r in small)
  assert len(copied["A2-qknorm"]) == n_qk == 18
  assert sorted({cell[0] for cell, _ in copied["A2"]}) == list(lm_config.SWEEP_RATES)
  assert len(copied["A2"]) == 14 and best["A2"] not in {cell for cell, _ in copied["A2"]}
  assert sorted(copied["B2"]) == [((1e-2, 1.0), s) for s in (2, 3, 4, 5)]
  assert (
    f"A2-qknorm's {n_qk} runs (all of them), A2's {len(copied['A2'])} runs at study 1's"
    f" seven rates and B2@study1's seeds 2-5 are byte-for-byte copies" in doc
  )

  # The larger model's budget: the cut to seed 0 at the rates either side was unneeded.
  by_code: dict = {}
  for r in large:
    by_code.setdefault(r["code"]["commit"], []).append(r["wall_time"] / 60)
  first_runs, other = sorted(by_code.values(), key=len)
  full = (sum(first_runs) + (40 - len(first_runs)) * np.mean(other)) / 60
  assert len(large) + 4 == 40 and full < 12
  assert (
    f"the first {len(first_runs)} runs averaged {np.mean(first_runs):.1f} core-minutes, but"
    f" the other {len(other)} averaged {np.mean(other):.1f}, so the full design's 40 runs" in doc
  )
  assert f"would have taken about {full:.1f} core-hours, also within the 12" in doc

  # In plain words: the frame step's share of B2's gap, not settled.
  old = stats.paired(test("A2", best["A2"]), test("B2", (1e-2, 1.0)))
  new = contrast("B2", "A2")
  step = stats.paired(test("B2", (1e-2, 1.0)), test("B2", b2))
  assert step.verdict == "not settled" and new.verdict == old.verdict == "b > a"
  share = round(100 * (old.mean - new.mean) / old.mean)
  assert (
    f"removed about {share}% of B2's gap to AdamW ({old.mean:+.3f} bits per byte at study"
    f" 1's cell, {new.mean:+.3f} at the tuned one): a gain of {-step.mean:.3f} that is not"
    f" settled (t interval {ci(step)}, bootstrap [{step.ci_low:+.3f}, {step.ci_high:+.3f}])" in doc
  )
  for b, a, words in [
    ("B2-temp", "B2", "(`B2-temp` - B2: {m}, t interval {ci}, no difference;"),
    ("A2-temp", "A2", "`A2-temp` - A2: {m}, {ci}, no difference)"),
    ("B2-fold", "B2-temp", "(`B2-fold` - `B2-temp`: {m}, {ci}, no difference)"),
  ]:
    p = contrast(b, a)
    assert p.verdict == "no difference", (b, a)
    assert words.format(m=f"{p.mean:+.3f}", ci=ci(p)) in doc, (b, a)
  p = contrast("B2-diag", "B2")
  assert p.verdict == "no difference"
  assert f"(`B2-diag` - B2: {p.mean:+.4f}, {ci(p)}, no difference)" in doc
  # Every Stiefel arm above QK-norm, settled; against AdamW as the doc sorts them.
  above = {arm: contrast(arm, "A2-qknorm") for arm in fair.STIEFEL_ARMS}
  assert all(p.verdict == "b > a" for p in above.values())
  low, high = min(above, key=lambda a: above[a].mean), max(above, key=lambda a: above[a].mean)
  assert (
    f"by {above[low].mean:.3f} (`{low}`) to {above[high].mean:.3f} (`{high}`) bits per byte" in doc
  )
  verdicts = {arm: contrast(arm, "A2").verdict for arm in fair.STIEFEL_ARMS}
  assert {a for a, v in verdicts.items() if v == "b > a"} == {"B2", "B2-temp", "B2-fold"}
  assert {a for a, v in verdicts.items() if v == "not settled"} == {"B2-qknorm", "B2-diag"}
  # QK-norm against AdamW, both models: no difference detected, with the intervals.
  qk_small, qk_large = contrast("A2-qknorm", "A2"), contrast("A2-qknorm", "A2", large)
  assert qk_small.verdict == qk_large.verdict == "no difference"
  assert (
    f"({qk_small.mean:+.3f}, t interval {ci(qk_small)}, bootstrap [{qk_small.ci_low:+.3f},"
    f" {qk_small.ci_high:+.3f}])" in doc
  )
  assert f"({qk_large.mean:+.3f}, t interval {ci(qk_large)})" in doc
  assert (
    f"at either scale ({qk_small.mean:+.3f}, t interval {ci(qk_small)}; {qk_large.mean:+.3f},"
    f" {ci(qk_large)}; 6 paired seeds each, not shown equal)" in doc
  )
  assert (
    f"(`A2-qknorm` - A2: {qk_large.mean:+.3f}, t interval {ci(qk_large)}, no difference)" in doc
  )
  for words in ("changes nothing", "as good as the best-tuned", "every fix", "own seeds"):
    assert words not in doc, words
  # The best Stiefel arm's sweep: sensitivities, losses and logits at the high rates.
  sweep = {r: at("B2-diag", (r, 0.1), (0, 1)) for r in lm_config.SWEEP_RATES}
  loss = {r: np.mean([lm_runs.loss_of(x, "val_bpb") for x in runs]) for r, runs in sweep.items()}
  logit = {r: max(x["metrics"]["max_logit_max"] for x in runs) for r, runs in sweep.items()}
  assert "2.219 at 0.1 and 3.638 at 0.3" in doc and (f"{loss[0.1]:.3f}", f"{loss[0.3]:.3f}") == (
    "2.219",
    "3.638",
  )
  big = (f"{logit[0.1]:,.0f}".replace(",", " "), f"{logit[0.3]:,.0f}".replace(",", " "))
  assert f"its largest logit reaches {big[0]} and {big[1]}" in doc
