"""The grokking experiment (`stiefax grok`) and `stiefax report`, end to end.

The command-line runs use a reduced model (p = 23, d = 32, one layer) registered as a
preset for the duration of a test, so the whole module runs in well under a minute;
the paper's model itself is checked for its shapes and split, and trained by the slow
acceptance test.
"""

import dataclasses
import json
import pathlib
import re

import jax
import numpy as np
import pytest

import stiefax
from stiefax.experiments import cli
from stiefax.experiments import optim
from stiefax.experiments.grok import command as grok_command
from stiefax.experiments.grok import config as grok_config
from stiefax.experiments.grok import data as grok_data
from stiefax.experiments.grok import model as grok_model
from stiefax.experiments.grok import runs as grok_runs
from stiefax.experiments.grok import training as grok_training
from tests import columns
from tests import harness
from tests import kernels

TINY = harness.TINY_GROK


@pytest.fixture
def tiny_preset(monkeypatch):
  monkeypatch.setitem(grok_config.PRESETS, "tiny", dict(config=TINY, arms=("A2", "B2"), seeds=(0,)))
  return "tiny"


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
  """`stiefax grok --preset tiny --arms A2,B2 --seeds 0` into a fresh directory."""
  out = tmp_path_factory.mktemp("grok")
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(grok_config.PRESETS, "tiny", dict(config=TINY, arms=("A2", "B2"), seeds=(0,)))
    with jax.numpy_rank_promotion("raise"):
      rc = cli.main(
        ["grok", "--preset", "tiny", "--arms", "A2,B2", "--seeds", "0", "--out", str(out)]
      )
  assert rc == 0
  return out


def _load(out: pathlib.Path, arm: str, seed: int = 0, config=TINY) -> dict:
  return json.loads((out / grok_runs.run_file_name(config, arm, seed, "tiny")).read_text())


# ----------------------------------------------------------------------------
# Metrics on hand-made histories.
# ----------------------------------------------------------------------------


def test_memorized_and_grokked_are_first_crossings():
  ep = [0, 100, 200, 300]
  assert grok_config.memorized_epoch(ep, [0.0, 0.5, 0.99, 1.0]) == 200
  assert grok_config.memorized_epoch(ep, [0.0, 0.5, 0.989, 0.98]) is None
  assert grok_config.grokked_epoch(ep, [0.0, 0.96, 0.1, 0.2]) == 100  # a spike counts
  assert grok_config.grokked_epoch(ep, [0.0, 0.949, 0.1, 0.2]) is None


def test_sustained_needs_k_consecutive_evaluations():
  ep = [0, 100, 200, 300, 400, 500, 600]
  acc = [0.0, 0.96, 0.97, 0.5, 0.95, 0.96, 0.99]
  assert grok_config.grokked_epoch(ep, acc) == 100
  assert grok_config.sustained_epoch(ep, acc, k=3) == 400  # the 100-200 run is only 2 long
  assert grok_config.sustained_epoch(ep, acc, k=2) == 100
  assert grok_config.sustained_epoch(ep, acc, k=4) is None
  assert grok_config.sustained_epoch(ep[:6], acc[:6], k=3) is None  # run ends at 2
  with pytest.raises(ValueError, match="k=0"):
    grok_config.sustained_epoch(ep, acc, k=0)


def test_tail_mean_is_the_final_quarter():
  ep = list(range(0, 20_001, 100))
  acc = [0.0] * len(ep)
  for i, e in enumerate(ep):
    if e >= 15_000:
      acc[i] = 1.0
  assert grok_config.tail_mean(ep, acc) == 1.0  # exactly epochs 15 000-20 000
  acc[ep.index(14_900)] = 1.0
  acc[ep.index(15_000)] = 0.0
  assert grok_config.tail_mean(ep, acc) == pytest.approx(50 / 51)
  assert grok_config.tail_mean(ep, acc, fraction=1.0) == pytest.approx(51 / 201)


def test_run_metrics_from_history():
  h = {
    "epoch": [0, 10, 20, 30, 40],
    "train_acc": [0.0, 1.0, 0.2, 1.0, 1.0],
    "test_acc": [0.0, 0.0, 0.95, 0.96, 0.97],
    "isometry": [0.3, 0.5, 0.2, 0.4, 0.1],
  }
  m = grok_config.run_metrics(h, dataclasses.replace(TINY, epochs=40, eval_every=10))
  assert (m["memorized_epoch"], m["grokked_epoch"], m["sustained_epoch"]) == (10, 20, 20)
  assert m["end_test_acc"] == 0.97 and m["end_train_acc"] == 1.0
  assert m["tail_test_acc"] == pytest.approx((0.96 + 0.97) / 2)
  assert (m["initial_isometry"], m["final_isometry"], m["max_isometry"]) == (0.3, 0.1, 0.5)
  assert m["max_isometry_after_init"] == 0.5


# ----------------------------------------------------------------------------
# The paper's model, data split and arms (no training).
# ----------------------------------------------------------------------------


