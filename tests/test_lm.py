"""``stiefax lm``: the text, the model's layout and variants, training, runs, report."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stiefax.experiments import arms
from stiefax.experiments import cli
from stiefax.experiments.checkpoints import Checkpoints
from stiefax.experiments.lm import config as lm_config
from stiefax.experiments.lm import data
from stiefax.experiments.lm import runs as lm_runs
from stiefax.experiments.lm import sweep_tables
from stiefax.experiments.lm import tables
from stiefax.experiments.lm import training
from stiefax.experiments.lm.model import DecoderLM
from stiefax.experiments.lm.model import rope
from tests import columns
from tests import harness

TINY = dataclasses.replace(lm_config.PRESETS["quick"], steps=20, warmup_steps=2, eval_every=10)
TINY = dataclasses.replace(TINY, val_windows=16, test_windows=16, probe_windows=4)


def test_the_text_is_split_by_file_and_fixed():
  corpus = data.load()
  facts = corpus.facts
  assert facts["train_files"] > 100 and facts["val_files"] >= 3 and facts["test_files"] >= 3
  assert corpus.val.size > 50_000 and corpus.test.size > 50_000
  assert data.split_of("os.py") == data.split_of("os.py")
  w = data.windows(corpus.val, 8, 3)
  assert w.shape == (3, 9) and np.array_equal(w[1], corpus.val[9:18])
  a = data.train_positions(1000, 8, 5, 4, seed=3)
  assert np.array_equal(a, data.train_positions(1000, 8, 5, 4, seed=3))
  assert a.max() < 1000 - 9 and not np.array_equal(a, data.train_positions(1000, 8, 5, 4, seed=4))
  with pytest.raises(ValueError, match="need"):
    data.windows(corpus.val, 128, 10**6)


def test_rope_rotates_pairs_and_keeps_norms():
  with jax.enable_x64(True):
    x = jax.random.normal(jax.random.key(0), (1, 5, 2, 4), jnp.float64)
    y = rope(x)
    np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1), 1e-12)
    np.testing.assert_allclose(y[:, 0], x[:, 0])  # position 0: no rotation
    # Position t, pair 0 (frequency 1): a rotation by t radians.
    t = 3
    c, s = np.cos(t), np.sin(t)
    np.testing.assert_allclose(y[0, t, 0, 0], c * x[0, t, 0, 0] - s * x[0, t, 0, 2], 1e-12)
    # Logits depend on relative positions only: q_t . k_s = q_{t+1} . k_{s+1}.
    q = jnp.broadcast_to(x[:, :1], x.shape)
    k = jnp.broadcast_to(x[:, 1:2], x.shape)
    rq, rk = rope(q), rope(k)
    np.testing.assert_allclose(rq[0, 3] @ rk[0, 1].T, rq[0, 4] @ rk[0, 2].T, 1e-12)


def test_gemma_layout_and_one_norm_per_head():
  import stiefax

  c = TINY.model
  for attention in ("plain", "qknorm", "sigma"):
    v = DecoderLM(c, attention).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    attn = v["params"]["layer_0"]["attn"]
    assert attn["q_einsum"]["w"].shape == (c.heads, c.d_model, c.head_dim)
    assert attn["kv_einsum"]["w"].shape == (2, c.kv_heads, c.d_model, c.head_dim)
    labels = stiefax.layouts.qk_labels(v)
    frames = [
      "/".join(stiefax.layouts.path_names(p))
      for p, lab in jax.tree_util.tree_flatten_with_path(labels)[0]
      if lab == "stiefel"
    ]
    assert sorted(frames) == sorted(
      f"params/layer_{i}/attn/{m}/w" for i in range(c.depth) for m in ("q_einsum", "kv_einsum")
    )
    if attention == "qknorm":
      for i in range(c.depth):
        a = v["params"][f"layer_{i}"]["attn"]
        norms = sorted(k for k in a if k.endswith("_ln"))
        assert norms == ["key_ln", "query_ln"]
        assert a["query_ln"] == {"scale": a["query_ln"]["scale"]}
        assert a["query_ln"]["scale"].shape == (c.head_dim,)
        assert a["key_ln"]["scale"].shape == (c.head_dim,)
    if attention == "sigma":
      assert set(v["sigma_reparam"]["layer_0"]["attn"]) == {"q", "k"}
      assert attn["q_gamma"].shape == () and attn["k_gamma"].shape == ()


def test_qknorm_normalises_each_head_of_q_and_k():
  model = DecoderLM(TINY.model, "qknorm")
  x = jnp.asarray(data.windows(data.load().val, 16, 2)[:, :-1])
  v = model.init(jax.random.key(0), x)
  _, inter = model.apply(v, x, capture_intermediates=lambda m, _: m.name in ("query_ln", "key_ln"))
  for name in ("query_ln", "key_ln"):
    (out,) = inter["intermediates"]["layer_0"]["attn"][name]["__call__"]
    heads = TINY.heads if name == "query_ln" else TINY.kv_heads
    assert out.shape == (2, 16, heads, TINY.head_dim)
    np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(out.var(-1), 1.0, atol=1e-3)


@pytest.fixture(scope="module")
def tiny_runs():
  return {
    name: training.train(arms.ARMS[name], TINY, 0, progress=False)
    for name in ("A2-qknorm", "B2-qknorm")
  }


def test_twenty_steps_keep_the_stiefel_frames_orthonormal(tiny_runs):
  b2 = tiny_runs["B2-qknorm"]
  assert not b2["metrics"]["diverged"]
  assert max(b2["history"]["isometry"]) < 1e-5  # float32 rounding
  assert tiny_runs["A2-qknorm"]["metrics"]["isometry"] > 1e-2  # AdamW frames drift
  for r in tiny_runs.values():
    m = r["metrics"]
    assert m["val_bpb"] < m["init_val_bpb"] < 12.0
    assert 0 < m["entropy"] < np.log(TINY.seq) and m["max_logit_max"] > 0


@pytest.mark.slow
def test_a_resumed_run_is_the_uninterrupted_run(tmp_path, tiny_runs):
  arm = arms.ARMS["B2-qknorm"]
  ckpt = Checkpoints(tmp_path / "run.ckpt")
  first = training.train(arm, TINY, 0, progress=False, checkpoints=ckpt, checkpoint_every=10)
  assert ckpt.latest_epoch() == 10  # left by the first run (the command removes it)
  again = training.train(arm, TINY, 0, progress=False, checkpoints=Checkpoints(ckpt.directory))
  assert again["resumed_from"] == 10
  assert again["history"]["val_bpb"] == first["history"]["val_bpb"]
  assert first["history"]["val_bpb"] == tiny_runs["B2-qknorm"]["history"]["val_bpb"]
  assert again["metrics"]["test_bpb"] == first["metrics"]["test_bpb"]


def _record(arm, lr, seed, val, test=None, diverged=False, init=8.0):
  return {
    "experiment": "lm",
    "arm": arm,
    "seed": seed,
    "config": {"adamw_lr": lr, "preset": "sweep"},
    "metrics": {
      "val_bpb": val,
      "test_bpb": val if test is None else test,
      "init_val_bpb": init,
      "diverged": diverged,
    },
  }


def test_rate_selection_and_sensitivity_follow_wortsman():
  runs = [
    _record("A2", 1e-3, 0, 3.0),
    _record("A2", 1e-3, 1, 3.2),
    _record("A2", 3e-3, 0, 2.5),
    _record("A2", 3e-3, 1, 2.7),
    _record("A2", 1e-2, 0, float("nan"), diverged=True),
    _record("A2", 1e-2, 1, 9.5),  # worse than init: counts as init
    # More seeds at one rate never move the choice.
    *[_record("A2", 1e-3, s, 1.0) for s in range(2, 8)],
  ]
  assert lm_runs.select_rate(runs) == 3e-3
  # Means over the sweep's seeds (0 and 1, the ones every rate has): 3.1, 2.6, 8.0;
  # best 2.6. The extra seeds at 1e-3 (mean 1.0) move neither the choice nor this.
  means = [3.1, 2.6, 8.0]
  assert lm_runs.sensitivity(runs) == pytest.approx(np.mean(means) - min(means))
  assert lm_runs.sensitivity(runs) == lm_runs.sensitivity(runs[:6])
  assert {r["seed"] for r in lm_runs.sweep_runs(runs)} == {0, 1}
  assert lm_runs.loss_of(runs[4]) == 8.0 and lm_runs.loss_of(runs[5]) == 8.0


def test_the_words_name_the_rate_when_the_runs_span_several():
  def run(arm, lr, test, logit):
    r = _record(arm, lr, 0, test)
    r["metrics"]["max_logit_max"] = logit
    return r

  one_arm = tables._words([run("A2", 1e-3, 2.0, 5.0), run("A2", 1e-1, 2.5, 90.0)])
  assert "A2 at 0.001 ended lowest (2.000" in one_arm and "0.500 below A2 at 0.1" in one_arm
  assert "from 5.0 (A2 at 0.001) to 90.0 (A2 at 0.1)" in one_arm
  one_rate = tables._words([run("A2", 1e-3, 2.5, 5.0), run("B2", 1e-3, 2.0, 3.0)])
  assert "B2 ended lowest (2.000" in one_rate and "below A2;" in one_rate
  assert " at 0.001" not in one_rate
  seeds = tables._words([run("B2", 1e-3, 2.0, 5.0), {**run("B2", 1e-3, 2.1, 6.0), "seed": 1}])
  assert "B2 seed 0 ended lowest (2.000" in seeds and "0.100 below B2 seed 1;" in seeds
  frames = [run("B2", 1e-3, 2.0, 5.0), run("B2", 1e-3, 2.2, 6.0), run("A2", 1e-3, 2.4, 7.0)]
  frames[0]["metrics"]["frame_lr"], frames[1]["metrics"]["frame_lr"] = 0.1, 0.3
  frames[2]["metrics"]["frame_lr"] = None
  words = tables._words(frames)
  assert "B2 frame 0.1 ended lowest" in words and "0.400 below A2;" in words
  assert "to 7.0 (A2)" in words and "(B2 frame 0.1)" in words
  one_frame = tables._words([frames[0], frames[2]])  # one frame rate names nothing
  assert "B2 ended lowest" in one_frame and "below A2;" in one_frame


def test_contrasts_pair_arms_at_their_own_best_rates():
  noise = [0.01, -0.02, 0.0, 0.015, -0.01, 0.005]
  chosen = {
    "A2-qknorm": {s: _record("A2-qknorm", 1e-2, s, 0, 1.80 + e) for s, e in enumerate(noise)},
    "B2": {s: _record("B2", 3e-3, s, 0, 1.85 + e) for s, e in enumerate(noise)},
    "frozen": {s: _record("frozen", 1e-2, s, 0, 1.85 + e / 2) for s, e in enumerate(noise[:3])},
  }
  text = "\n".join(sweep_tables._contrast_table(chosen))
  (row,) = [line for line in text.splitlines() if line.startswith("B2 - A2-qknorm")]
  assert "+0.0500" in row and "0/6" in row and row.rstrip().endswith("worse")
  # 3 pairs: an interval, but too few seeds for a verdict; absent arms give no row.
  (row,) = [line for line in text.splitlines() if line.startswith("B2 - frozen")]
  assert " 3  " in row and "1/3" in row and row.rstrip().endswith("not settled")
  assert "A2-sigma" not in text
  assert sweep_tables._contrast_table({"B2": chosen["B2"]}) == []


@pytest.mark.slow
def test_the_command_trains_skips_and_reports(tmp_path, capsys):
  out = tmp_path / "lm"
  argv = ["lm", "--arms", "A2,B2", "--steps", "50", "--out", str(out), "--no-progress"]
  assert cli.main(argv) == 0
  text = capsys.readouterr().out
  assert "max logit" in text and "isometry" in text and "In words:" in text
  files = sorted(out.glob("*.json"))
  assert [f.name.split("-")[0] for f in files] == ["A2", "B2"]
  rec = json.loads(files[1].read_text())
  assert rec["config"]["steps"] == 50 and rec["config"]["corpus"]["source"] == "python-stdlib"
  assert rec["metrics"]["isometry"] < 1e-5
  assert rec["command"].startswith("stiefax lm --preset quick --arms B2 --seeds 0 --lr 0.003")
  assert not list(out.glob("*.ckpt")) and not list(out.glob("*.lock"))
  assert cli.main(argv) == 0  # finished: read back, not trained again
  assert sorted(out.glob("*.json")) == files
  assert "learning-rate" not in capsys.readouterr().out
  assert cli.main(["report", str(out)]) == 0
  report = capsys.readouterr().out
  assert "each arm at its best rate" in report and "B2" in report
  assert "nan" not in report  # one seed: no interval, shown as "-"


@pytest.mark.slow
def test_no_wait_leaves_a_held_run_to_its_process(tmp_path, capsys, monkeypatch):
  """With --no-wait the free run trains and the command ends with status 75 instead of
  waiting for the run another process holds."""
  from stiefax.experiments import jobs  # pylint: disable=g-import-not-at-top
  from tests.harness import hold_runs  # pylint: disable=g-import-not-at-top

  out = tmp_path / "lm"
  asked = hold_runs(monkeypatch, "B2-")  # held by "another process" throughout
  argv = ["lm", "--arms", "A2,B2", "--steps", "10", "--eval-every", "5", "--out", str(out)]
  assert cli.main(argv + ["--no-progress", "--no-wait"]) == jobs.EXIT_HELD
  text = capsys.readouterr().out
  assert "1 run(s) held by other processes are left to them (--no-wait)" in text
  assert len(asked) == 2  # asked in the pass that trained A2, and once more
  assert [f.name.split("-")[0] for f in out.glob("*.json")] == ["A2"]
  assert not list(out.glob("*.lock"))


@pytest.mark.parametrize(
  "extra, message",
  [
    (["--seeds", "4294967296"], "below 2**32"),
    (["--lr", "-1"], "finite and > 0"),
    (["--arms", "A9"], "unknown arm"),
    (["--steps", "0"], "--steps 0"),
    (["--out", ""], "--out is empty"),
  ],
)
def test_bad_settings_are_one_line_errors(tmp_path, capsys, extra, message):
  argv = ["lm", "--out", str(tmp_path / "o"), *extra]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and message in err[0], err


def test_best_rate_needs_the_whole_sweep_and_ignores_later_seeds(tmp_path):
  from stiefax.experiments.flags import CommandError
  from stiefax.experiments.lm import grid as lm_grid
  from stiefax.experiments.lm import runs as lm_runs
  from stiefax.experiments.store import write_json

  config = lm_config.PRESETS["sweep"]
  facts = data.load().facts
  arm = arms.ARMS["B2"]

  def write(lr, seed, val):
    c = dataclasses.replace(config, adamw_lr=lr)
    cfg = lm_runs.run_config(arm, c, facts, "sweep")
    rec = {
      "experiment": "lm",
      "arm": "B2",
      "seed": seed,
      "config": cfg,
      "metrics": {"val_bpb": val, "test_bpb": val, "init_val_bpb": 11.0, "diverged": False},
    }
    write_json(tmp_path / lm_runs.run_name("B2", cfg, seed), harness.complete_lm_record(rec))

  losses = dict(zip(lm_config.SWEEP_RATES, (3.0, 2.6, 2.4, 2.45, 2.7, 3.5, 4.0)))
  for lr, val in list(losses.items())[:-1]:
    for s in (0, 1):
      write(lr, s, val)
  with pytest.raises(CommandError, match="not finished"):
    lm_grid.best_rate(tmp_path, "B2", config, facts, "sweep")
  for s in (0, 1):
    write(0.3, s, 4.0)
  assert lm_grid.best_rate(tmp_path, "B2", config, facts, "sweep") == 3e-3
  for s in range(2, 6):  # the best-rate seeds of another rate never move the choice
    write(1e-2, s, 1.0)
  assert lm_grid.best_rate(tmp_path, "B2", config, facts, "sweep") == 3e-3


@pytest.mark.slow
def test_a_damaged_checkpoint_is_set_aside_and_the_run_trains(tmp_path, capsys):
  out = tmp_path / "lm"
  argv = ["lm", "--arms", "A2", "--steps", "50", "--out", str(out), "--no-progress"]
  assert cli.main(argv) == 0
  (result,) = out.glob("*.json")
  first = json.loads(result.read_text())
  result.unlink()
  ckpt = result.with_suffix(".ckpt")
  (ckpt / "0").mkdir(parents=True)
  (ckpt / "0" / "garbage").write_bytes(b"\x00not an orbax checkpoint")
  capsys.readouterr()
  assert cli.main(argv) == 0
  err = capsys.readouterr().err
  assert "is unusable" in err and "training the run from the start" in err
  assert len(list(out.glob("*.ckpt.damaged-*"))) == 1 and not ckpt.exists()
  again = json.loads(result.read_text())
  assert again["metrics"]["test_bpb"] == first["metrics"]["test_bpb"]


def test_report_gives_no_sensitivity_or_best_rate_to_an_unfinished_sweep(tmp_path):
  from stiefax.experiments.lm import runs as lm_runs
  from stiefax.experiments.lm import tables

  config = lm_config.PRESETS["sweep"]
  facts = data.load().facts
  losses = dict(zip(lm_config.SWEEP_RATES, (3.0, 2.6, 2.4, 2.45, 2.7, 3.5, 4.0)))

  def record(arm, lr, seed, val):
    cfg = lm_runs.run_config(
      arms.ARMS[arm], dataclasses.replace(config, adamw_lr=lr), facts, "sweep"
    )
    metrics = {"val_bpb": val, "test_bpb": val, "init_val_bpb": 8.0, "diverged": False}
    metrics.update(max_logit_max=10.0, entropy=1.0, isometry=0.5, tokens_per_second=1e4)
    history = {"step": [0, 1000], "val_bpb": [8.0, val], "max_logit": [1.0, 10.0]}
    return {
      "experiment": "lm",
      "arm": arm,
      "seed": seed,
      "config": cfg,
      "metrics": metrics,
      "history": history,
    }

  runs = [record("A2", lr, s, v + 0.01 * s) for lr, v in losses.items() for s in (0, 1)]
  runs += [record("B2", lr, 0, v) for lr, v in list(losses.items())[:2]]
  text = tables.report(runs, tmp_path)
  a2 = next(ln for ln in text.splitlines() if ln.startswith("A2 "))  # the sweep's row
  sens = np.mean(list(losses.values())) - 2.4  # the seed offsets cancel
  assert a2.split()[-2:] == [f"{sens:.3f}", "0.003"]
  b2 = next(ln for ln in text.splitlines() if ln.startswith("B2 ") and "rates" in ln)
  assert "- (2/7 rates)" in b2 and b2.split()[-1] == "-"
  entropy = text.split("attention entropy at the end of training")[1].split("\n\n")[0]
  rows = {ln.split()[0]: ln.split()[1:] for ln in entropy.splitlines()[3:]}
  assert rows["A2"] == ["1.00"] * 7 and rows["B2"] == ["1.00"] * 2 + ["-"] * 5
  best = text.split("each arm at its best rate")[1]
  assert "\nA2 " in best and "\nB2 " not in best  # no best rate for the unfinished sweep


def test_the_committed_study_is_complete_and_the_docs_quote_its_report():
  """``results/lm`` holds the protocol of docs/lm.md (7 rates x 2 seeds per arm, then
  6 seeds per arm at its best rate), and every line of the tables that ``stiefax report
  results/lm`` prints from it is in docs/lm.md: the page says what the JSON shows."""
  import pathlib  # pylint: disable=g-import-not-at-top

  from stiefax.experiments import report as report_lib  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).parent.parent
  groups, warnings = report_lib.load_runs(root / "results/lm")
  assert warnings == []
  runs = groups["lm"]
  study1 = ("A2", "A2-qknorm", "A2-sigma", "frozen", "B2", "B2-qr", "B2-qknorm")
  assert {r["arm"] for r in runs} == set(study1)
  for arm in study1:
    mine = [r for r in runs if r["arm"] == arm]
    sweep = {(r["config"]["adamw_lr"], r["seed"]) for r in mine if r["seed"] < 2}
    assert sweep == {(lr, s) for lr in lm_config.SWEEP_RATES for s in (0, 1)}, arm
    best = lm_runs.select_rate([r for r in mine if r["seed"] < 2])
    assert {r["seed"] for r in mine if r["config"]["adamw_lr"] == best} == set(range(6)), arm
  text = columns.fit(tables.report(runs, None))  # the tables in parts of 80 characters
  doc = (root / "docs/lm.md").read_text()
  missing = [ln for ln in text.splitlines() if ln.strip() and ln not in doc]
  assert missing == [], missing
