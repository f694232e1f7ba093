"""The device lease (`studies/gpu.sh`) and what it rests on, proven on the CPU.

* The seeds of an arm as one vmapped program equal separate runs to float32 rounding
  (tolerances below), and a run killed after a wall-time checkpoint, or stopped by
  `--time-limit`, resumes to the uninterrupted run bit for bit: a reduced model (p = 23,
  d = 32, one layer), 8 epochs, B2 (the arm whose frame update is batched too).
* The lease's plan, budget and packing, with its commands replaced by fakes (no
  training): what it runs in which order, what it leaves for the next lease, and what
  comes back (at most 8 files of at most 16 MiB, never half an archive).
* Slow: the whole script at `--tiny` sizes on the CPU, and a lease cut off (killed) in
  the middle of a run whose next lease, on a fresh machine, resumes it to the result of
  an uninterrupted run.
"""

import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import types

import jax
import numpy as np
import pytest

from stiefax.experiments import cli
from stiefax.experiments.checkpoints import Checkpoints
from stiefax.experiments.grok import command as grok_command
from stiefax.experiments.grok import config as grok_config
from stiefax.experiments.grok import runs as grok_runs
from stiefax.experiments.grok import training as grok_training
from studies import archive
from studies import gpu
from tests import harness

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = dataclasses.replace(harness.TINY_GROK, epochs=8, eval_every=2)  # 4 windows
ARM, SEEDS = "B2", [0, 1]


@pytest.fixture(scope="module")
def vmapped():
  """B2, seeds 0 and 1 as one program, uninterrupted (compiled under the tests' strict
  rank promotion, so that the tests' runs reuse its programs)."""
  with jax.numpy_rank_promotion("raise"):
    return grok_training.train_seeds(CONFIG, ARM, SEEDS, vmap=True, progress=False)


@pytest.fixture(scope="module")
def separate():
  with jax.numpy_rank_promotion("raise"):
    return [grok_training.train(CONFIG, ARM, s, progress=False) for s in SEEDS]


#: How close a vmapped run is to separate runs after 8 full-batch steps on the CPU
#: (batched matrix products round differently): ``(rtol, atol)`` per history entry.
#: Accuracies, losses and entropies agree to float32 rounding; the isometry error of
#: B2's frames is float32 rounding itself (about 1e-7), so only its absolute size is
#: compared; the largest logit is a maximum over rounding-level ties; the effective
#: learning rate is a ratio of Adam steps, and Adam turns rounding-level gradient entries
#: into full-size steps, so it agrees to a few tens of per cent.
VMAP_TOLERANCE = {
  "epoch": (0, 0),
  "train_acc": (0, 1.5 / 365),  # one training example
  "test_acc": (0, 1.5 / 164),  # one held-out example
  "train_loss": (1e-5, 0),
  "isometry": (0, 2e-6),
  "isometry_key": (0, 2e-6),
  "attn_entropy": (1e-5, 0),
  "max_logit": (1e-2, 0),
  "elr_frames": (0.3, 0),
  "elr_matrices": (0.3, 0),
  "elr_vectors": (0.3, 0),
}


def test_vmapped_seeds_equal_separate_runs_to_float32_rounding(vmapped, separate):
  assert [r["seed"] for r in vmapped] == SEEDS
  for v, s in zip(vmapped, separate):
    assert v["vmapped_seeds"] == SEEDS and s["vmapped_seeds"] is None
    assert v["config"]["device"] == s["config"]["device"] == grok_training.device_name()
    assert set(v["history"]) == set(s["history"]) == set(VMAP_TOLERANCE)
    for key, (rtol, atol) in VMAP_TOLERANCE.items():
      np.testing.assert_allclose(v["history"][key], s["history"][key], rtol, atol, err_msg=key)
    assert v["metrics"]["grokked_epoch"] == s["metrics"]["grokked_epoch"]
  a, b = (np.asarray(r["history"]["train_loss"]) for r in vmapped)
  assert not np.allclose(a, b)  # each seed is its own run