def test_paper_model_and_split_shapes():
  cfg = grok_config.PAPER
  data = grok_data.make_data(cfg, seed=0)
  assert data["x_train"].shape == (3764, 3) and data["x_test"].shape == (5645, 3)
  pairs = {tuple(r) for r in np.concatenate([data["x_train"], data["x_test"]])[:, :2]}
  assert len(pairs) == 97 * 97
  assert np.all(data["x_train"][:, 2] == 97)  # the "=" token
  assert np.array_equal(data["y_train"], (data["x_train"][:, 0] + data["x_train"][:, 1]) % 97)
  other = grok_data.make_data(cfg, seed=1)
  assert not np.array_equal(other["x_train"], data["x_train"])  # split follows the seed

  params = jax.eval_shape(lambda: grok_training.init_params(cfg, grok_config.ARMS["A2"], 0))
  p = params["params"]
  assert p["token_embed"]["embedding"].shape == (98, 128)
  assert p["pos_embed"]["embedding"].shape == (3, 128)
  for i in range(2):
    attn = p[f"block_{i}"]["attn"]
    assert attn["query"]["kernel"].shape == (128, 4, 32)
    assert attn["key"]["kernel"].shape == (128, 4, 32)
    assert p[f"block_{i}"]["ffn_in"]["kernel"].shape == (128, 512)
  assert "block_2" not in p
  assert p["readout_hidden"]["kernel"].shape == (3 * 128, 128)
  assert p["readout_out"]["kernel"].shape == (128, 97)
  labels = jax.tree.leaves(stiefax.layouts.qk_labels(params))
  assert labels.count("stiefel") == 4


def test_arms_share_circuit_init_and_differ_in_frames():
  a2 = grok_training.init_params(TINY, grok_config.ARMS["A2"], 3)
  b2 = grok_training.init_params(TINY, grok_config.ARMS["B2"], 3)
  sn = grok_training.init_params(TINY, grok_config.ARMS["B2-sn"], 3)
  labels = stiefax.layouts.qk_labels(a2)
  for lab, x, y, z in zip(*(jax.tree.leaves(t) for t in (labels, a2, b2, sn))):
    if lab == "stiefel":
      assert not np.allclose(x, y)  # B2 snapped onto the manifold, A2 not
      np.testing.assert_allclose(y, z)
    else:
      np.testing.assert_array_equal(x, y)
      scale = 0.1 if x.ndim >= 2 else 1.0
      np.testing.assert_allclose(z, scale * np.asarray(x), rtol=1e-6)
  assert float(stiefax.diagnostics.isometry_error(b2, stiefax.layouts.qk_labels)) < 2e-6
  assert float(stiefax.diagnostics.isometry_error(a2, stiefax.layouts.qk_labels)) > 1e-2
  other_seed = grok_training.init_params(TINY, grok_config.ARMS["A2"], 4)
  emb = lambda p: p["params"]["token_embed"]["embedding"]
  assert not np.allclose(emb(other_seed), emb(a2))


def _first_update(config, arm, grad_value):
  params = kernels.toy_params()
  tx = optim.make_optimizer(grok_config.ARMS[arm], grok_config.hyper(grok_config.ARMS[arm], config))
  grads = jax.tree.map(lambda w: jax.numpy.full_like(w, grad_value), params)
  updates, _ = tx.update(grads, tx.init(params), params)
  return params["params"], updates["params"]


# Zero gradient: only decoupled decay moves a parameter, by -lr * decay * w.
# (frame decay, circuit decay) per arm; None: the frames stay on the manifold.
_DECAY = {
  "A2": (1.0, 1.0),
  "B2": (None, 1.0),
  "B2m": (None, 1.0),
  "B2m-can": (None, 1.0),
  "B2-frz": (0.0, 1.0),
  "A2-nwf": (0.0, 1.0),
  "B2-hi": (None, 2.0),
  "B2-sn": (None, 1.0),
  "B2-comb": (None, 2.0),
  "B2-mmuon": (None, 1.0),
  "B2-qr": (None, 1.0),
  "B2-cayley": (None, 1.0),
  # Muon decays at its own rate: -MUON_LR * decay * w.
  "A2-muon": (grok_config.MUON_LR / TINY.learning_rate, 1.0),
  # The attention arms train the frames as A2 and B2 do.
  "A2-qknorm": (1.0, 1.0),
  "A2-sigma": (1.0, 1.0),
  "B2-qknorm": (None, 1.0),
}


@pytest.mark.parametrize("arm", list(grok_config.ARMS))
def test_arm_decay_and_frame_rules(arm):
  assert set(_DECAY) == set(grok_config.ARMS)
  lr = TINY.learning_rate
  frame_decay, circuit_decay = _DECAY[arm]
  w, u = _first_update(TINY, arm, 0.0)
  np.testing.assert_allclose(
    u["dense"]["kernel"], -lr * circuit_decay * w["dense"]["kernel"], rtol=1e-5, atol=1e-8
  )
  np.testing.assert_allclose(u["dense"]["bias"], 0.0, atol=1e-8)  # no decay on vectors
  for name in ("query", "key"):
    got = u["attn"][name]["kernel"]
    if frame_decay is None:
      assert float(np.abs(got).max()) < 1e-5  # decay cannot act on St(d, r)
    else:
      np.testing.assert_allclose(
        got, -lr * frame_decay * w["attn"][name]["kernel"], rtol=1e-5, atol=1e-8
      )
  # A nonzero gradient moves the frames in every arm but B2-frz, and keeps B2's on St.
  w, u = _first_update(TINY, arm, 0.1)
  moves = [float(np.abs(u["attn"][n]["kernel"]).max()) for n in ("query", "key")]
  assert (max(moves) == 0.0) if arm == "B2-frz" else (min(moves) > 1e-4)
  if frame_decay is None:
    new = jax.tree.map(lambda a, b: a + b, w, u)
    assert float(stiefax.diagnostics.isometry_error(new["attn"]["query"]["kernel"])) < 1e-5


