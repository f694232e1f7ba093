"""The image-patch benchmark: arms, model init, the command end to end, and its report."""

import json
import re
import shlex

import numpy as np
import pytest

from stiefax.experiments import cli
from stiefax.experiments.patches import config as patches_config
from stiefax.experiments.patches import model as patches_model
from stiefax.experiments.patches import runs as patches_runs
from stiefax.experiments.patches import tables as patches_tables
from stiefax.experiments.patches import training as patches_training

# A tiny model keeps each training compile to a few seconds.
TINY = [
  "--d",
  "32",
  "--heads",
  "2",
  "--head-dim",
  "8",
  "--mlp-ratio",
  "1",
  "--depth",
  "1",
  "--no-progress",
]


def digits_argv(tmp_path, *args):
  """``stiefax patches`` on digits with a one-block, narrow-MLP model, writing to
  ``tmp_path / "runs"``, then ``args``."""
  return [
    "patches",
    *args,
    "--warmup-epochs",
    "1",
    "--depth",
    "1",
    "--mlp-ratio",
    "1",
    "--out",
    str(tmp_path / "runs"),
    "--cache",
    str(tmp_path / "cache"),
    "--no-progress",
  ]


def test_arm_names_and_aliases():
  assert patches_config.arm_by_name("pa16").name == "B2-SGD"
  assert patches_config.arm_by_name("b2").name == "B2"
  assert patches_config.PAPER_ARMS == (
    "A2",
    "A2-orth",
    "B2",
    "B2-SGD",
    "frozen",
    "elementwise",
    "grassmann",
    "soft",
  )
  named = (*patches_config.PAPER_ARMS, *patches_config.OPTIMIZER_ARMS, *patches_config.LOGIT_ARMS)
  assert list(patches_config.ARMS)[: len(named)] == list(named)  # then any arm added since
  assert set(patches_config.OPTIMIZER_ARMS) == {"B2-mmuon", "A2-muon", "B2-qr", "B2-cayley"}
  setting = patches_config.Setting(n_train=10_000, epochs=40)
  assert setting.steps_per_epoch == 40 and setting.total_steps == 1600
  assert setting.warmup_steps == 200
  assert (
    patches_config.arm_hparams(patches_config.ARMS["elementwise"], setting, None)["frame_lr"]
    == 0.03
  )
  assert patches_config.arm_hparams(patches_config.ARMS["A2"], setting, 3e-3)["adamw_lr"] == 3e-3
  assert patches_config.arm_hparams(patches_config.ARMS["soft"], setting, None)["penalty"] == 0.1


def test_non_frame_init_is_shared_across_arms():
  import jax

  setting = patches_config.Setting(n_train=8, epochs=1, d=16, heads=4, head_dim=4, mlp_ratio=1)
  model = patches_model.make_model(setting, 4, 10)
  init = patches_training.model_programs(setting, 4, 10).init  # the jitted init the trainers share
  a2 = patches_training.init_model(model, patches_config.ARMS["A2"], 0, 4, 16, init)
  b2 = patches_training.init_model(model, patches_config.ARMS["B2"], 0, 4, 16, init)
  a2_other = patches_training.init_model(model, patches_config.ARMS["A2"], 1, 4, 16, init)
  frames = set(patches_model.frame_paths(a2))
  assert len(frames) == 2  # query and key kernels
  for i, (x, y, z) in enumerate(zip(*(jax.tree.leaves(t) for t in (a2, b2, a2_other)))):
    if i in frames:
      assert not np.allclose(x, y)
      gram = np.einsum("dhr,dhs->hrs", np.asarray(y), np.asarray(y))
      np.testing.assert_allclose(gram, np.broadcast_to(np.eye(4), gram.shape), atol=1e-5)
    else:
      np.testing.assert_array_equal(x, y)
    if x.size > 16:
      assert not np.allclose(x, z)  # another seed draws other weights