class _Clock:
  """A fake ``time.monotonic`` that each training window advances by ``step`` seconds."""

  def __init__(self, step: float):
    self.now, self.step = 0.0, step

  def __call__(self) -> float:
    return self.now


def _fake_time(monkeypatch, clock, *modules):
  fake = types.SimpleNamespace(monotonic=clock, perf_counter=time.perf_counter, sleep=time.sleep)
  for module in modules:
    monkeypatch.setattr(module, "time", fake)


def _windows(monkeypatch, clock, kill_at=None):
  """Counts the training windows; each advances ``clock``; window ``kill_at`` raises
  before it trains (a process killed there: no checkpoint on the way out)."""
  calls = []
  programs = grok_training.programs

  def wrapped(*key):
    init, chunk, evaluate = programs(*key)

    def counted(*a):
      calls.append(1)
      if len(calls) == kill_at:
        raise RuntimeError("killed")
      clock.now += clock.step
      return chunk(*a)

    return init, counted, evaluate

  monkeypatch.setattr(grok_training, "programs", wrapped)
  return calls


def _assert_identical(resumed: list, whole: list) -> None:
  """Bit for bit: every history entry and metric of every seed."""
  for r, w in zip(resumed, whole):
    assert r["seed"] == w["seed"]
    assert r["history"].keys() == w["history"].keys()
    for key, values in w["history"].items():
      np.testing.assert_array_equal(r["history"][key], values, err_msg=key)
    assert r["metrics"] == w["metrics"]


def test_a_run_killed_after_a_wall_time_checkpoint_resumes_bit_for_bit(
  tmp_path, monkeypatch, vmapped
):
  """Windows of 10 s, a checkpoint once 15 s have passed: saved after window 2 (t = 20
  s, epoch 4); killed in window 3, the run resumes from epoch 4 to the uninterrupted
  result."""
  clock = _Clock(step=10.0)
  _fake_time(monkeypatch, clock, grok_training)
  ckpts = [Checkpoints(tmp_path / f"s{s}.ckpt") for s in SEEDS]
  calls = _windows(monkeypatch, clock, kill_at=3)
  with pytest.raises(RuntimeError, match="killed"):
    grok_training.train_seeds(
      CONFIG, ARM, SEEDS, progress=False, checkpoints=ckpts, checkpoint_seconds=15.0
    )
  assert len(calls) == 3 and [c.latest_epoch() for c in ckpts] == [4, 4]
  calls = _windows(monkeypatch, clock)
  resumed = grok_training.train_seeds(
    CONFIG, ARM, SEEDS, progress=False, checkpoints=ckpts, checkpoint_seconds=15.0
  )
  assert len(calls) == 2 and all(r["resumed_from"] == 4 for r in resumed)
  _assert_identical(resumed, vmapped)


def test_without_wall_time_checkpoints_the_kill_loses_the_run(tmp_path, monkeypatch):
  """The control: no ``checkpoint_seconds``, no checkpoint before the kill."""
  clock = _Clock(step=10.0)
  _fake_time(monkeypatch, clock, grok_training)
  ckpts = [Checkpoints(tmp_path / f"s{s}.ckpt") for s in SEEDS]
  _windows(monkeypatch, clock, kill_at=3)
  with pytest.raises(RuntimeError, match="killed"):
    grok_training.train_seeds(CONFIG, ARM, SEEDS, progress=False, checkpoints=ckpts)
  assert [c.latest_epoch() for c in ckpts] == [None, None]


@pytest.fixture
def tiny_preset(monkeypatch):
  monkeypatch.setitem(grok_config.PRESETS, "tiny", dict(config=CONFIG, arms=(ARM,), seeds=(0,)))
  return "tiny"