def test_stabilize_sets_power_et_al():
  parser, parsers = cli.build_parser()
  grok_command.add_arguments(parsers["grok"][0])
  args = parser.parse_args(["grok", "--stabilize", "--arms", "B2"])
  cfg, arms, seeds = grok_command.resolve_config(args)
  assert (cfg.b2, cfg.warmup, arms, seeds) == (0.98, 10, ["B2"], [0])

  def largest_first_step(c):
    _, u = _first_update(c, "B2", 1.0)
    return max(float(np.abs(x).max()) for x in jax.tree.leaves(u))

  assert largest_first_step(cfg) < 1e-5  # the warm-up starts every rate at 0
  assert largest_first_step(dataclasses.replace(cfg, warmup=0)) > 1e-4
  args = parser.parse_args(["grok", "--preset", "paper"])
  assert grok_command.resolve_config(args)[0] == grok_config.PAPER


def test_frame_lr_sets_the_riemannian_rate_and_its_run_command_reruns_it():
  parser, parsers = cli.build_parser()
  grok_command.add_arguments(parsers["grok"][0])
  cfg, _, _ = grok_command.resolve_config(parser.parse_args(["grok", "--frame-lr", "0.3"]))
  quick = grok_config.QUICK
  assert cfg == dataclasses.replace(quick, frame_lr=0.3)
  assert grok_runs.run_identity(cfg, "B2", "quick")["riemannian_lr"] == 0.3
  name = grok_runs.run_file_name(cfg, "B2", 0, "quick")
  assert name != grok_runs.run_file_name(quick, "B2", 0, "quick")
  command = grok_runs.run_command(cfg, "B2", 0, "quick", False, "runs/grok")
  assert "--frame-lr 0.3 " in command
  again, _, _ = grok_command.resolve_config(parser.parse_args(command.split()[1:]))
  assert grok_runs.run_file_name(again, "B2", 0, "quick") == name
  # The preset's own rate is left out of the command, as before the flag existed.
  assert "--frame-lr" not in grok_runs.run_command(quick, "B2", 0, "quick", False, "o")
  # B2's frames move by the rate given: twice the rate, twice the first step.
  _, u1 = _first_update(dataclasses.replace(quick, warmup=0, frame_lr=0.01), "B2", 1.0)
  _, u2 = _first_update(dataclasses.replace(quick, warmup=0, frame_lr=0.02), "B2", 1.0)
  k1, k2 = (np.abs(u["attn"]["query"]["kernel"]).max() for u in (u1, u2))
  np.testing.assert_allclose(k2, 2 * k1, rtol=0.05)


# ----------------------------------------------------------------------------
# The command line, end to end.
# ----------------------------------------------------------------------------


def test_cli_writes_one_json_per_run(tiny_runs, capsys):
  files = sorted(p.name for p in tiny_runs.iterdir())
  assert files == sorted(grok_runs.run_file_name(TINY, a, 0, "tiny") for a in ("A2", "B2"))
  assert files[0].startswith("A2-tiny-e80-") and files[0].endswith("-s0.json")
  for arm in ("A2", "B2"):
    r = _load(tiny_runs, arm)
    assert set(r) >= {"experiment", "arm", "seed", "config", "metrics", "history", "wall_time"}
    assert (r["experiment"], r["arm"], r["seed"]) == ("grok", arm, 0)
    assert r["config"]["epochs"] == 80 and r["config"]["modulus"] == 23
    assert r["config"]["n_train"] == round(0.4 * 23 * 23)
    h = r["history"]
    assert h["epoch"] == [0, 20, 40, 60, 80]
    for k in ("train_acc", "test_acc", "train_loss", "isometry"):
      assert len(h[k]) == 5 and all(np.isfinite(h[k]))
    assert h["train_loss"][-1] < h["train_loss"][0]
    assert r["metrics"]["memorized_epoch"] is not None  # the tiny task memorizes
    assert r["metrics"]["end_test_acc"] == h["test_acc"][-1]
    assert r["wall_time"] > 0
    assert r["run_id"] in files[0 if arm == "A2" else 1]
    assert r["command"].startswith(
      f"stiefax grok --preset tiny --epochs 80 --eval-every 20 --arms {arm} --seeds 0"
    )
    assert r["code"]["version"] == stiefax.__version__


def test_cli_isometry_contrast(tiny_runs):
  a2, b2 = _load(tiny_runs, "A2")["history"], _load(tiny_runs, "B2")["history"]
  assert max(b2["isometry"]) <= 2e-5
  assert max(b2["isometry_key"]) <= 2e-5
  assert min(a2["isometry"]) > 1e-2
  assert a2["isometry"][-1] > a2["isometry"][0] + 1e-2  # A2's frames drift further


def test_cli_records_the_effective_learning_rate(tiny_runs):
  a2, b2 = _load(tiny_runs, "A2")["history"], _load(tiny_runs, "B2")["history"]
  for h in (a2, b2):
    for group in ("frames", "matrices", "vectors"):
      assert len(h[f"elr_{group}"]) == len(h["epoch"]) - 1  # one per chunk of updates
  # B2's frame steps are capped at tau sqrt(r) on frames of norm sqrt(r): ELR <= tau.
  assert 0 < max(b2["elr_frames"]) <= 0.1 * 1.01
  assert max(a2["elr_frames"]) > 0