@pytest.mark.slow
def test_cli_paired_seeds_and_report(cifar, tmp_path, capsys):
  out = tmp_path / "runs"
  argv = [
    "patches",
    "--data",
    str(cifar["archive"]),
    "--n-train",
    "512",
    "--epochs",
    "1",
    "--arms",
    "A2,B2",
    "--seeds",
    "0,1",
    "--out",
    str(out),
    "--cache",
    str(tmp_path / "cache"),
    *TINY,
  ]
  assert cli.main(argv) == 0
  printed = capsys.readouterr().out
  files = sorted(p.name for p in out.glob("*.json"))
  assert [re.sub(r"-[0-9a-f]{8}-", "-H-", f) for f in files] == [
    "run-A2-n512-H-s0.json",
    "run-A2-n512-H-s1.json",
    "run-B2-n512-H-s0.json",
    "run-B2-n512-H-s1.json",
  ]
  runs = [json.loads((out / f).read_text()) for f in files]
  for r, f in zip(runs, files):
    assert patches_runs.config_hash(r["config"]) in f
    assert r["command"].startswith("stiefax patches ") and f"--seeds {r['seed']}" in r["command"]
    assert set(r["code"]) == {"version", "commit", "dirty"}
  for r in runs:
    assert r["experiment"] == "patches" and set(r) >= {
      "arm",
      "seed",
      "config",
      "metrics",
      "history",
      "wall_time",
    }
    assert {"test_acc", "isometry", "wall_per_epoch"} <= set(r["metrics"])
    assert 0.0 <= r["metrics"]["test_acc"] <= 1.0 and r["config"]["n_test"] == 100
    assert r["config"]["n_train"] == 512 and r["config"]["steps_per_epoch"] == 2
    assert len(r["history"]["train_loss"]) == 1
  by = {(r["arm"], r["seed"]): r for r in runs}
  assert by[("B2", 0)]["metrics"]["isometry"] < 1e-5
  assert by[("A2", 0)]["metrics"]["isometry"] > 1e-2  # Xavier frames are not orthonormal
  assert by[("B2", 0)]["config"]["riemannian_lr"] == 1.0
  assert by[("A2", 0)]["config"]["adamw_lr"] == 1e-2
  text = patches_tables.report(runs, tmp_path / "report")
  table = [line for line in text.splitlines() if "plot:" not in line]
  assert "Δ vs A2 pp" in text and all(line in printed for line in table)
  diffs = [
    100 * (by[("B2", s)]["metrics"]["test_acc"] - by[("A2", s)]["metrics"]["test_acc"])
    for s in (0, 1)
  ]
  b2_row = next(line for line in text.splitlines() if line.startswith("B2 "))
  assert f"{np.mean(diffs):+.2f}" in b2_row
  assert f"{sum(d > 0 for d in diffs)}/2" in b2_row
  assert list((tmp_path / "report").glob("*.png"))
  # Finished runs are kept: a rerun loads them instead of training again.
  mtime = (out / files[0]).stat().st_mtime_ns
  assert cli.main(argv) == 0
  assert (out / files[0]).stat().st_mtime_ns == mtime
  # Another configuration in the same folder never replaces a finished run.
  assert cli.main([*argv, "--adamw-lr", "0.003"]) == 0
  assert len(list(out.glob("*.json"))) == 8
  assert (out / files[0]).stat().st_mtime_ns == mtime
  # The command recorded in a run reproduces it in a fresh folder.
  rec = by[("B2", 1)]
  again = tmp_path / "again"
  cmd = shlex.split(rec["command"])
  cmd[cmd.index("--out") + 1] = str(again)
  assert cmd[:2] == ["stiefax", "patches"]
  assert cli.main([*cmd[1:], "--cache", str(tmp_path / "cache"), "--no-progress"]) == 0
  (rerun,) = [json.loads(p.read_text()) for p in again.glob("*.json")]
  assert patches_runs.run_identity(rerun["config"]) == patches_runs.run_identity(rec["config"])
  assert rerun["metrics"]["test_acc"] == rec["metrics"]["test_acc"]


