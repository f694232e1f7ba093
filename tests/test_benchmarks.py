"""The benchmark scripts run end to end and print their summary line (tiny budgets).

Each script compiles every row it times, so these runs are marked slow; the checks of
the committed benchmark results stay in the default suite.
"""

import importlib.util
import json
import pathlib
import re
import sys

import pytest

from benchmarks import grok_quick
from benchmarks import grok_seeds
from benchmarks import mmuon_solver
from benchmarks import train_step
from benchmarks import update_step
from benchmarks import vs_geoopt


def _main(module, argv, capsys, monkeypatch):
  monkeypatch.setattr(sys, "argv", [module.__name__] + argv)
  module.main()
  return capsys.readouterr().out


@pytest.mark.slow
def test_update_step_table_and_summary(capsys, monkeypatch):
  out = _main(update_step, ["--quick", "--methods", "auto", "--reps", "2"], capsys, monkeypatch)
  rows = [line.split() for line in out.splitlines() if line.startswith("(8,128,16)")]
  assert [r[1] for r in rows] == ["adamw", "B2", "B2", "B2"]  # adamw, auto, per leaf, chain
  # State per frame: AdamW 2 d r floats; B2 d r floats + nu + two int32 skip counters.
  assert rows[0][-1] == str(2 * 128 * 16 * 4)
  assert rows[1][-1] == str(128 * 16 * 4 + 4 + 8)
  assert re.search(r"^summary: .*\(8,128,16\) [0-9.]+x", out, re.M)


@pytest.mark.slow
def test_update_step_family_rows(capsys, monkeypatch):
  out = _main(
    update_step,
    ["--quick", "--methods", "auto", "--reps", "1", "--family", "--shapes", "(4,128,32)"],
    capsys,
    monkeypatch,
  )
  rows = [line for line in out.splitlines() if line.startswith("(8,128,16)")]
  for label in ("retraction=qr", "retraction=cayley", "manifold_muon", "optax muon"):
    assert sum(label in r for r in rows) == 1, label


@pytest.mark.slow
def test_mmuon_solver_tables(capsys, monkeypatch):
  out = _main(mmuon_solver, ["--quick", "--reps", "1"], capsys, monkeypatch)
  rows = [line.split() for line in out.splitlines() if line.startswith("(4, 16, 4)")]
  assert len(rows) == 2
  shipped, plain = (float(r[-1]) for r in rows)  # the gaps at K=40
  assert shipped < 1e-10 and shipped <= plain
  assert re.search(r"K=10 +[0-9.]+ ms", out)


@pytest.mark.slow
def test_train_step_summary(capsys, monkeypatch):
  out = _main(train_step, ["--batch", "8", "--reps", "2"], capsys, monkeypatch)
  assert re.search(
    r"^summary: training step .* B2 [0-9.]+ ms vs A2 [0-9.]+ ms: [0-9.]+x$", out, re.M
  )


@pytest.mark.slow
def test_grok_seeds_ratio(capsys, monkeypatch):
  from stiefax.experiments.grok import config as grok_config
  from tests.harness import TINY_GROK  # pylint: disable=g-import-not-at-top

  monkeypatch.setitem(grok_config.PRESETS, "tiny", dict(config=TINY_GROK, arms=("B2",), seeds=(0,)))
  out = _main(
    grok_seeds,
    ["--preset", "tiny", "--seeds", "2", "--window", "2", "--reps", "1"],
    capsys,
    monkeypatch,
  )
  assert re.search(r"^  vmapped / separate = [0-9.]+$", out, re.M)


ROOT = pathlib.Path(__file__).resolve().parent.parent


def _flat(text: str) -> str:
  return " ".join(text.split())