def test_the_time_limit_stops_checkpointed_and_the_same_command_resumes(
  tmp_path, monkeypatch, capsys, tiny_preset, vmapped
):
  """``--time-limit 25`` with windows of 10 s: the first window (compiling) is not
  counted, so the command stops after the third (epoch 6), checkpointed, with status 75
  and the runs left listed; the same command, rerun, ends them as if never stopped."""
  clock = _Clock(step=10.0)
  _fake_time(monkeypatch, clock, grok_training, grok_command)
  argv = ["grok", "--preset", tiny_preset, "--arms", ARM, "--seeds", "0,1", "--vmap-seeds"]
  argv += ["--out", str(tmp_path), "--no-progress"]
  calls = _windows(monkeypatch, clock)
  assert cli.main([*argv, "--time-limit", "25"]) == grok_command.jobs.EXIT_TIME_LIMIT == 75
  out, err = capsys.readouterr()
  assert len(calls) == 3
  assert "time limit: stopped B2 seeds 0,1 at epoch 6; checkpoint at epoch 6" in err
  assert "time limit of 25 s reached; 0 of 2 run(s) finished, 2 left:" in out
  names = [grok_runs.run_file_name(CONFIG, ARM, s, tiny_preset) for s in SEEDS]
  for name in names:
    assert f"B2 seed {name[-6]}: checkpoint at epoch 6 ({name[:-5]}.ckpt)" in out
  calls = _windows(monkeypatch, clock)
  assert cli.main(argv) == 0
  assert len(calls) == 1  # epochs 6-8
  resumed = [json.loads((tmp_path / n).read_text()) for n in names]
  assert all(r["resumed_from"] == 6 and r["vmapped_seeds"] == SEEDS for r in resumed)
  assert resumed[0]["config"]["device"] == grok_training.device_name()
  _assert_identical(resumed, vmapped)
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)  # no checkpoint left


@pytest.mark.parametrize("flag", ["--time-limit", "--checkpoint-seconds"])
@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_the_time_flags_need_positive_seconds(capsys, tmp_path, flag, value):
  argv = ["grok", flag, value, "--out", str(tmp_path)]
  harness.one_line_error(capsys, argv, f"{flag} {float(value):g}")


# ----------------------------------------------------------------------------
# The lease's plan, budget and packing, its commands replaced by fakes.
# ----------------------------------------------------------------------------


def test_the_plan_is_the_studies_in_their_order_of_value():
  labels = [e.label for e in gpu.plan()]
  assert labels == [
    "run (a) A2 seeds 0,1,2,3,4",
    "run (a) B2 seeds 0,1,2,3,4",
    "run (b) A2 seeds 0,1,2,3,4",
    "run (b) B2 seeds 0,1,2,3,4",
    "Table 5 A2-nwf seed 0",
    "Table 5 B2-hi seed 0",
    "Table 5 B2-sn seed 0",
    "Table 5 B2-comb seed 0",
  ]
  first, stabilized, table5 = gpu.plan()[0], gpu.plan()[2], gpu.plan()[4]
  assert first.argv(gpu.PAPER) == [
    "grok", "--preset", "paper", "--arms", "A2", "--seeds", "0,1,2,3,4", "--vmap-seeds"
  ]  # fmt: skip
  assert stabilized.argv(gpu.PAPER)[-1] == "--stabilize" and "--vmap-seeds" not in table5.argv(
    gpu.PAPER
  )
  # The lease's runs are the paper's runs: seed 0 of run (a) is the committed one.
  assert first.file_names(gpu.PAPER)[0] == "A2-paper-e20000-b229e9d2-s0.json"
  assert (ROOT / "results/grok" / first.file_names(gpu.PAPER)[0]).is_file()
  assert stabilized.file_names(gpu.PAPER)[3] == grok_runs.run_file_name(
    dataclasses.replace(grok_config.PAPER, **grok_config.STABILIZED), "A2", 3, "paper", True
  )