@pytest.mark.slow
def test_digits_default_runs_end_to_end(tmp_path, capsys):
  out = tmp_path / "runs"
  argv = digits_argv(tmp_path, "--arms", "B2", "--seeds", "0", "--epochs", "6", "--n-train", "512")
  assert cli.main(argv) == 0
  (run,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
  assert run["config"]["dataset"] == "digits" and run["config"]["tokens"] == 4
  assert run["config"]["d"] == 16 and run["config"]["heads"] * run["config"]["head_dim"] <= 16
  assert run["config"]["n_test"] == 500
  assert run["metrics"]["test_acc"] > 0.3  # chance is 0.1
  assert run["metrics"]["isometry"] < 1e-5
  assert run["history"]["train_loss"][-1] < run["history"]["train_loss"][0]
  assert "digits" in capsys.readouterr().out
  (path,) = out.glob("*.json")
  assert [p.name for p in out.iterdir() if p.suffix != ".png"] == [path.name]  # no lock left
  # Rerun: the finished run is read back, not trained again nor rewritten.
  before = path.stat().st_mtime_ns
  assert cli.main(argv) == 0
  assert path.stat().st_mtime_ns == before
  assert not re.search(r"^  B2 +seed 0 ", capsys.readouterr().out, re.M)  # nothing trained
  # --force trains it again; the earlier result is moved aside, never overwritten.
  assert cli.main(argv + ["--force"]) == 0
  aside = [p for p in out.iterdir() if p.name.startswith(path.name + ".replaced-")]
  assert len(aside) == 1 and json.loads(aside[0].read_text()) == run
  assert "moved the earlier" in capsys.readouterr().err


@pytest.mark.slow
def test_a_held_run_is_passed_over_until_every_free_run_is_trained(tmp_path, capsys, monkeypatch):
  """Another process holds an A2 selection run: this one trains frozen first, then waits."""
  from tests.harness import hold_runs  # pylint: disable=g-import-not-at-top

  out = tmp_path / "runs"
  held = "select-lr-A2-n256-k0.003-"
  # "Another process" holds the A2 run at rate 3e-3 until the frozen run is written.
  polls = hold_runs(
    monkeypatch, held, until=lambda: bool(list(out.glob("run-frozen-*.json"))), max_asks=2
  )
  argv = digits_argv(
    tmp_path,
    *("--arms", "A2,frozen", "--seeds", "0", "--epochs", "2", "--n-train", "256"),
    *("--n-val", "128", "--select-lr", "--grid", "A2=0.001:0.003"),
  )
  assert cli.main(argv) == 0
  text = capsys.readouterr().out
  assert polls == [polls[0]] and polls[0].startswith(held)  # asked once, then passed over
  assert "coming back to it after the other runs" in text
  # The frozen run (no rate to select) trained while A2's selection run was held; A2 is
  # selected only once that run is in, and its final run uses the selected rate.
  first, second = text.split("selected A2:")
  assert re.search(r"^  frozen +seed 0 +test acc", first, re.M)
  assert not re.search(r"^  A2 +seed 0 +test acc", first, re.M)
  rate = float(re.search(r"^ ([0-9.e-]+)", second, re.M).group(1))
  (a2,) = [json.loads(p.read_text()) for p in out.glob("run-A2-*.json")]
  assert a2["config"]["adamw_lr"] == pytest.approx(rate)
  assert len(list(out.glob("select-lr-*.json"))) == 2
  assert not list(out.glob("*.lock"))


@pytest.mark.slow
def test_no_wait_leaves_a_held_run_to_its_process(tmp_path, capsys, monkeypatch):
  """With --no-wait the free run trains and the command ends with status 75 instead of
  waiting for the run another process holds (the study scripts' middle pass)."""
  from stiefax.experiments import jobs  # pylint: disable=g-import-not-at-top
  from tests.harness import hold_runs  # pylint: disable=g-import-not-at-top

  out = tmp_path / "runs"
  asked = hold_runs(monkeypatch, "run-A2-", max_asks=2)  # held throughout
  argv = digits_argv(
    tmp_path, *("--arms", "A2,frozen", "--seeds", "0", "--epochs", "1", "--n-train", "256")
  )
  assert cli.main(argv + ["--no-wait"]) == jobs.EXIT_HELD == 75
  text = capsys.readouterr().out
  assert "1 run(s) held by other processes are left to them (--no-wait)" in text
  assert len(asked) == 2  # asked in the pass that trained frozen, and once more
  assert [p.name.split("-")[1] for p in out.glob("run-*.json")] == ["frozen"]
  assert not list(out.glob("*.lock"))


def _fake(arm, seed, acc, protocol="run", n=10_000, eps=1e-8):
  cfg = {
    "protocol": protocol,
    "dataset": "cifar10-python",
    "n_train": n,
    "epochs": 40,
    "depth": 1,
    "d": 128,
    "heads": 8,
    "head_dim": 16,
    "batch_size": 256,
    "total_steps": 1600,
    "n_test": 10_000,
    "eps": eps,
    "adamw_lr": 1e-2,
    "riemannian_lr": 1.0,
    "penalty": None,
  }
  return {
    "experiment": "patches",
    "arm": arm,
    "seed": seed,
    "config": cfg,
    "metrics": {"test_acc": acc, "isometry": 1e-6 if arm != "A2" else 0.6, "wall_per_epoch": 2.0},
    "history": {"isometry": [0.5, 0.6]},
    "wall_time": 80.0,
  }


def test_report_tables_from_runs(tmp_path):
  from scipy import stats as sps

  a2 = [0.36, 0.351, 0.37, 0.364]
  b2 = [0.431, 0.424, 0.425, 0.433]
  runs = [_fake("A2", s, a) for s, a in enumerate(a2)]
  runs += [_fake("B2", s, b) for s, b in enumerate(b2)]
  runs += [_fake("frozen", s, a - 0.01 * (s % 2)) for s, a in enumerate(a2)]
  runs.append({"experiment": "grok", "arm": "A2"})  # other experiments are ignored
  text = patches_tables.report(runs, tmp_path)
  b2_row = next(line for line in text.splitlines() if line.startswith("B2 "))
  t = sps.ttest_rel(np.array(b2) * 100, np.array(a2) * 100).statistic
  diff = 100 * np.mean(np.array(b2) - np.array(a2))
  assert f"{diff:+.2f}" in b2_row and f"{t:.2f}" in b2_row and "4/4" in b2_row
  frozen_row = next(line for line in text.splitlines() if line.startswith("frozen"))
  assert "0/4" in frozen_row and "-0.50" in frozen_row
  a2_row = next(line for line in text.splitlines() if line.startswith("A2 "))
  assert f"{100 * np.mean(a2):.2f} ± {100 * np.std(a2, ddof=1):.2f}" in a2_row  # ddof=1
  # sweep-n: population std per n; sweep-eps: paired against the smallest eps.
  sweep = [
    _fake(arm, s, acc + 0.01 * s + (0.002 * (s - 1) if arm == "B2" else 0.0), "sweep-n", n=n)
    for n, base in ((1000, 0.30), (5000, 0.35))
    for arm, acc in (("A2", base), ("B2", base + 0.02 * n / 1000))
    for s in range(3)
  ]
  eps_runs = [
    _fake(
      "B2", s, 0.43 - (0.026 + 0.001 * (s - 1) if e > 0.05 else 0.0) + 0.01 * s, "sweep-eps", eps=e
    )
    for e in (1e-8, 1e-1)
    for s in range(3)
  ]
  text = patches_tables.report(sweep + eps_runs, tmp_path)
  rows = {line.split()[0]: line for line in text.splitlines() if line[:1].isdigit()}
  assert "31.00 ± 0.82" in rows["1000"] and "+2.00" in rows["1000"]
  assert "+10.00" in rows["5000"] and "3/3" in rows["5000"]
  assert "[+1.80, +2.20]" in rows["1000"]  # paired diffs 1.8, 2.0, 2.2: CI spans min..max
  assert "-2.60" in rows["1e-01"] and "0/3" in rows["1e-01"]
  assert (tmp_path / "patches_sweep_n.png").is_file()
  assert patches_tables.report([], tmp_path) == "patches: no runs"


def test_report_separates_settings_and_knobs_and_pairs_the_contrasts(tmp_path):
  """Depth and AdamW-rate cells are separate tables; the frozen share is per cell."""

  def fake(arm, seed, acc, depth=1, lr=1e-2, **kw):
    r = _fake(arm, seed, acc, **kw)
    r["config"].update(depth=depth, adamw_lr=lr)
    return r

  runs = []
  for depth, lr, gain_frozen, gain_b2 in ((1, 1e-2, 0.06, 0.07), (2, 1e-3, 0.01, 0.05)):
    for s in range(3):
      base = 0.35 + 0.01 * s
      runs += [
        fake("A2", s, base, depth, lr),
        fake("frozen", s, base + gain_frozen + 0.001 * s, depth, lr),
        fake("B2", s, base + gain_b2 + 0.002 * s, depth, lr),
      ]
  for s, b2sgd, grass in ((0, 0.38, 0.41), (1, 0.385, 0.425), (2, 0.40, 0.43)):
    runs += [fake("B2-SGD", s, b2sgd), fake("grassmann", s, grass)]
  for lam, acc in ((0.01, 0.37), (0.1, 0.38), (1.0, 0.36)):
    r = fake("soft", 0, acc)
    r["config"]["penalty"] = lam
    runs.append(r)
  text = patches_tables.report(runs, tmp_path)
  titles = [line for line in text.splitlines() if line.startswith("patches (run)")]
  assert len(titles) == 2 and any("depth=2" in t and "adamw_lr=0.001" in t for t in titles)
  # One row per lambda, labelled by it.
  assert sum(line.startswith("soft λ=") for line in text.splitlines()) == 3
  # The frozen share of B2's gain: 6.1/7.2 at (1, 1e-2), 1.1/5.2 at (2, 1e-3).
  share = {
    tuple(line.split()[:2]): line
    for line in text.splitlines()
    if line[:1].isdigit() and len(line.split()) > 8
  }
  for key, value in ((("1", "0.01"), 6.1 / 7.2), (("2", "0.001"), 1.1 / 5.2)):
    cells = share[key].split()
    assert cells[-3] == f"{value:.2f}"
    lo, hi = float(cells[-2].strip("[,")), float(cells[-1].strip("]"))
    assert lo <= round(value, 2) <= hi  # the bootstrap interval of the ratio holds it
  # Table 7's contrasts, paired within seed: the step rule is grassmann - B2-SGD.
  step = next(line for line in text.splitlines() if line.startswith("step rule"))
  assert "+3.33" in step and "3/3" in step
  train = [
    line
    for line in text.splitlines()
    if line.startswith("training the frames") and line.endswith("vs frozen frames")
  ]
  assert len(train) == 2 and "+1.10" in train[0] + train[1] and "+4.10" in train[0] + train[1]
  assert len(list(tmp_path.glob("patches_run_n10000_e40_depth*.png"))) == 2
  # Contrasts found in both settings, side by side (the main cell first).
  across = text.split("patches (contrasts across settings)")[1].split("\n\n")[0].splitlines()
  assert "depth 1, lr 0.01" in across[1] and across[1].index("depth 1") < across[1].index("depth 2")
  alone = next(ln for ln in across if ln.startswith("constraint alone"))
  assert "+6.10 (3/3, not settled)" in alone and "+1.10 (3/3, not settled)" in alone
  assert not any(ln.startswith("step rule") for ln in across)  # in one setting only


def test_eps_probe_uses_the_main_study_as_its_reference(tmp_path):
  main = [_fake("B2", s, 0.43 + 0.01 * s) for s in range(3)]
  main += [_fake("A2", s, 0.36) for s in range(3)]
  probe = [_fake("B2", s, 0.40 + 0.01 * s + 0.001 * s, "sweep-eps", eps=1e-1) for s in range(3)]
  text = patches_tables.report(main + probe, tmp_path)
  rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("1e-")}
  assert rows["1e-08"].split()[1] == "3" and "-2.90" in rows["1e-01"]
  assert "0/3" in rows["1e-01"] and (tmp_path / "patches_sweep_eps_B2.png").is_file()
  assert "the smallest here" not in text
  # Without the main study, the smallest eps of the probe is the baseline, and it says so.
  alone = patches_tables.report(
    probe + [_fake("B2", s, 0.42, "sweep-eps", eps=1e-6) for s in range(3)], tmp_path
  )
  assert "Δ vs 1e-06 pp" in alone
  assert "paired against eps=1e-06, the smallest here: no B2 run at the default eps=1e-08" in alone