def test_report_prints_tables_and_writes_pngs(tiny_runs, tmp_path, capsys):
  plots = tmp_path / "plots"
  assert cli.main(["report", str(tiny_runs), "--plots", str(plots)]) == 0
  text = capsys.readouterr().out
  assert "Grokking, c = (a + b) mod 23" in text
  lines = {}
  for ln in text.splitlines():
    if ln.split():
      lines.setdefault(ln.split()[0], ln)  # the first table's rows
  assert lines["A2"].split()[1:3] == ["1", "1/1"]  # n, memorized k/n
  assert lines["B2"].split()[1:3] == ["1", "1/1"]
  assert "needs >= 2 seeds shared with A2" in text
  for name in ("grok_accuracy.png", "grok_isometry.png", "grok_elr.png"):
    data = (plots / name).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_the_committed_runs_are_finished_and_the_docs_quote_their_report():
  """Every run in ``results/grok`` is a finished run of the paper's configuration (or
  its stabilized setting) of a Table 4 arm or of a study arm (``STUDIES``: runs (a),
  (b), Table 5), at most one per arm, seed and setting, and every line of the tables
  ``stiefax report results/grok`` prints from them is in docs/reproduction.md."""
  from stiefax.experiments import report as report_lib  # pylint: disable=g-import-not-at-top
  from stiefax.experiments.grok import tables  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).parent.parent
  groups, warnings = report_lib.load_runs(root / "results/grok")
  assert warnings == [] and list(groups) == ["grok"]
  runs = groups["grok"]
  paper = grok_config.PRESETS["paper"]["config"]
  stabilized = dataclasses.replace(paper, **grok_config.STABILIZED)
  studied = {arm for study in grok_config.STUDIES for arm in study.arms}
  assert {r["arm"] for r in runs} <= {"A2", "B2", "B2-frz", "B2m", "B2m-can"} | studied
  setting = lambda r: bool(r["config"]["stabilize"])
  assert len({(r["arm"], r["seed"], setting(r)) for r in runs}) == len(runs)
  for r in runs:
    config = stabilized if setting(r) else paper
    assert grok_runs.record_identity(r) == grok_runs.run_identity(config, r["arm"], "paper")
    assert r["config"]["epochs"] == paper.epochs == r["history"]["epoch"][-1], r["arm"]
  doc = (root / "docs/reproduction.md").read_text()
  text = columns.fit(tables.report(runs, None))  # the tables in parts of 80 characters
  missing = [ln for ln in text.splitlines() if ln.strip() and ln not in doc]
  assert missing == [], missing


def test_report_paired_differences_with_two_seeds(tiny_runs, tmp_path, capsys):
  """A second seed (copied runs with shifted tails) turns on the paired table."""
  d = tmp_path / "runs"
  d.mkdir()
  for arm, shift in (("A2", 0.0), ("B2", 0.1)):
    base = _load(tiny_runs, arm)
    for seed, extra in ((0, 0.0), (1, 0.05)):
      r = json.loads(json.dumps(base))
      r["seed"] = seed
      r["metrics"]["tail_test_acc"] = 0.5 + shift + extra * (arm == "B2")
      (d / f"{arm}_{seed}.json").write_text(json.dumps(r))
  (d / "notes.json").write_text(json.dumps({"no": "experiment"}))  # not a run: skipped
  assert cli.main(["report", str(d)]) == 0
  text = capsys.readouterr().out
  row = next(ln for ln in text.splitlines() if ln.startswith("B2 ") and "/2" in ln and "[" in ln)
  parts = row.split()
  assert parts[1] == "2" and float(parts[2]) == pytest.approx(12.5)  # mean of 10, 15 pp
  assert parts[5] == "2/2"  # wins
  assert "[" in parts[6] and row.endswith("not settled")  # t interval; 2 seeds settle nothing