def test_grok_quick_summary_is_its_runs_and_what_the_readme_says():
  """The committed summary is that of the committed runs (5 seeds, 2 thread settings),
  and the README, the docs and `stiefax grok` quote it."""
  from stiefax.experiments.grok import quick_seeds  # pylint: disable=g-import-not-at-top

  path = ROOT / grok_quick.DEFAULT_OUT / grok_quick.SUMMARY_NAME
  summary = json.loads(path.read_text())
  settings = list(summary["settings"])
  assert settings == ["t1", "t2"]
  again = grok_quick.summarize(ROOT / grok_quick.DEFAULT_OUT, settings)
  assert json.loads(json.dumps(again)) == summary
  for arm in ("A2", "B2"):
    for s in settings:
      assert summary["arms"][arm][s]["seeds"] == [0, 1, 2, 3, 4]
  assert grok_quick.check_claims(summary) == []
  table = grok_quick.figures_table(summary)
  for doc in ("README.md", "docs/reproduction.md"):
    text = (ROOT / doc).read_text()
    assert table in text, doc
    for claim in grok_quick.claims_text():
      assert _flat(claim) in _flat(text), (doc, claim)
  assert grok_quick.figures_text(summary) == quick_seeds.FIGURES


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_grok_quick_claims_hold_over_five_fresh_seeds(tmp_path, capsys):
  """The quick preset over seeds 0-4 (default threads), trained afresh: the claims the
  README makes for every machine hold."""
  grok_quick.main(["--settings", "t2", "--out", str(tmp_path)])
  summary = json.loads((tmp_path / grok_quick.SUMMARY_NAME).read_text())
  assert summary["arms"]["A2"]["t2"]["n"] == summary["arms"]["B2"]["t2"]["n"] == 5
  assert grok_quick.check_claims(summary) == []


@pytest.mark.skipif(
  importlib.util.find_spec("geoopt") is None, reason="needs the bench extra (torch, geoopt)"
)
def test_vs_geoopt_summary(capsys, monkeypatch):
  monkeypatch.setattr(vs_geoopt, "SHAPES", [(2, 16, 4)])
  out = _main(vs_geoopt, ["--reps", "3"], capsys, monkeypatch)
  assert re.search(r"^summary: .*\(2, 16, 4\) [0-9.]+x faster$", out, re.M)


@pytest.mark.slow
def test_gpu_script_runs_at_tiny_sizes(tmp_path, capsys):
  from benchmarks import gpu  # pylint: disable=g-import-not-at-top

  gpu.main(["--tiny", "--out", str(tmp_path)])
  out = capsys.readouterr().out
  (path,) = tmp_path.glob("*.json")
  result = json.loads(path.read_text())
  assert path.with_suffix(".md").exists()
  assert re.search(r"^summary: wrote .*\.json in [0-9.]+ s$", out, re.M)
  # Every update row against AdamW, for the default, the other grouping and the chain.
  for shape in ("(2,16,4)", "3L(2,16,4)"):
    labels = [r["optimizer"] for r in result["update"] if r["shape"] == shape]
    assert labels[0] == "adamw" and len(labels) == 4, labels
  assert all(r["ms"] > 0 for r in result["update"] + result["train_step"])
  # Both training steps, B2 against A2, with their compiled memory.
  models = {r["model"] for r in result["train_step"]}
  assert len(models) == 2 and all(r["step_bytes"] for r in result["train_step"])
  assert {r["arm"] for r in result["train_step"]} == {"A2", "B2"}
  kernels = {r["layers"]: r for r in result["kernels"]}
  assert kernels[3]["stiefel part"] <= kernels[1]["stiefel part"] * 2


def test_gpu_script_skips_what_its_budget_leaves_out_and_still_writes(tmp_path, capsys):
  from benchmarks import gpu  # pylint: disable=g-import-not-at-top

  gpu.main(["--tiny", "--out", str(tmp_path), "--budget-s", "0"])
  (path,) = tmp_path.glob("*.json")
  result = json.loads(path.read_text())
  assert result["update"] == result["train_step"] == result["kernels"] == []
  assert result["skipped"][-3:] == ["patches step", "decoder step", "kernels"]
  assert len(result["skipped"]) == len(gpu.TINY_UPDATES) + 3
  assert "skipped (past the time budget)" in path.with_suffix(".md").read_text()