@pytest.mark.slow  # every family arm end to end (tests/test_arms.py builds and steps each)
def test_optimizer_family_arms_run_end_to_end_on_digits(tmp_path, capsys):
  out = tmp_path / "runs"
  argv = digits_argv(
    tmp_path,
    *("--arms", ",".join(patches_config.OPTIMIZER_ARMS), "--seeds", "0", "--epochs", "3"),
    *("--n-train", "256", "--select-lr", "--n-val", "128"),
    *("--grid", "B2-mmuon=0.02:0.05,A2-muon=0.02,B2-qr=1.0,B2-cayley=1.0"),
  )
  assert cli.main(argv) == 0
  runs = [json.loads(p.read_text()) for p in out.glob("run-*.json")]
  by_arm = {r["arm"]: r for r in runs}
  assert set(by_arm) == set(patches_config.OPTIMIZER_ARMS)
  for name, r in by_arm.items():
    assert r["metrics"]["test_acc"] > 0.2, name  # chance is 0.1
    assert np.isfinite(r["history"]["train_loss"][-1])
    if name != "A2-muon":
      assert r["metrics"]["isometry"] < 1e-5, name
  assert by_arm["A2-muon"]["metrics"]["isometry"] > 1e-3  # unconstrained frames
  assert by_arm["B2-mmuon"]["config"]["eps"] is None
  assert len(list(out.glob("select-lr-*.json"))) == 5
  text = capsys.readouterr().out
  assert "selected B2-mmuon" in text and "selected A2-muon" in text
  # A run at a selected rate is the run that --lr gives at that rate: it pairs with
  # unselected runs, so giving the rate by hand finds it finished.
  assert all(r["config"]["n_val"] == 0 for r in runs)
  argv_lr = [a for a in argv if a not in ("--select-lr",)]
  i = argv_lr.index("--grid")
  argv_lr[i : i + 2] = ["--lr", "B2-qr=1.0"]
  argv_lr[argv_lr.index("--arms") + 1] = "B2-qr"
  argv_lr.remove("--n-val"), argv_lr.remove("128")
  assert cli.main(argv_lr) == 0
  assert "seed 0   test acc" not in capsys.readouterr().out  # nothing trained again
  assert len(list(out.glob("run-*.json"))) == len(runs)