def test_report_skips_damaged_runs_and_counts_duplicates_once(tiny_runs, tmp_path, capsys):
  d = tmp_path / "runs"
  d.mkdir()
  good = {p.name: p.read_text() for p in tiny_runs.glob("*.json")}
  for name, text in good.items():
    (d / name).write_text(text)
  a2 = next(n for n in good if n.startswith("A2"))
  (d / "copy.json").write_text(good[a2])  # the same run again
  (d / "truncated.json").write_text(good[a2][: len(good[a2]) // 2])
  broken = json.loads(good[a2])
  del broken["history"]
  broken["seed"] = 7
  (d / "nohistory.json").write_text(json.dumps(broken))
  broken = json.loads(good[a2])
  del broken["metrics"]["tail_test_acc"]
  broken["seed"] = 8
  (d / "nometric.json").write_text(json.dumps(broken))
  assert cli.main(["report", str(d)]) == 0
  out, err = capsys.readouterr()
  warnings = err.strip().splitlines()
  assert len(warnings) == 3 and "Traceback" not in err
  by_file = {w.split("skipped ")[1].split(":")[0]: w for w in warnings}
  assert "not readable JSON" in by_file[str(d / "truncated.json")]
  assert "lacks the field 'history'" in by_file[str(d / "nohistory.json")]
  assert "lacks the metric 'tail_test_acc'" in by_file[str(d / "nometric.json")]
  # The copy is left out of the tables and set against its first copy as a rerun.
  assert "reruns: runs found twice" in out
  rerun = [ln for ln in out.splitlines() if ln.startswith("grok ")]
  assert len(rerun) == 1 and ("copy.json" in rerun[0] or a2 in rerun[0]) and "+0" in rerun[0]
  rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.split()}
  assert rows["A2"][1] == "1" and rows["B2"][1] == "1"  # one run each, the copy not counted


def test_report_dispatches_by_experiment(tmp_path, capsys):
  d = tmp_path / "r" / "nested"
  d.mkdir(parents=True)
  (d / "x.json").write_text(json.dumps({"experiment": "nonexistent_thing", "arm": "A"}))
  assert cli.main(["report", str(tmp_path / "r")]) == 0
  assert "nonexistent_thing: 1 run(s); no report" in capsys.readouterr().out


@pytest.mark.slow
def test_budgets_get_their_own_files_and_reruns_skip_finished_runs(
  tmp_path, tiny_preset, capsys, monkeypatch
):
  out = tmp_path / "R"
  base = [
    "grok",
    "--preset",
    tiny_preset,
    "--eval-every",
    "20",
    "--arms",
    "A2",
    "--seeds",
    "0",
    "--out",
    str(out),
  ]
  assert cli.main(base + ["--epochs", "40"]) == 0
  first = {p.name: p.read_bytes() for p in out.iterdir()}
  assert cli.main(base + ["--epochs", "20"]) == 0
  files = sorted(p.name for p in out.iterdir())
  assert len(files) == 2 and {f.split("-")[2] for f in files} == {"e20", "e40"}
  assert all((out / f).read_bytes() == b for f, b in first.items())  # not overwritten
  for f in files:
    r = json.loads((out / f).read_text())
    assert r["history"]["epoch"][-1] == int(f.split("-")[2][1:])
  capsys.readouterr()

  def no_training(*a, **k):
    raise AssertionError("a finished run was trained again")

  monkeypatch.setattr(grok_training, "train_seeds", no_training)
  assert cli.main(base + ["--epochs", "20"]) == 0
  assert "finished already" in capsys.readouterr().out
  assert sorted(p.name for p in out.iterdir()) == files

  assert cli.main(["report", str(out)]) == 0
  text = capsys.readouterr().out
  assert "[preset=tiny epochs=20 eval_every=20]: 1 run(s)" in text
  assert "[preset=tiny epochs=40 eval_every=20]: 1 run(s)" in text


def _assert_same_history(resumed: dict, whole: dict) -> None:
  """A resumed run's history is the uninterrupted run's, to float32 rounding."""
  for k, v in whole["history"].items():
    np.testing.assert_allclose(resumed["history"][k], v, rtol=1e-6, atol=1e-7, err_msg=k)


def _counting_chunks(monkeypatch, interrupt_at=None, exc=None):
  """Counts ``train_chunk`` calls; at call ``interrupt_at`` sends SIGINT or raises ``exc``."""
  import signal  # pylint: disable=g-import-not-at-top

  calls = []
  programs = grok_training.programs

  def wrapped(*key):
    init, chunk, evaluate = programs(*key)

    def counted(*a):
      calls.append(1)
      if len(calls) == interrupt_at:
        if exc is not None:
          raise exc
        signal.raise_signal(signal.SIGINT)  # a real Ctrl-C, during the evaluation window
      return chunk(*a)

    return init, counted, evaluate

  monkeypatch.setattr(grok_training, "programs", wrapped)
  return calls


@pytest.mark.slow
def test_sigint_leaves_a_run_that_resumes_to_the_same_result(
  tiny_runs, tmp_path, tiny_preset, monkeypatch, capsys
):
  out = tmp_path / "R"
  argv = [
    "grok",
    *("--preset", tiny_preset),
    *("--arms", "A2"),
    *("--seeds", "0"),
    *("--checkpoint-every", "0"),
    *("--out", str(out)),
  ]
  calls = _counting_chunks(monkeypatch, interrupt_at=2)
  assert cli.main(argv) == 130  # stopped after the 2nd of 4 evaluation windows
  err = capsys.readouterr().err
  assert "stopped A2 seed 0 at epoch 40; checkpoint at epoch 40" in err
  name = grok_runs.run_file_name(TINY, "A2", 0, "tiny")
  assert not (out / name).exists() and (out / name).with_suffix(".ckpt").is_dir()
  assert not (out / name).with_suffix(".lock").exists()
  calls = _counting_chunks(monkeypatch)  # no interruption this time
  assert cli.main(argv) == 0
  assert "resuming from the checkpoint at epoch 40" in capsys.readouterr().out
  assert len(calls) == 2  # epochs 40-80 only: resumed, not retrained
  resumed, whole = json.loads((out / name).read_text()), _load(tiny_runs, "A2")
  assert resumed["resumed_from"] == 40 and whole["resumed_from"] is None
  assert sorted(p.name for p in out.iterdir()) == [name]  # checkpoint removed when done
  _assert_same_history(resumed, whole)
  for k, v in whole["metrics"].items():
    assert resumed["metrics"][k] == (
      v if v is None or isinstance(v, int) else pytest.approx(v, rel=1e-6)
    ), k


@pytest.mark.slow
def test_a_crashed_run_resumes_from_its_last_periodic_checkpoint(
  tiny_runs, tmp_path, tiny_preset, monkeypatch
):
  out = tmp_path / "R"
  argv = [
    "grok",
    *("--preset", tiny_preset),
    *("--arms", "B2"),
    *("--seeds", "0"),
    *("--checkpoint-every", "30"),
    *("--out", str(out)),
  ]  # rounded up to 40
  _counting_chunks(monkeypatch, interrupt_at=4, exc=RuntimeError("power cut"))
  with pytest.raises(RuntimeError, match="power cut"):
    cli.main(argv)  # dies in the last window: no checkpoint saved on the way out
  calls = _counting_chunks(monkeypatch)
  assert cli.main(argv) == 0
  assert len(calls) == 2
  resumed, whole = _load(out, "B2"), _load(tiny_runs, "B2")
  assert resumed["resumed_from"] == 40
  _assert_same_history(resumed, whole)


@pytest.mark.slow
def test_vmapped_seeds_match_separate_runs_and_resume(
  tiny_runs, tmp_path, tiny_preset, monkeypatch, capsys
):
  out = tmp_path / "R"
  argv = [
    "grok",
    *("--preset", tiny_preset),
    *("--arms", "A2"),
    *("--seeds", "0,1"),
    "--vmap-seeds",
    *("--checkpoint-every", "0"),
    *("--out", str(out)),
  ]
  calls = _counting_chunks(monkeypatch, interrupt_at=2)
  assert cli.main(argv) == 130
  assert len(calls) == 2  # one program call per window for both seeds
  calls = _counting_chunks(monkeypatch)
  assert cli.main(argv) == 0
  assert "A2 seeds 0,1: resuming from the checkpoint at epoch 40" in capsys.readouterr().out
  assert len(calls) == 2
  runs = [_load(out, "A2", s) for s in (0, 1)]
  whole = _load(tiny_runs, "A2")
  for r in runs:
    assert r["vmapped_seeds"] == [0, 1] and r["resumed_from"] == 40
  n_test = whole["config"]["n_test"]
  h, ref = runs[0]["history"], whole["history"]
  assert h["epoch"] == ref["epoch"]
  for k in ("train_acc", "test_acc"):  # an argmax may flip on rounding: 1 example
    np.testing.assert_allclose(h[k], ref[k], atol=1.5 / n_test, err_msg=k)
  # Batched matmuls round differently; 80 steps of training amplify it to ~0.2% in the
  # loss. Adam turns rounding-level gradients into full-size steps, so the effective
  # learning rate (a ratio of norms of those steps) agrees to a few percent.
  for k in ("train_loss", "isometry", "isometry_key"):
    np.testing.assert_allclose(h[k], ref[k], rtol=1e-2, atol=1e-6, err_msg=k)
  for k in ("elr_frames", "elr_matrices", "elr_vectors"):
    np.testing.assert_allclose(h[k], ref[k], rtol=0.1, err_msg=k)
  np.testing.assert_allclose(h["train_loss"][:2], ref["train_loss"][:2], rtol=1e-5)
  assert not np.allclose(runs[1]["history"]["train_loss"], h["train_loss"])  # its own seed


# ----------------------------------------------------------------------------
# The attention arms: QK-norm and sigmaReparam (stiefax.experiments.attention).
# ----------------------------------------------------------------------------

_ATTENTION_ARMS = ("A2-qknorm", "A2-sigma", "B2-qknorm")


@pytest.fixture(scope="module")
def attention_runs(tmp_path_factory):
  """`stiefax grok --preset tiny --arms A2-qknorm,A2-sigma,B2-qknorm --seeds 0`."""
  out = tmp_path_factory.mktemp("grok-attention")
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(grok_config.PRESETS, "tiny", dict(config=TINY, arms=("A2", "B2"), seeds=(0,)))
    argv = ["grok", "--preset", "tiny", "--arms", ",".join(_ATTENTION_ARMS), "--seeds", "0"]
    assert cli.main([*argv, "--out", str(out)]) == 0
  return out


def test_attention_arms_are_offered_and_recorded():
  for name in _ATTENTION_ARMS:
    assert name in grok_config.ARMS and name in grok_command.help_text()
    definition = grok_runs.arm_definition(grok_config.ARMS[name])
    assert definition["attention"] == grok_config.ARMS[name].attention != "plain"
  for name, arm in grok_config.ARMS.items():  # the plain arms' identities predate the field
    if arm.attention == "plain":
      assert "attention" not in grok_runs.arm_definition(arm), name
  for preset in grok_config.PRESETS.values():
    assert not set(preset["arms"]) & set(_ATTENTION_ARMS)
  assert grok_model.make_model(TINY) is grok_model.make_model(TINY, "plain")


def test_attention_arms_share_the_circuit_init():
  """The same seed gives every arm the same weights; the variants only add their own."""
  flat = lambda t: {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(t)}
  a2 = flat(grok_training.init_params(TINY, grok_config.ARMS["A2"], 3))
  for name, extra in (
    ("A2-qknorm", {"query_ln", "key_ln"}),
    ("A2-sigma", {"gamma", "sigma_reparam"}),
  ):
    got = flat(grok_training.init_params(TINY, grok_config.ARMS[name], 3))
    for k, v in a2.items():
      np.testing.assert_array_equal(got[k], v, err_msg=f"{name} {k}")
    added = set(got) - set(a2)
    assert added and all(any(e in k for e in extra) for k in added), (name, added)


@pytest.mark.slow  # its module fixture trains three arms: about 110 s of a loaded core
def test_attention_arms_run_end_to_end(attention_runs, tiny_runs):
  for name in _ATTENTION_ARMS:
    r = _load(attention_runs, name)
    assert r["config"]["arm"]["attention"] == grok_config.ARMS[name].attention
    assert name in r["command"] and r["run_id"] in grok_runs.run_file_name(TINY, name, 0, "tiny")
    h = r["history"]
    assert h["epoch"] == [0, 20, 40, 60, 80]
    for k in ("train_acc", "test_acc", "train_loss", "isometry", "max_logit", "attn_entropy"):
      assert len(h[k]) == 5 and all(np.isfinite(h[k])), (name, k)
    assert h["train_loss"][-1] < h["train_loss"][0]
    assert r["metrics"]["memorized_epoch"] is not None, name
    assert min(h["max_logit"]) > 0 and min(h["attn_entropy"]) > 0
    assert max(h["attn_entropy"]) <= np.log(3) + 1e-6  # three positions to attend to
    assert r["metrics"]["max_logit_max"] == max(h["max_logit"])
  b2qk, a2qk = (_load(attention_runs, a)["history"] for a in ("B2-qknorm", "A2-qknorm"))
  assert max(b2qk["isometry"]) <= 2e-5 and max(b2qk["isometry_key"]) <= 2e-5  # on St
  assert min(a2qk["isometry"]) > 1e-2
  # The plain arms record the probe as well; their parameter counts leave no state out.
  a2, sigma = _load(tiny_runs, "A2"), _load(attention_runs, "A2-sigma")
  assert len(a2["history"]["max_logit"]) == 5
  assert sigma["config"]["n_params"] == a2["config"]["n_params"] + 2  # the two gammas


def test_sigma_state_advances_each_step_and_evaluation_reads_it():
  from stiefax.experiments import attention  # pylint: disable=g-import-not-at-top

  arm = grok_config.ARMS["A2-sigma"]
  params = grok_training.init_params(TINY, arm, 0)
  u0 = params[attention.SIGMA_COLLECTION]["block_0"]["attn"]
  assert set(u0) == {"query", "key"} and u0["query"]["u"].shape == (TINY.d_model,)
  data = {k: jax.numpy.asarray(v) for k, v in grok_data.make_data(TINY, 0).items()}
  init, chunk, evaluate = grok_training.programs(TINY, arm, False, False)
  new, _, ev = chunk(params, init(params), data)
  u1 = new[attention.SIGMA_COLLECTION]["block_0"]["attn"]
  for name in ("query", "key"):
    assert not np.allclose(u1[name]["u"], u0[name]["u"])  # advanced by the steps
    assert np.linalg.norm(u1[name]["u"]) == pytest.approx(1.0, rel=1e-5)
    w = np.asarray(new["params"]["block_0"]["attn"][name]["kernel"])
    w2d = w.reshape(w.shape[0], -1)
    sigma, _ = attention.spectral_norm_step(jax.numpy.asarray(w2d), u1[name]["u"])
    top = np.linalg.svd(w2d, compute_uv=False)[0]
    assert float(sigma) == pytest.approx(top, rel=0.1)  # one power step a step: it lags
  assert float(evaluate(new, data)["train_loss"]) == pytest.approx(float(ev["train_loss"]))
  stale = {
    **new,
    attention.SIGMA_COLLECTION: jax.tree.map(
      lambda u: jax.numpy.ones_like(u) / np.sqrt(u.size), new[attention.SIGMA_COLLECTION]
    ),
  }
  assert float(evaluate(stale, data)["train_loss"]) != float(ev["train_loss"])  # it reads u


@pytest.mark.slow
def test_a_sigma_run_resumes_to_the_uninterrupted_result(
  attention_runs, tmp_path, tiny_preset, monkeypatch, capsys
):
  out = tmp_path / "R"
  argv = ["grok", "--preset", tiny_preset, "--arms", "A2-sigma", "--seeds", "0"]
  argv += ["--checkpoint-every", "0", "--out", str(out)]
  calls = _counting_chunks(monkeypatch, interrupt_at=2)
  assert cli.main(argv) == 130  # stopped after the 2nd of 4 evaluation windows
  assert "checkpoint at epoch 40" in capsys.readouterr().err
  calls = _counting_chunks(monkeypatch)
  assert cli.main(argv) == 0
  assert "resuming from the checkpoint at epoch 40" in capsys.readouterr().out
  assert len(calls) == 2
  resumed, whole = _load(out, "A2-sigma"), _load(attention_runs, "A2-sigma")
  assert resumed["resumed_from"] == 40 and whole["resumed_from"] is None
  assert set(resumed["history"]) == set(whole["history"])
  for k, v in whole["history"].items():  # the same programs on the same arrays, u included
    np.testing.assert_array_equal(resumed["history"][k], v, err_msg=k)


@pytest.mark.slow
def test_sigma_seeds_vmapped_match_separate_runs(attention_runs):
  config = dataclasses.replace(TINY, epochs=40)
  runs = grok_training.train_seeds(config, "A2-sigma", [0, 1], progress=False, vmap=True)
  ref = _load(attention_runs, "A2-sigma")["history"]
  h = runs[0]["history"]
  assert h["epoch"] == ref["epoch"][:3]
  for k in ("train_loss", "isometry", "max_logit", "attn_entropy"):  # batched rounding
    np.testing.assert_allclose(h[k], ref[k][:3], rtol=1e-2, atol=1e-6, err_msg=k)
  assert not np.allclose(runs[1]["history"]["train_loss"], h["train_loss"])


def test_every_setting_changes_the_file_name():
  names = {grok_runs.run_file_name(TINY, "A2", 0, "tiny")}
  for change in (
    dict(epochs=100),
    dict(learning_rate=2e-2),
    dict(b2=0.98),
    dict(modulus=29),
    dict(sustain_k=2),
  ):
    names.add(grok_runs.run_file_name(dataclasses.replace(TINY, **change), "A2", 0, "tiny"))
  names |= {
    grok_runs.run_file_name(TINY, "B2", 0, "tiny"),
    grok_runs.run_file_name(TINY, "A2", 1, "tiny"),
    grok_runs.run_file_name(TINY, "A2", 0, "quick"),
  }
  assert len(names) == 9


_SCRIPT = """
import sys
from stiefax.experiments import cli
from stiefax.experiments.grok import config as grok_config
from tests.harness import TINY_GROK
grok_config.PRESETS["tiny"] = dict(config=TINY_GROK, arms=("A2", "B2"), seeds=(0,))
sys.exit(cli.main(sys.argv[1:]))
"""


def _stiefax_process(tmp_path, *argv):
  """``stiefax`` with the tiny preset, as a separate process."""
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).resolve().parent.parent
  script = tmp_path / "stiefax_tiny.py"
  script.write_text(_SCRIPT)
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join(
      [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    ),
    JAX_PLATFORMS="cpu",
  )
  return subprocess.Popen(
    [sys.executable, str(script), *argv],
    cwd=root,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


@pytest.mark.slow
def test_two_processes_on_one_out_keep_every_run(tmp_path):
  out = tmp_path / "R"
  argv = [
    "grok",
    *("--preset", "tiny"),
    *("--epochs", "40"),
    *("--eval-every", "20"),
    *("--arms", "A2"),
    *("--seeds", "0,1,2,3"),
    *("--out", str(out)),
  ]
  procs = [_stiefax_process(tmp_path, *argv) for _ in range(2)]
  logs = [p.communicate(timeout=600)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], logs
  names = sorted(
    grok_runs.run_file_name(dataclasses.replace(TINY, epochs=40), a, s, "tiny")
    for a in ("A2",)
    for s in range(4)
  )
  assert sorted(p.name for p in out.iterdir()) == names  # no temporary or lock files left
  for name in names:
    r = json.loads((out / name).read_text())
    assert r["history"]["epoch"] == [0, 20, 40]
    assert name.startswith(r["arm"] + "-") and name.endswith(f"-s{r['seed']}.json")
    assert r["run_id"] in name
  skipped = sum(log.count("finished already") for log in logs)
  assert skipped >= 4  # each run trained by one process; the other reads it
  for log in logs:  # both summaries list every run
    rows = [ln.split()[:2] for ln in log.splitlines() if re.match(r"A2 +\d+ ", ln)]
    assert sorted(rows) == [["A2", str(s)] for s in range(4)], log


def test_quick_preset_keeps_the_paper_model_family():
  changed = {
    f.name
    for f in dataclasses.fields(grok_config.GrokConfig)
    if getattr(grok_config.QUICK, f.name) != getattr(grok_config.PAPER, f.name)
  }
  assert changed == {
    "modulus",
    "train_fraction",
    "weight_decay",
    "b2",
    "warmup",
    "epochs",
    "eval_every",
  }
  assert (grok_config.QUICK.b2, grok_config.QUICK.warmup) == (
    0.98,
    10,
  )  # Power et al., as --stabilize
  assert grok_config.PRESETS["quick"]["config"] == grok_config.QUICK


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_acceptance_plain_grok_shows_grokking_and_the_isometry_contrast(tmp_path, capsys):
  """Plain `stiefax grok`: both arms memorize, A2 groks, B2 stays on the manifold."""
  out = tmp_path / "grok"
  assert cli.main(["grok", "--out", str(out)]) == 0
  text = capsys.readouterr().out
  a2, b2 = (
    json.loads((out / grok_runs.run_file_name(grok_config.QUICK, arm, 0, "quick")).read_text())
    for arm in ("A2", "B2")
  )
  assert a2["config"]["d_model"] == 128 and a2["config"]["num_layers"] == 2
  assert a2["metrics"]["memorized_epoch"] is not None
  assert b2["metrics"]["memorized_epoch"] is not None
  assert a2["metrics"]["grokked_epoch"] is not None
  assert max(a2["history"]["test_acc"]) >= 0.95
  assert max(b2["history"]["isometry"]) <= 2e-5
  assert a2["metrics"]["final_isometry"] > 1e-2
  assert "A2 seed 0: memorized (train accuracy >= 0.99) at epoch" in text
  assert "grokked (held-out accuracy >= 0.95) at epoch" in text


def test_report_counts_collapses_and_runs_ending_in_one(tiny_runs, tmp_path, capsys):
  d = tmp_path / "runs"
  d.mkdir()
  for arm, pattern in (("A2", [0.0, 1.0, 0.3, 1.0, 0.5]), ("B2", [0.0, 0.5, 1.0, 1.0, 1.0])):
    r = _load(tiny_runs, arm)
    h = r["history"]
    n = len(h["epoch"])
    h["train_acc"] = (pattern + [pattern[-1]] * n)[:n]
    (d / f"{arm}.json").write_text(json.dumps(r))
  assert cli.main(["report", str(d)]) == 0
  rows: dict = {}
  for ln in capsys.readouterr().out.splitlines():
    if ln.split():
      rows.setdefault(ln.split()[0], ln)  # the first table's rows
  assert "2 (1/1 end in one)" in rows["A2"]  # 0.3 recovered, 0.5 to the end
  assert "0 (0/1 end in one)" in rows["B2"]  # below 0.99 only before memorizing