class _FakeDevice:
  """Stands for the lease's commands: the device check, the benchmark (``bench_s``
  seconds) and ``stiefax grok`` (``grok_s`` seconds per command, writing its runs)."""

  def __init__(self, clock, work, bench_s=470.0, grok_s=100.0):
    self.clock, self.work = clock, work
    self.bench_s, self.grok_s = bench_s, grok_s
    self.commands: list = []

  def __call__(self, argv, log, stop):
    argv = list(argv)
    self.commands.append(argv)
    if argv[0] == "-c":
      log("device: gpu Fake GPU")
      self.clock.now += 5.0
      return 0
    if argv[1] == "benchmarks.gpu":
      (self.work / "gpu").mkdir(parents=True, exist_ok=True)
      result = {"device": "gpu Fake GPU", "tiny": False, "skipped": []}
      (self.work / "gpu" / "gpu-2026-12-07.json").write_text(json.dumps(result))
      self.clock.now += self.bench_s
      return 0
    arm = argv[argv.index("--arms") + 1]
    seeds = tuple(int(s) for s in argv[argv.index("--seeds") + 1].split(","))
    entry = gpu.Entry("", arm, seeds, "--stabilize" in argv)
    for seed, name in entry.file_names(gpu.PAPER).items():
      if not (self.work / name).exists():
        record = harness.grok_record(arm, seed, grok_at=4000, stabilize=entry.stabilize)
        (self.work / name).write_text(json.dumps(record))
    self.clock.now += self.grok_s
    return 0


def _lease_args(tmp_path, budget, **kw):
  args = dict(
    budget=budget,
    tiny=False,
    out=str(tmp_path / "out"),
    work=str(tmp_path / "work"),
    results=str(tmp_path / "results"),
    carry=str(tmp_path / "carry"),
  )
  return types.SimpleNamespace(**{**args, **kw})


def _unpacked(out: pathlib.Path) -> dict:
  """``{name in the archive: bytes}`` of the newest whole archive in ``out``."""
  parts = archive.latest_archive(out)
  data = b"".join(p.read_bytes() for p in parts)
  import io  # pylint: disable=g-import-not-at-top

  with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _checkpoint_epochs(names) -> dict:
  """``{checkpoint folder: its newest step}`` of the run checkpoints among archive
  ``names``; empty unless both seeds' checkpoints are there."""
  steps: dict = {}
  for name in names:
    if ".ckpt/" in name:
      folder, rest = name.split(".ckpt/", 1)
      step = rest.split("/", 1)[0]
      if step.isdigit():
        steps[folder] = max(steps.get(folder, 0), int(step))
  return steps if len(steps) == 2 else {}