def test_optimizer_family_arms_are_paired_with_b2(tmp_path):
  # docs/optimizers.md reads each new arm's paired difference to B2 from this table.
  runs = [_fake("A2", s, 0.39) for s in range(3)]
  runs += [_fake("B2", s, 0.46 + 0.001 * s) for s in range(3)]
  runs += [_fake("B2-qr", s, 0.47 + 0.002 * s) for s in range(3)]
  runs += [_fake("A2-muon", s, 0.44) for s in range(2)]
  text = patches_tables.report(runs, tmp_path)
  qr = next(line for line in text.splitlines() if line.startswith("QR retraction"))
  assert "B2-qr - B2" in qr and "+1.10" in qr and "3/3" in qr
  muon = next(line for line in text.splitlines() if line.startswith("Muon, free frames"))
  assert "-2.00" in muon and "0/2" in muon  # paired on the two seeds both arms have
  assert not any(line.startswith("manifold Muon") for line in text.splitlines())


def _probed(arm, seed, acc, logits, entropies):
  r = _fake(arm, seed, acc)
  r["history"].update(max_logit=list(logits), attn_entropy=list(entropies))
  r["metrics"].update(max_logit=logits[-1], max_logit_max=max(logits), attn_entropy=entropies[-1])
  return r


def test_attention_probe_table_and_figure_take_a_later_copy_for_runs_without_it(tmp_path):
  # A2 was trained before the probe existed; its rerun recorded it. The accuracy tables
  # use the first copy, the attention table and figure the rerun's probe.
  first = [_fake("A2", s, 0.36 + 0.01 * s) for s in range(2)]
  again = [_probed("A2", s, 0.37, (20.0, 30.0 + s), (1.5, 1.0)) for s in range(2)]
  qk = [_probed("A2-qknorm", s, 0.37 + 0.01 * s, (5.0, 10.0 + 2 * s), (2.0, 1.2)) for s in range(2)]
  text = patches_tables.report(first + qk, tmp_path / "alone")
  rows = {ln.split()[2]: ln.split() for ln in text.splitlines() if ln.startswith("1      0.01")}
  assert set(rows) == {"A2-qknorm"} and rows["A2-qknorm"][4:7] == ["11.0", "12.0", "1.200"]
  text = patches_tables.report(first + qk, tmp_path, again=again)
  rows = {ln.split()[2]: ln.split() for ln in text.splitlines() if ln.startswith("1      0.01")}
  assert rows["A2"][3:5] == ["2", "(2"] and rows["A2"][6:9] == ["30.5", "31.0", "1.000"]
  a2 = next(ln for ln in text.splitlines() if ln.startswith("A2 "))
  assert "36.50" in a2  # the accuracy table kept the first copies (0.36, 0.37)
  assert (tmp_path / "patches_attention_n10000_e40_depth1_lr0.01.png").is_file()


def test_report_reads_several_directories_first_copy_first(tmp_path, capsys):
  main, rerun = tmp_path / "main", tmp_path / "rerun"
  main.mkdir(), rerun.mkdir()
  for s in range(2):
    (main / f"a2-{s}.json").write_text(json.dumps(_fake("A2", s, 0.36)))
    (rerun / f"a2-{s}.json").write_text(
      json.dumps(_probed("A2", s, 0.38, (20.0, 25.0), (1.4, 1.1)))
    )
  assert cli.main(["report", str(main), str(rerun)]) == 0
  out = capsys.readouterr().out
  a2 = next(ln for ln in out.splitlines() if ln.startswith("A2 "))
  assert "36.00" in a2  # the copies of the first DIR are the ones reported
  assert "reruns: runs found twice" in out and out.count("+2") >= 2
  assert "2 (2 rerun)" in out  # the probe comes from the second DIR's copies
  assert (main / "patches_attention_n10000_e40_depth1_lr0.01.png").is_file()
  assert cli.main(["report", str(rerun), str(main)]) == 0
  out = capsys.readouterr().out
  assert "38.00" in next(ln for ln in out.splitlines() if ln.startswith("A2 "))
