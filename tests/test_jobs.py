"""The one run loop of the training commands (:func:`stiefax.experiments.jobs.run_jobs`),
with jobs that train in no time: what every command's runs get from it."""

import dataclasses
import errno
import json
import os

import pytest

from stiefax.experiments import jobs
from stiefax.experiments import store
from stiefax.experiments.flags import CommandError
from tests.harness import hold_runs


@dataclasses.dataclass
class _Job(jobs.Job):
  command = "stiefax toy"
  checkpointed = False

  def same(self, record):
    return record.get("seed") == self.seed and record.get("arm") == self.arm


def _record(job, value=1.0):
  return {
    "experiment": "patches",
    "arm": job.arm,
    "seed": job.seed,
    "config": {"protocol": "run"},
    "metrics": {"test_acc": value},
  }


@pytest.fixture(autouse=True)
def _any_run_checks(monkeypatch):
  """The toy records are runs of no real configuration: every record is usable."""
  from stiefax.experiments import protocol

  monkeypatch.setattr(protocol, "record_problem", lambda run, experiment=None: None)


def _todo(out, seeds=(0, 1)):
  return [_Job("A2", s, out / f"A2-s{s}.json") for s in seeds]


def _trainer(trained, value=1.0):
  def train(batch, checkpoints):
    assert checkpoints == [None] * len(batch)
    trained.extend(job.seed for job in batch)
    return [_record(job, value) for job in batch]

  return train


def test_trains_writes_and_skips_finished_runs(tmp_path, capsys):
  trained = []
  outcome = jobs.run_jobs(_todo(tmp_path), _trainer(trained))
  assert outcome.status == 0 and trained == [0, 1]
  assert [r["seed"] for r in outcome.records] == [0, 1]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["A2-s0.json", "A2-s1.json"]  # no lock
  again = jobs.run_jobs(_todo(tmp_path), _trainer(trained))
  assert again.records == outcome.records and trained == [0, 1]  # read back
  assert capsys.readouterr().out.count("finished already") == 2


def test_force_trains_again_and_moves_the_earlier_file_aside(tmp_path, capsys):
  jobs.run_jobs(_todo(tmp_path, (0,)), _trainer([], value=1.0))
  trained = []
  outcome = jobs.run_jobs(_todo(tmp_path, (0,)), _trainer(trained, value=2.0), force=True)
  assert trained == [0] and outcome.records[0]["metrics"]["test_acc"] == 2.0
  (aside,) = tmp_path.glob("A2-s0.json.replaced-*")
  assert json.loads(aside.read_text())["metrics"]["test_acc"] == 1.0  # never overwritten
  assert "moved the earlier A2-s0.json" in capsys.readouterr().err


def test_a_file_of_another_run_is_moved_aside_not_overwritten(tmp_path, capsys):
  (tmp_path / "A2-s0.json").write_text(json.dumps({"arm": "B2", "seed": 0}))
  trained = []
  assert jobs.run_jobs(_todo(tmp_path, (0,)), _trainer(trained)).status == 0
  assert trained == [0] and len(list(tmp_path.glob("A2-s0.json.bad-*"))) == 1
  assert "is unusable" in capsys.readouterr().err


def test_no_wait_leaves_held_runs_and_ends_with_exit_held(tmp_path, monkeypatch, capsys):
  asked = hold_runs(monkeypatch, "A2-s1")
  trained = []
  outcome = jobs.run_jobs(_todo(tmp_path), _trainer(trained), no_wait=True)
  assert outcome.status == jobs.EXIT_HELD == 75 and trained == [0]
  assert len(asked) == 2  # asked in the pass that trained seed 0, and once more
  out = capsys.readouterr().out
  assert "coming back to it after the other runs" in out
  assert "1 run(s) held by other processes are left to them (--no-wait)" in out


def test_a_plan_adds_runs_that_depend_on_finished_ones(tmp_path):
  first = _Job("A2", 0, tmp_path / "A2-s0.json")

  def plan(records):
    if first.path not in records:
      return [first]
    return [first, _Job("B2", 1, tmp_path / "B2-s1.json")]

  trained = []
  outcome = jobs.run_jobs(plan, _trainer(trained))
  assert outcome.status == 0 and [r["arm"] for r in outcome.records] == ["A2", "B2"]


def test_together_trains_one_batch(tmp_path):
  batches = []

  def train(batch, checkpoints):
    batches.append([job.seed for job in batch])
    return [_record(job) for job in batch]

  jobs.run_jobs(_todo(tmp_path, (0, 1, 2)), train, together=lambda job: job.arm)
  assert batches == [[0, 1, 2]]


def test_take_gives_a_run_from_elsewhere(tmp_path):
  def take(job):
    record = _record(job, 3.0)
    store.write_json(job.path, record)
    return record

  trained = []
  outcome = jobs.run_jobs(_todo(tmp_path, (0,)), _trainer(trained), take=take)
  assert trained == [] and outcome.records[0]["metrics"]["test_acc"] == 3.0


def test_an_os_error_is_one_line_naming_the_file(tmp_path, monkeypatch):
  def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "A2-s0.lock"))

  monkeypatch.setattr(store.RunLock, "acquire", no_space)
  with pytest.raises(CommandError, match=r"A2-s0.lock: No space left on device"):
    jobs.run_jobs(_todo(tmp_path, (0,)), _trainer([]))


def test_a_result_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
  def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(store, "write_json", no_space)
  with pytest.raises(CommandError, match=r"cannot write .*A2-s0.json \(No space left"):
    jobs.run_jobs(_todo(tmp_path, (0,)), _trainer([]))


def test_every_command_has_the_loop_flags():
  import argparse

  parser = argparse.ArgumentParser()
  jobs.add_arguments(parser)
  args = parser.parse_args(["--no-wait", "--no-progress", "--force"])
  assert (args.no_wait, args.no_progress, args.force) == (True, True, True)
  assert "moved aside" in jobs.FORCE_HELP and str(jobs.EXIT_HELD) in jobs.NO_WAIT_HELP