def test_the_budget_ends_the_lease_cleanly_and_lists_what_is_left(tmp_path, monkeypatch, capsys):
  """700 s: the device check (5 s), the benchmark (470 s), then run (a)'s A2 and B2
  (100 s each); the 25 s left are fewer than a grokking command needs (60 s + 15 s
  kept to pack), so six commands are left, and listed."""
  clock = _Clock(step=0.0)
  work = tmp_path / "work"
  device = _FakeDevice(clock, work)
  monkeypatch.setattr(gpu, "run_child", device)
  committed = harness.grok_record("A2", 0, grok_at=4600)  # run (a)'s seed 0 is committed
  name = gpu.plan()[0].file_names(gpu.PAPER)[0]
  (tmp_path / "results/grok").mkdir(parents=True)
  (tmp_path / "results/grok" / name).write_text(json.dumps(committed))
  assert gpu.lease(_lease_args(tmp_path, 700.0), clock=clock) == gpu.EXIT_LEFT
  out = capsys.readouterr().out
  kinds = [c[1] if c[0] == "-m" else c[0] for c in device.commands]
  assert kinds == ["-c", "benchmarks.gpu", "stiefax.experiments.cli", "stiefax.experiments.cli"]
  bench, first, second = device.commands[1:]
  assert bench[bench.index("--budget-s") + 1] == "420"
  for argv, left in ((first, 700 - 475), (second, 700 - 575)):
    assert argv[argv.index("--time-limit") + 1] == str(left - 15)
    assert argv[argv.index("--checkpoint-seconds") + 1] == "40"
    assert argv[argv.index("--out") + 1] == str(work) and "--vmap-seeds" in argv
  assert "run (b) A2 seeds 0,1,2,3,4: not started" in out
  assert "lease: 6 left for the next lease: studies/gpu.sh resumes them" in out
  # What comes back: the benchmark, the eight new runs (not the committed one) and the
  # lease's own account; and its log.
  got = _unpacked(tmp_path / "out")
  runs = sorted(n for n in got if n.startswith("grok/"))
  assert len(runs) == 9 and f"grok/{name}" not in runs
  assert "gpu/gpu-2026-12-07.json" in got
  manifest = json.loads(got["lease.json"])
  assert manifest["benchmark"] == "done"
  assert [e["progress"] for e in manifest["entries"][:3]] == ["finished", "finished", "not started"]
  assert (tmp_path / "out/lease.log").read_text().count("lease: ") >= 5
  # The next lease skips the benchmark and what is finished, and ends the rest.
  device.commands.clear()
  assert gpu.lease(_lease_args(tmp_path, 800.0), clock=clock) == gpu.EXIT_DONE
  assert [c[c.index("--arms") + 1] for c in device.commands[1:]] == [
    "A2", "B2", "A2-nwf", "B2-hi", "B2-sn", "B2-comb"
  ]  # fmt: skip
  assert "lease: every study is finished" in capsys.readouterr().out


def test_a_lease_shorter_than_the_benchmark_trains_instead(tmp_path, monkeypatch, capsys):
  """200 s: too short for the benchmark (480 s), which is left for a fresh lease; the
  grokking commands start at once: run (a)'s A2 with 180 s, B2 with the 80 s left."""
  clock = _Clock(step=0.0)
  device = _FakeDevice(clock, tmp_path / "work")
  monkeypatch.setattr(gpu, "run_child", device)
  assert gpu.lease(_lease_args(tmp_path, 200.0), clock=clock) == gpu.EXIT_LEFT
  assert [c[c.index("--time-limit") + 1] for c in device.commands[1:]] == ["180", "80"]
  assert "lease: benchmark: left (480 s needed, 195 s left)" in capsys.readouterr().out


def test_a_sigterm_ends_the_lease_after_the_command_in_training(tmp_path, monkeypatch, capsys):
  """SIGTERM (what ``timeout`` sends) during run (a)'s A2: it ends, the lease starts
  nothing more, packs and says what is left; its handler is then the previous one."""
  clock = _Clock(step=0.0)
  device = _FakeDevice(clock, tmp_path / "work")

  def terminated(argv, log, stop):
    code = device(argv, log, stop)
    if "--arms" in argv:
      os.kill(os.getpid(), signal.SIGTERM)
    return code

  monkeypatch.setattr(gpu, "run_child", terminated)
  before = signal.getsignal(signal.SIGTERM)
  assert gpu.lease(_lease_args(tmp_path, 2000.0), clock=clock) == gpu.EXIT_LEFT
  assert signal.getsignal(signal.SIGTERM) == before
  out = capsys.readouterr().out
  assert f"lease: signal {int(signal.SIGTERM)}: stopping the command in training" in out
  assert len(device.commands) == 3 and "run (a) B2 seeds 0,1,2,3,4: not started" in out
  manifest = json.loads(_unpacked(tmp_path / "out")["lease.json"])
  assert manifest["entries"][0]["progress"] == "finished"


def test_the_lease_forwards_sigterm_to_its_command_after_a_grace(monkeypatch):
  monkeypatch.setattr(gpu, "FORWARD_AFTER", 0.2)
  code = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('stopping', flush=True), sys.exit(3)))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
  )
  stop, lines = threading.Event(), []
  timer = threading.Timer(0.5, stop.set)
  timer.start()
  assert gpu.run_child(["-c", code], lines.append, stop) == 3
  timer.join()
  assert lines == ["  ready", "  stopping"]


