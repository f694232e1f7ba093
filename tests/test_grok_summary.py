"""What `stiefax grok` says about its runs: peak and end, collapses, what one run is."""

import contextlib
import dataclasses
import io
import json

import pytest

from stiefax.experiments import cli
from stiefax.experiments.grok import collapses
from stiefax.experiments.grok import command as grok_command
from stiefax.experiments.grok import config as grok_config
from stiefax.experiments.grok import quick_seeds
from stiefax.experiments.grok import runs as grok_runs
from tests import harness

TINY = harness.TINY_GROK


def _history(train_acc, test_acc=None):
  n = len(train_acc)
  return {
    "epoch": [50 * i for i in range(n)],
    "train_acc": list(train_acc),
    "test_acc": list(test_acc or [0.1 * i / n for i in range(n)]),
    "train_loss": [0.01 if a >= 0.99 else 2.0 * (1 - a) for a in train_acc],
  }


def test_collapses_start_after_memorizing_and_merge_consecutive_evaluations():
  h = _history([0.0, 0.5, 1.0, 1.0, 0.3, 0.1, 0.995, 0.98, 1.0, 0.27])
  found = collapses.find_collapses(h)
  assert [(c["start"], c["end"]) for c in found] == [(200, 300), (350, 400), (450, None)]
  assert found[0]["min_train_acc"] == 0.1 and found[0]["max_train_loss"] == 1.8
  assert collapses.ends_in_collapse(h) == found[-1]
  assert collapses.find_collapses(h, threshold=0.97) == [found[0], found[2]]
  # Below the threshold before memorizing is learning, not a collapse.
  assert collapses.find_collapses(_history([0.0, 0.5, 0.9, 0.99])) == []
  assert collapses.ends_in_collapse(_history([0.0, 1.0, 1.0])) is None
  assert collapses.peak_test({"epoch": [0, 50, 100], "test_acc": [0.2, 0.9, 0.9]}) == (0.9, 50)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
  """`stiefax grok --preset tiny --epochs 40 --arms A2`: its output and its record."""
  out = tmp_path_factory.mktemp("short")
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(grok_config.PRESETS, "tiny", dict(config=TINY, arms=("A2",), seeds=(0,)))
    args = ["grok", "--preset", "tiny", "--epochs", "40", "--arms", "A2", "--out", str(out)]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
      assert cli.main(args) == 0
    text = printed.getvalue()
  config = dataclasses.replace(TINY, epochs=40)
  record = json.loads((out / grok_runs.run_file_name(config, "A2", 0, "tiny")).read_text())
  return text, record


def test_a_short_run_reports_its_peak_and_its_end(short_run):
  text, record = short_run
  line = next(ln for ln in text.splitlines() if ln.startswith("A2 seed 0:"))
  peak, at = collapses.peak_test(record["history"])
  assert f"held-out accuracy peak {peak:.3f} (epoch {at})" in line
  assert f"{record['metrics']['end_test_acc']:.3f} at the end" in line
  assert "one run per arm and seed on this machine" in text
  assert "seeds 0-4" not in text  # the tiny preset has no figures over seeds


def test_a_run_ending_inside_a_collapse_says_so(short_run):
  _, record = short_run
  h = {k: list(v) for k, v in record["history"].items()}
  config = dataclasses.replace(TINY, epochs=80)
  # The run memorized, then its last two evaluations caught a collapse.
  h["train_acc"][-1] = 1.0
  for k, v in (("epoch", 60), ("train_acc", 0.5), ("test_acc", 0.2), ("train_loss", 2.0)):
    h[k].append(v)
  for k, v in (("epoch", 80), ("train_acc", 0.27), ("test_acc", 0.09), ("train_loss", 2.6)):
    h[k].append(v)
  for k in ("isometry", "isometry_key"):
    h[k] += [h[k][-1]] * 2
  collapsed = dict(record, history=h, metrics=grok_config.run_metrics(h, config))
  text = grok_runs.summary_words([collapsed])
  assert "1 training collapse caught by the evaluations" in text
  assert "from epoch 60" in text
  assert "the run ends inside a collapse (train accuracy 0.270 at epoch 80" in text
  assert "since epoch 60" in text
  assert "ends inside" not in grok_runs.summary_words([record])


def test_the_quick_preset_prints_its_figures_over_seeds(monkeypatch):
  record = {"config": {**grok_config.recorded(grok_config.QUICK), "preset": "quick"}}
  monkeypatch.setattr(quick_seeds, "FIGURES", ("A2: x", "B2: y"))
  note = quick_seeds.seed_note([record])
  assert note.splitlines()[1:] == ["  A2: x", "  B2: y"]
  assert quick_seeds.SUMMARY in note
  short = {"config": {**record["config"], "epochs": 300}}
  note = quick_seeds.seed_note([short])
  assert "A2: x" not in note and "for its 800 epochs" in note


def test_the_run_ends_with_what_to_expect_and_a_table_that_splits(short_run):
  text, record = short_run
  lines = text.rstrip("\n").splitlines()
  assert lines[-2:] == grok_command.EXPECTED.splitlines()
  assert "expected null" in lines[-2] and "stiefax patches" in lines[-1]
  table = grok_runs.summary_table([record, dict(record, arm="B2-cayley")]).splitlines()
  head = table[0].split()
  assert head[:5] == ["arm", "seed", "mem_epoch", "grok_epoch", "sust_epoch"]
  assert all(len(row.split()) == len(head) for row in table[2:])