def _checkpoint(folder: pathlib.Path, epoch: int, size: int, rng) -> pathlib.Path:
  """A stand-in for an Orbax checkpoint folder: a step folder of ``size`` bytes, and a
  save in progress (Orbax's temporary folder), which must not travel."""
  step = folder / str(epoch) / "state"
  step.mkdir(parents=True)
  (step / "data").write_bytes(rng.bytes(size))
  (folder / f"{epoch + 100}.orbax-checkpoint-tmp-1").mkdir()
  return folder


def test_the_archive_comes_back_whole_and_unpacks_without_overwriting(tmp_path, capsys):
  rng = np.random.default_rng(0)
  work, out = tmp_path / "work", tmp_path / "out"
  results, carry = tmp_path / "results", tmp_path / "carry"
  finished = harness.grok_record("A2", 1, grok_at=4000)
  entry = gpu.plan()[0]
  names = entry.file_names(gpu.PAPER)
  work.mkdir()
  (work / names[1]).write_text(json.dumps(finished))
  (work / "gpu").mkdir()
  (work / "gpu/gpu-2026-12-07.json").write_text('{"device": "gpu X", "tiny": false}')
  _checkpoint(work / names[2].replace(".json", ".ckpt"), 3400, 20 * 2**20, rng)
  _checkpoint(work / names[1].replace(".json", ".ckpt"), 3400, 10, rng)  # finished: stays
  (work / names[3].replace(".json", ".lock")).write_text("held")
  packer = archive.Packer(
    work, out, lambda name: False, lambda: {"created": "now", "benchmark": "done", "entries": []}
  )
  assert packer.pack() and not packer.pack()  # nothing new: no second pack
  parts = sorted(out.iterdir())
  assert [p.name for p in parts] == ["lease-g0001-p1of2.tar", "lease-g0001-p2of2.tar"]
  assert all(p.stat().st_size <= 15 * 2**20 and re.fullmatch(r"[\w.-]+", p.name) for p in parts)
  got = _unpacked(out)
  assert sorted(n.split("/")[0] for n in got) == ["gpu", "grok", "grok", "lease.json"]
  assert f"grok/{names[1]}" in got and not any(names[1][:-5] + ".ckpt" in n for n in got)
  assert not any("orbax-checkpoint-tmp" in n for n in got)
  # The newer pack replaces the older whole.
  (work / names[4]).write_text(json.dumps(harness.grok_record("A2", 4, grok_at=4000)))
  assert packer.pack()
  assert [p.name for p in sorted(out.iterdir())] == [
    "lease-g0002-p1of2.tar", "lease-g0002-p2of2.tar"
  ]  # fmt: skip
  # Here: the runs and the benchmark to results, the unfinished checkpoint carried.
  (results / "grok").mkdir(parents=True)  # a different copy of seed 4 is there already
  (results / "grok" / names[4]).write_text(json.dumps(harness.grok_record("A2", 4, grok_at=5000)))
  args = types.SimpleNamespace(dir=str(out), results=str(results), carry=str(carry))
  assert archive.unpack(args) == 0
  text = capsys.readouterr().out
  assert (results / "grok" / names[1]).read_text() == json.dumps(finished)
  assert json.loads((results / "grok" / names[4]).read_text())["metrics"]["grokked_epoch"] == 5000
  assert f"{names[4]} exists and differs; kept it" in text
  assert (results / "gpu/gpu-2026-12-07.json").is_file()
  ckpt = carry / names[2].replace(".json", ".ckpt")
  assert archive.checkpoint_epoch(ckpt) == 3400 and sorted(p.name for p in carry.iterdir()) == [
    ckpt.name
  ]
  assert not any("tmp" in p.name for p in ckpt.iterdir())
  assert (ckpt / "3400/state/data").stat().st_size == 20 * 2**20
  assert "1 new run(s)" in text and "1 checkpoint(s) carried" in text
  # Unpacked again: nothing new, nothing overwritten. Once the run is finished here,
  # its carried checkpoint goes.
  assert archive.unpack(args) == 0 and "0 new run(s)" in capsys.readouterr().out
  (results / "grok" / names[2]).write_text(json.dumps(harness.grok_record("A2", 2, grok_at=1)))
  assert archive.unpack(args) == 0
  assert "1 carried checkpoint(s) of finished runs removed" in capsys.readouterr().out
  assert not ckpt.exists()


def test_a_pack_that_raced_a_save_is_discarded(tmp_path, monkeypatch):
  """The work changed while it was read (a checkpoint saved, a run finished): nothing
  is written, and the previous archive stays whole."""
  work, out = tmp_path / "work", tmp_path / "out"
  work.mkdir()
  states = iter(range(100))
  monkeypatch.setattr(archive, "_listing", lambda work: next(states))
  packer = archive.Packer(work, out, lambda name: False, lambda: {})
  assert not packer.pack()
  assert not out.exists() or not any(out.iterdir())


def test_unpack_needs_a_whole_archive(tmp_path, capsys):
  (tmp_path / "lease-g0003-p1of2.tar").write_bytes(b"half")
  args = types.SimpleNamespace(dir=str(tmp_path), results=str(tmp_path), carry=str(tmp_path))
  assert archive.unpack(args) == 1
  assert "no whole lease archive" in capsys.readouterr().err


def test_status_says_what_is_finished_and_what_is_left(capsys):
  args = types.SimpleNamespace(
    results=str(ROOT / "results"), carry=str(ROOT / "studies/carry/grok"), tiny=False
  )
  code = gpu.status(args)
  text = capsys.readouterr().out
  assert code in (gpu.EXIT_DONE, gpu.EXIT_LEFT)
  assert re.search(r"^run \(a\) A2 seeds 0,1,2,3,4: (finished|seeds? 0\b.* finished)", text, re.M)
  assert len(re.findall(r"^(run \(a\)|run \(b\)|Table 5) ", text, re.M)) == 8


# ----------------------------------------------------------------------------
# Slow: the script itself, on the CPU.
# ----------------------------------------------------------------------------


def _script(*argv, env=None, **kw):
  env = dict(os.environ, PYTHON=sys.executable, JAX_PLATFORMS="cpu", **(env or {}))
  return subprocess.run(
    ["bash", str(ROOT / "studies/gpu.sh"), *argv], env=env, capture_output=True, text=True, **kw
  )


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_lease_script_runs_end_to_end_at_tiny_sizes(tmp_path):
  """The whole lease at ``--tiny`` sizes: the benchmark and every study, packed; the
  archive unpacked here; the report's study tables; a second lease finds nothing left."""
  paths = ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
  paths += ["--results", str(tmp_path / "results"), "--carry", str(tmp_path / "carry")]
  done = _script("--tiny", "--budget", "3000", *paths)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert "lease: every study is finished" in done.stdout
  back = sorted((tmp_path / "out").iterdir())
  files = [p for p in back if p.is_file()]
  assert len(files) <= 8 and all(p.stat().st_size <= 16 * 2**20 for p in files)
  assert [p.name for p in back if not p.is_file()] == []  # no staging left
  unpack = _script("unpack", str(tmp_path / "out"), *paths[4:])
  assert unpack.returncode == 0, unpack.stderr
  runs = sorted((tmp_path / "results/grok").glob("*.json"))
  assert len(runs) == 2 * 2 * 5 + 4
  record = json.loads(runs[0].read_text())
  assert record["config"]["device"] == "cpu cpu" and record["config"]["epochs"] == 4
  vmapped = [json.loads(p.read_text())["vmapped_seeds"] for p in runs]
  assert vmapped.count([0, 1, 2, 3, 4]) == 20 and vmapped.count(None) == 4
  assert len(list((tmp_path / "results/gpu").glob("cpu-tiny-*.json"))) == 1
  report = subprocess.run(
    [sys.executable, "-m", "stiefax.experiments.cli", "report", str(tmp_path / "results/grok")],
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  assert "run (b), B2 - A2: five seeds: not settled by the project's standard" in report.stdout
  assert "no runs yet" not in report.stdout
  again = _script("--tiny", "--budget", "600", *paths)
  assert again.returncode == 0 and "benchmark: done earlier" in again.stdout
  assert "training" not in again.stdout


_CUT = """
import dataclasses, sys
from studies import archive
from studies import gpu
gpu.TINY = dataclasses.replace(
  gpu.TINY, grok=("--preset", "quick", "--epochs", "300", "--eval-every", "10")
)
gpu.plan = lambda: [gpu.Entry("run (a)", "B2", (0, 1), False)]
sys.exit(gpu.main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_lease_cut_off_mid_run_resumes_on_a_fresh_machine(tmp_path):
  """B2, seeds 0 and 1 (300 epochs at tiny sizes): the lease is killed (SIGKILL, the
  whole process group) as soon as an archive holding both checkpoints has come back; its
  files are unpacked here, and the next lease, in a fresh work folder, resumes from the
  carried checkpoint to the result of an uninterrupted run, bit for bit (one machine)."""
  script = tmp_path / "cut.py"
  script.write_text(_CUT)
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  results, carry = tmp_path / "results", tmp_path / "carry"
  (results / "gpu").mkdir(parents=True)  # the benchmark is done: not this test's part
  (results / "gpu/cpu-tiny-2026-12-07.json").write_text('{"device": "cpu cpu", "tiny": true}')

  def lease(name):
    argv = [sys.executable, str(script), "--tiny", "--budget", "1500"]
    argv += ["--out", str(tmp_path / name / "out"), "--work", str(tmp_path / name / "work")]
    argv += ["--results", str(results), "--carry", str(carry)]
    return subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True, text=True)

  first = lease("first")
  deadline = time.monotonic() + 1200
  while time.monotonic() < deadline and first.poll() is None:
    out = tmp_path / "first/out"
    parts = archive.latest_archive(out) if out.is_dir() else []
    # Both seeds' checkpoints at one epoch: they are saved one after the other, so an
    # archive can come back between the two saves.
    if parts and len(set(_checkpoint_epochs(_unpacked(out)).values())) == 1:
      break
    time.sleep(0.1)
  assert first.poll() is None, "the run ended before a checkpoint came back"
  os.killpg(first.pid, signal.SIGKILL)
  first.wait()
  args = types.SimpleNamespace(
    dir=str(tmp_path / "first/out"), results=str(results), carry=str(carry)
  )
  assert archive.unpack(args) == 0
  carried = sorted(carry.glob("*.ckpt"))
  at = [archive.checkpoint_epoch(c) for c in carried]
  assert len(carried) == 2 and all(0 < a < 300 for a in at)
  second = lease("second")
  assert second.wait(timeout=1200) == 0
  assert (
    archive.unpack(types.SimpleNamespace(**{**vars(args), "dir": str(tmp_path / "second/out")}))
    == 0
  )
  assert list(carry.glob("*.ckpt")) == []  # finished: the carried checkpoints are gone
  resumed = [json.loads(p.read_text()) for p in sorted((results / "grok").glob("*.json"))]
  assert [r["resumed_from"] for r in resumed] == at
  whole = tmp_path / "whole"
  argv = ["grok", "--preset", "quick", "--epochs", "300", "--eval-every", "10"]
  argv += ["--arms", "B2", "--seeds", "0,1", "--vmap-seeds", "--out", str(whole), "--no-progress"]
  assert (
    subprocess.run(
      [sys.executable, "-m", "stiefax.experiments.cli", *argv], cwd=ROOT, env=env
    ).returncode
    == 0
  )
  _assert_identical(resumed, [json.loads(p.read_text()) for p in sorted(whole.glob("*.json"))])
