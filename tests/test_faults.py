"""Faults and abuse: every row of issue 26, reproduced with real files, links and signals.

Each test names its row. Nothing outside the command's ``--out`` (or ``--cache``) may
be created, changed or removed: every test keeps a folder ``outside`` with a file in
it and checks it afterwards. The grokking runs use the tiny preset (in this process,
so the compiled programs are shared), the signal tests a real ``stiefax`` process.
"""

import dataclasses
import errno
import gc
import inspect
import json
import os
import pathlib
import pickle
import re
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stiefax
from stiefax.experiments import cli
from stiefax.experiments import flags
from stiefax.experiments import store
from stiefax.experiments.checkpoints import Checkpoints
from stiefax.experiments.grok import config as grok_config
from stiefax.experiments.grok import runs as grok_runs
from stiefax.experiments.grok import training as grok_training
from stiefax.experiments.patches import images as patch_images
from tests import harness

CONFIG = dataclasses.replace(harness.TINY_GROK, epochs=40, eval_every=20)


@pytest.fixture
def tiny(monkeypatch):
  monkeypatch.setitem(
    grok_config.PRESETS, "tiny", dict(config=harness.TINY_GROK, arms=("A2", "B2"), seeds=(0,))
  )
  return "tiny"


def _argv(out, *extra):
  return [
    "grok",
    "--preset",
    "tiny",
    "--epochs",
    "40",
    "--eval-every",
    "20",
    "--arms",
    "B2",
    "--seeds",
    "0",
    "--out",
    str(out),
    *extra,
  ]


def _run_path(out) -> pathlib.Path:
  return pathlib.Path(out) / grok_runs.run_file_name(CONFIG, "B2", 0, "tiny")


@pytest.fixture
def outside(tmp_path):
  """A folder outside every ``--out``, with a file: it must never change."""
  folder = tmp_path / "outside"
  folder.mkdir()
  (folder / "keep.txt").write_text("precious")
  return folder


def _untouched(folder: pathlib.Path) -> None:
  assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]
  assert (folder / "keep.txt").read_text() == "precious"


def _one_line(capsys, argv, match, rc=2) -> str:
  code = cli.main(argv)
  err = capsys.readouterr().err.strip()
  assert code == rc, err
  lines = [ln for ln in err.splitlines() if "error" in ln]
  assert len(lines) == 1 and "Traceback" not in err, err
  assert match in lines[0], err
  return lines[0]


def _crash_after(monkeypatch, calls_before_crash: int) -> None:
  """The next grok run dies (RuntimeError) in evaluation window ``calls_before_crash + 1``."""
  programs = grok_training.programs
  calls = []

  def wrapped(*key):
    init, chunk, evaluate = programs(*key)

    def counted(*a):
      calls.append(1)
      if len(calls) > calls_before_crash:
        raise RuntimeError("power cut")
      return chunk(*a)

    return init, counted, evaluate

  monkeypatch.setattr(grok_training, "programs", wrapped)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """One finished tiny B2 run, trained in this process."""
  out = tmp_path_factory.mktemp("finished")
  # The tests' own promotion rule (conftest), so that the compiled programs are shared.
  with pytest.MonkeyPatch.context() as mp, jax.numpy_rank_promotion("raise"):
    mp.setitem(
      grok_config.PRESETS, "tiny", dict(config=harness.TINY_GROK, arms=("B2",), seeds=(0,))
    )
    old = os.umask(0o022)
    try:
      assert cli.main(_argv(out, "--checkpoint-every", "20")) == 0
    finally:
      os.umask(old)
  return out


# ------------------------------------------------------------------------ row 1: a linked .ckpt


def test_row1_a_linked_checkpoint_folder_is_moved_aside_and_its_target_untouched(
  tmp_path, outside, tiny, capsys
):
  out = tmp_path / "out"
  out.mkdir()
  link = _run_path(out).with_suffix(".ckpt")
  link.symlink_to(outside, target_is_directory=True)
  assert cli.main(_argv(out, "--checkpoint-every", "20")) == 0
  err = capsys.readouterr().err
  assert "is unusable (it is a symbolic link); moved it to" in err
  _untouched(outside)
  assert _run_path(out).is_file() and not os.path.lexists(link)
  aside = [p for p in out.iterdir() if ".ckpt.damaged-" in p.name]
  assert len(aside) == 1 and aside[0].is_symlink()  # the link itself, renamed


def test_row1_checkpoint_cleanup_refuses_links(tmp_path, outside):
  link = tmp_path / "run.ckpt"
  link.symlink_to(outside, target_is_directory=True)
  with pytest.raises(OSError, match="symbolic link"):
    Checkpoints(link).remove()
  with pytest.raises(OSError, match="symbolic link"):
    store.remove_folder(link)
  assert Checkpoints(link).directory == pathlib.Path(os.path.abspath(link))  # not resolved
  _untouched(outside)
  real = tmp_path / "real.ckpt"
  (real / "1").mkdir(parents=True)
  (real / "1" / "inner-link").symlink_to(outside, target_is_directory=True)
  store.remove_folder(real)  # a real folder goes, the links inside are not followed
  assert not real.exists()
  _untouched(outside)


# ---------------------------------------------------------------------- row 2: a linked .lock


def test_row2_a_linked_lock_is_refused_and_its_target_untouched(tmp_path, outside, tiny, capsys):
  victim = outside / "keep.txt"
  lock = tmp_path / "run.lock"
  lock.symlink_to(victim)
  with pytest.raises(OSError, match="symbolic link"):
    store.RunLock(lock).acquire()
  out = tmp_path / "out"
  out.mkdir()
  _run_path(out).with_suffix(".lock").symlink_to(victim)
  _one_line(capsys, _argv(out), "a symbolic link, not a lock file")
  _untouched(outside)
  assert not _run_path(out).exists()


def test_row2_a_linked_result_is_never_read_nor_written_through(tmp_path, outside):
  link = tmp_path / "run.json"
  (outside / "keep.txt").write_text('{"seed": 0}')
  link.symlink_to(outside / "keep.txt")
  assert store.finished_run(link, lambda run: True) == (None, "it is a symbolic link")
  with pytest.raises(FileExistsError):
    store.write_json(link, {"seed": 1})
  store.write_json(link, {"seed": 2}, overwrite=True)  # replaces the link itself
  assert not link.is_symlink() and json.loads(link.read_text()) == {"seed": 2}
  assert (outside / "keep.txt").read_text() == '{"seed": 0}'
  (outside / "keep.txt").write_text("precious")
  _untouched(outside)


# ---------------------------------------------------------------------- row 3: a linked plot


def test_row3_a_linked_plot_is_replaced_not_its_target(finished, tmp_path, outside, capsys):
  plots = tmp_path / "plots"
  plots.mkdir()
  victim = outside / "keep.txt"
  (plots / "grok_accuracy.png").symlink_to(victim)
  assert cli.main(["report", str(finished), "--plots", str(plots)]) == 0
  capsys.readouterr()
  _untouched(outside)
  png = plots / "grok_accuracy.png"
  assert not png.is_symlink() and png.read_bytes().startswith(b"\x89PNG")


# ------------------------------------------------------------------- row 4: a crafted pickle


class _Payload:
  """Unpickling this object calls ``open(marker, "w")``: it creates the marker file."""

  def __init__(self, marker):
    self.marker = str(marker)

  def __reduce__(self):
    return (open, (self.marker, "w"))


def test_row4_a_crafted_cifar_batch_is_refused_and_never_run(tmp_path, capsys):
  copy = harness.write_cifar(tmp_path)
  marker = tmp_path / "pwned"
  evil = pickle.dumps({b"data": _Payload(marker), b"labels": [0]})
  (copy["folder"] / "data_batch_1").write_bytes(evil)
  with pytest.raises(flags.CommandError, match=r"data_batch_1.*refused to load _?io\.open"):
    patch_images.load_images(str(copy["folder"]))
  assert not marker.exists()
  out = tmp_path / "out"
  argv = ["patches", "--data", str(copy["folder"]), "--no-cache", "--out", str(out)]
  _one_line(capsys, argv, "data_batch_1 is not a CIFAR-10 python batch")
  assert not marker.exists()


def test_row4_real_cifar_batches_still_load(tmp_path):
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
  for protocol in (2, 4, 5):  # Python 2's batches are protocol 2; numpy 2 uses _frombuffer at 5
    batch = {b"data": x, b"labels": [1, 2, 3], b"batch_label": b"b", b"filenames": [b"a"] * 3}
    got = patch_images.load_cifar_pickle(pickle.dumps(batch, protocol=protocol))
    np.testing.assert_array_equal(got[b"data"], x)
    assert got[b"labels"] == [1, 2, 3]
  copy = harness.write_cifar(tmp_path)
  images = patch_images.load_images(str(copy["archive"]))
  np.testing.assert_array_equal(images.train_y, copy["train_y"])


# -------------------------------------------------------- rows 5-8: settings checked when built


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(max_norm=-0.1), "max_norm must be finite, > 0 and <= 1e15, or None"),  # row 5
    (dict(max_norm=float("nan")), "max_norm must be finite, > 0 and <= 1e15, or None"),  # row 6
    (dict(eps=float("nan")), "eps must be finite and >= 0"),  # row 7
    (dict(eps=float("inf")), "eps must be finite and >= 0"),
    (dict(eps=-1e-8), "eps must be finite and >= 0"),
    (dict(b2=1.5), "b2 must be in [0, 1)"),  # row 8
    (dict(b1=1.0), "b1 must be in [0, 1)"),
    (dict(b1=-0.1), "b1 must be in [0, 1)"),
    (dict(learning_rate=float("nan")), "learning_rate must be finite, >= 0 and <= 1e15"),
  ],
)
def test_rows5_to_8_riemannian_adam_checks_its_settings(kwargs, match):
  for fused in (True, False):
    with pytest.raises(
      ValueError, match=re.escape(f"stiefax.riemannian_adam: {next(iter(kwargs))}")
    ):
      stiefax.riemannian_adam(**{"learning_rate": 1.0, **kwargs}, fused=fused)
  with pytest.raises(ValueError, match=re.escape(match)):
    stiefax.riemannian_adam(**{"learning_rate": 1.0, **kwargs})


@pytest.mark.parametrize(
  "build,match",
  [
    (lambda: stiefax.scalar_moment(b1=1.2), "scalar_moment: b1 must be in [0, 1)"),
    (lambda: stiefax.elementwise_moment(eps=float("nan")), "elementwise_moment: eps"),
    (lambda: stiefax.step_norm_cap(0.0), "step_norm_cap: max_norm must be finite, > 0"),
    (lambda: stiefax.polar_retract(step_bound=float("inf")), "polar_retract: step_bound"),
    (lambda: stiefax.riemannian_sgd(float("inf")), "riemannian_sgd: learning_rate"),
    (lambda: stiefax.stiefel_adamw(1e-3, b2=1.0), "stiefel_adamw: b2 must be in [0, 1)"),
    (lambda: stiefax.stiefel_adamw(1e-3, weight_decay=-1.0), "stiefel_adamw: weight_decay"),
    (lambda: stiefax.sphere.sphere_adam(1.0, max_norm=-1.0), "sphere_adam: max_norm"),
    (lambda: stiefax.manifold_muon(0.1, beta=1.5), "manifold_muon: beta must be in [0, 1)"),
    (lambda: stiefax.manifold_muon(0.1, ns_iterations=0), "ns_iterations must be an int >= 1"),
  ],
)
def test_row8_every_transform_and_alias_checks_its_settings(build, match):
  with pytest.raises(ValueError, match=re.escape(match)):
    build()


def test_rows5_to_8_the_patches_command_checks_the_same_settings(tmp_path, capsys):
  for flag, value, match in (
    ("--max-norm", "-0.1", "--max-norm must be > 0"),
    ("--max-norm", "nan", "--max-norm must be a finite number"),
    ("--eps", "nan", "--eps must be a finite number"),
    ("--eps", "inf", "--eps must be a finite number"),
  ):
    out = tmp_path / "out"
    _one_line(capsys, ["patches", flag, value, "--out", str(out), "--no-cache"], match)
    assert not out.exists() or not any(out.iterdir())


def _skips(state) -> list:
  return [int(jnp.sum(x)) for _, x in optax.tree_utils.tree_get_all_with_path(state, "skipped")]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("bad", ["eps", "max_norm", "learning_rate", "b2"])
def test_rows6_7_an_injected_setting_that_turns_bad_is_a_counted_skip(fused, bad):
  w = stiefax.flax.orthonormal_init()(jax.random.key(0), (8, 2, 4))
  g = jax.random.normal(jax.random.key(1), w.shape)
  tx = optax.inject_hyperparams(stiefax.riemannian_adam, static_args=("fused",))(
    learning_rate=1.0, fused=fused
  )
  state = tx.init(w)
  w, state = _step(tx, w, g, state)
  assert sum(_skips(state)) == 0
  state.hyperparams[bad] = jnp.asarray(jnp.nan)  # a schedule or a controller turned NaN
  w2, state = _step(tx, w, g, state)
  np.testing.assert_array_equal(w2, w)  # the frames keep their point
  assert sum(_skips(state)) == 2  # both heads counted, as for a non-finite gradient
  assert float(stiefax.diagnostics.isometry_error(w2)) < 1e-5


def test_row6_a_schedule_that_turns_nan_is_a_counted_skip():
  w = stiefax.flax.orthonormal_init()(jax.random.key(0), (8, 2, 4))
  g = jax.random.normal(jax.random.key(1), w.shape)
  schedule = lambda count: jnp.where(count >= 1, jnp.nan, 1.0)
  for tx in (stiefax.riemannian_adam(schedule), stiefax.manifold_muon(schedule)):
    state = tx.init(w)
    w1, state = _step(tx, w, g, state)
    w2, state = _step(tx, w1, g, state)
    np.testing.assert_array_equal(w2, w1)
    assert sum(_skips(state)) == 2


def _step(tx, w, g, state):
  updates, state = tx.update(g, state, w)
  return optax.apply_updates(w, updates), state


# ------------------------------------------------------------ row 9: certify --json overwrite


def test_row9_certify_json_refuses_an_existing_file_unless_force(tmp_path, capsys):
  path = tmp_path / "A2-quick-s0.json"
  path.write_text('{"a finished": "result"}')
  argv = ["certify", "--only", "tangent_projection", "--json", str(path)]
  _one_line(capsys, argv, "the file exists; give --force")
  assert path.read_text() == '{"a finished": "result"}'
  assert cli.main([*argv, "--force"]) == 0
  assert "moved the earlier" in capsys.readouterr().err
  assert json.loads(path.read_text())[0]["name"] == "tangent_projection"
  (aside,) = [p for p in tmp_path.iterdir() if ".replaced-" in p.name]
  assert aside.read_text() == '{"a finished": "result"}'


# --------------------------------------------------------------- row 10: a damaged checkpoint


def _largest_file(folder: pathlib.Path) -> pathlib.Path:
  files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
  return max(files, key=lambda p: p.stat().st_size)


def _abandoned_read(u) -> bool:
  """Whether the unraisable exception ``u`` comes from a read that Orbax abandoned."""
  if inspect.iscoroutine(u.object):  # closed by the garbage collector
    return "orbax" in pathlib.Path(u.object.cr_code.co_filename).parts
  # TensorStore, finishing the read, wakes the event loop that Orbax closed.
  return isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed"


@pytest.fixture
def abandoned_reads_dropped():
  """Drops the unraisable exceptions of the reads a failed Orbax restore abandons.

  Orbax (0.12) restores in an event loop of its own and closes it when a read fails,
  with the reads of the other arrays still pending; each raises from its ``except
  BaseException`` when TensorStore finishes it ("Event loop is closed") or the garbage
  collector closes it, at any later time. pytest reports those under whichever test is
  running then, each with Orbax's whole TensorStore spec (about 80 lines). The test
  collects them before it ends; any other unraisable exception is reported as usual.
  """
  report = sys.unraisablehook
  sys.unraisablehook = lambda u: None if _abandoned_read(u) else report(u)
  try:
    yield
    gc.collect()
  finally:
    sys.unraisablehook = report


@pytest.mark.parametrize("damage", ["truncate", "flip"])
@pytest.mark.usefixtures("abandoned_reads_dropped")
def test_row10_a_damaged_checkpoint_is_moved_aside_and_the_run_restarts(
  damage, tmp_path, tiny, monkeypatch, capsys
):
  out = tmp_path / "out"
  _crash_after(monkeypatch, 1)  # the checkpoint at epoch 20 is written, then a crash
  with pytest.raises(RuntimeError, match="power cut"):
    cli.main(_argv(out, "--checkpoint-every", "20"))
  ckpt = _run_path(out).with_suffix(".ckpt")
  assert Checkpoints(ckpt).latest_epoch() == 20
  victim = _largest_file(ckpt)
  data = bytearray(victim.read_bytes())
  if damage == "truncate":
    victim.write_bytes(data[: len(data) // 2])
  else:  # one bit every 997 bytes: a single flip may land in bytes a restore never reads
    for i in range(0, len(data), 997):
      data[i] ^= 0x10
    victim.write_bytes(bytes(data))
  monkeypatch.undo()
  monkeypatch.setitem(
    grok_config.PRESETS, "tiny", dict(config=harness.TINY_GROK, arms=("B2",), seeds=(0,))
  )
  assert cli.main(_argv(out, "--checkpoint-every", "20")) == 0
  err = capsys.readouterr().err
  notes = [ln for ln in err.splitlines() if "is unusable" in ln]
  assert len(notes) == 1 and "moved it to" in notes[0] and "Traceback" not in err, err
  run = json.loads(_run_path(out).read_text())
  assert run["resumed_from"] is None and run["history"]["epoch"] == [0, 20, 40]
  names = sorted(p.name for p in out.iterdir())
  assert len(names) == 2 and _run_path(out).name in names
  assert any(".ckpt.damaged-" in n for n in names)  # kept for inspection, not deleted


# ------------------------------------------------------------ row 11: a full disk


def _no_space(*args, **kwargs):
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_row11_disk_full_while_locking_leaves_no_lock(tmp_path, tiny, monkeypatch, capsys):
  out = tmp_path / "out"
  monkeypatch.setattr(store, "_write_all", _no_space)
  _one_line(capsys, _argv(out), "No space left on device")
  assert list(out.iterdir()) == []  # no empty .lock left behind


def test_row11_disk_full_while_writing_a_result_leaves_nothing(tmp_path, monkeypatch):
  path = tmp_path / "r.json"
  monkeypatch.setattr(store.os, "fsync", _no_space)
  with pytest.raises(OSError, match="No space left"):
    store.write_json(path, {"a": 1})
  assert list(tmp_path.iterdir()) == []  # no temporary file, no half-written result


def test_row11_disk_full_while_saving_a_checkpoint_is_one_line(tmp_path, tiny, monkeypatch, capsys):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  def full_disk(self, step, *args, **kwargs):
    partial = pathlib.Path(self.directory) / f"{step}.orbax-checkpoint-tmp-1"
    partial.mkdir(parents=True)
    (partial / "half").write_bytes(b"\0" * 10)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk)
  out = tmp_path / "out"
  _one_line(capsys, _argv(out, "--checkpoint-every", "20"), "(No space left on device)")
  leftovers = [p.relative_to(out) for p in out.rglob("*")]
  assert all(p.parts[0].endswith(".ckpt") and len(p.parts) == 1 for p in leftovers), leftovers


# ------------------------------------------------------- row 12: unwritable cache and folders


def test_row12_an_unwritable_cache_or_out_is_one_line(tmp_path, capsys):
  blocker = tmp_path / "a-file"
  blocker.write_text("")
  out = tmp_path / "out"
  _one_line(capsys, ["patches", "--cache", str(blocker), "--out", str(out)], "is a file")
  _one_line(capsys, ["patches", "--cache", str(blocker / "sub"), "--out", str(out)], "cannot write")
  _one_line(capsys, ["patches", "--out", str(blocker / "sub"), "--no-cache"], "cannot write there")
  assert blocker.read_text() == ""


def test_row12_a_failing_cache_write_is_a_notice(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(store.os, "fsync", _no_space)
  assert patch_images.save_npz(tmp_path / "c.npz", a=np.zeros(3)) is False
  assert "cannot write the cache file" in capsys.readouterr().err
  assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------- row 13: seed range


@pytest.mark.parametrize(
  "argv",
  [
    ["grok", "--seeds", "99999999999999999999"],
    ["grok", "--seeds", "4294967296"],
    ["grok", "--seeds", "0,-1"],
    ["certify", "--seed", "-1"],
    ["certify", "--seed", "4294967296"],
    ["patches", "--seeds", "4294967296", "--no-cache"],
    ["patches", "--order-seed", "-1", "--no-cache"],
  ],
)
def test_row13_seeds_outside_32_bits_are_one_line(argv, tmp_path, capsys):
  out = tmp_path / "out"
  extra = [] if argv[0] == "certify" else ["--out", str(out)]
  _one_line(capsys, argv + extra, "below 2**32")
  assert not out.exists() or not any(out.iterdir())


# --------------------------------------------------------- rows 14, 15: SIGTERM, a second Ctrl-C

_SCRIPT = """
import sys
from stiefax.experiments import cli
from stiefax.experiments.grok import config as grok_config
from tests.harness import TINY_GROK
grok_config.PRESETS["tiny"] = dict(config=TINY_GROK, arms=("B2",), seeds=(0,))
sys.exit(cli.main())
"""


def _start(tmp_path, out):
  root = pathlib.Path(__file__).resolve().parent.parent
  script = tmp_path / "stiefax_tiny.py"
  script.write_text(_SCRIPT)
  env = dict(os.environ, PYTHONPATH=str(root), JAX_PLATFORMS="cpu")
  argv = ["grok", "--preset", "tiny", "--epochs", "100000", "--eval-every", "20"]
  argv += ["--arms", "B2", "--seeds", "0", "--checkpoint-every", "20", "--out", str(out)]
  return subprocess.Popen(
    [sys.executable, str(script), *argv],
    cwd=root,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def _wait_for_checkpoint(ckpt: pathlib.Path, proc, timeout=120.0) -> None:
  end = time.monotonic() + timeout
  while time.monotonic() < end and proc.poll() is None:
    if ckpt.is_dir() and any(p.name.isdigit() for p in ckpt.iterdir()):
      return
    time.sleep(0.2)
  raise AssertionError(f"no checkpoint appeared (exit status {proc.poll()})")


_STOP_SCRIPT = """
import sys, time
from stiefax.experiments import store
from stiefax.experiments.stopping import StopRequest
lock = store.RunLock(sys.argv[1])
assert lock.acquire()
with StopRequest("stiefax grok") as stop:
  print("ready", flush=True)
  while not stop.requested:
    time.sleep(0.01)
  print("stop requested by signal", stop.signum, flush=True)
  if sys.argv[2] == "wait":
    time.sleep(60)  # a long evaluation window: a second signal ends it
lock.release()
"""


@pytest.mark.parametrize("signals", [("TERM",), ("INT", "INT"), ("TERM", "INT")])
def test_rows14_15_the_training_loop_stops_on_sigterm_and_quietly_on_a_second_signal(
  signals, tmp_path
):
  root = pathlib.Path(__file__).resolve().parent.parent
  lock = tmp_path / "run.lock"
  proc = subprocess.Popen(
    [sys.executable, "-c", _STOP_SCRIPT, str(lock), "wait" if len(signals) > 1 else "go"],
    cwd=root,
    env=dict(os.environ, PYTHONPATH=str(root)),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  try:
    assert proc.stdout.readline().strip() == "ready"
    first = getattr(signal, "SIG" + signals[0])
    proc.send_signal(first)
    assert "stopping at the next evaluation and saving a checkpoint" in proc.stdout.readline() + (
      proc.stdout.readline()
    )
    assert proc.stdout.readline().strip() == f"stop requested by signal {int(first)}"
    for name in signals[1:]:
      proc.send_signal(getattr(signal, "SIG" + name))
    rest = proc.communicate(timeout=60)[0]
  finally:
    if proc.poll() is None:
      proc.kill()
  if len(signals) == 1:  # row 14: SIGTERM asks for a stop like Ctrl-C; the loop ends normally
    assert proc.returncode == 0, rest
  else:  # row 15: the second signal ends the process at once, in one line, no traceback
    assert proc.returncode == 128 + getattr(signal, "SIG" + signals[1]), rest
    assert "stopped at once" in rest and "Traceback" not in rest and "Exception" not in rest
  assert not lock.exists()  # released either way


_LATE_STOP_SCRIPT = """
import os, signal
from stiefax.experiments.stopping import StopRequest, Stopped
for run in range(3):
  try:
    with StopRequest("stiefax lm") as stop:
      if run == 0:  # the signal comes during the run's last chunk: no evaluation is left
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested
      print("finished run", run, flush=True)
  except Stopped as e:
    print("stopped before run", run, "by signal", e.signum, flush=True)
    break
with StopRequest("stiefax lm"):  # the request was served once: later runs go on
  print("a later request starts", flush=True)
"""


def test_row14_a_stop_that_comes_too_late_for_its_run_stops_the_command_before_the_next():
  root = pathlib.Path(__file__).resolve().parent.parent
  proc = subprocess.run(
    [sys.executable, "-c", _LATE_STOP_SCRIPT],
    cwd=root,
    env=dict(os.environ, PYTHONPATH=str(root)),
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
    "finished run 0",
    f"stopped before run 1 by signal {int(signal.SIGTERM)}",
    "a later request starts",
  ]
  assert "stopped before the next run; every finished run is written" in proc.stderr


@pytest.mark.slow
def test_rows14_15_sigterm_checkpoints_and_a_second_ctrl_c_exits_quietly(tmp_path):
  outs = {"term": tmp_path / "term", "twice": tmp_path / "twice"}
  procs = {k: _start(tmp_path, out) for k, out in outs.items()}  # both at once: half the time
  name = grok_runs.run_file_name(dataclasses.replace(CONFIG, epochs=100000), "B2", 0, "tiny")
  try:
    for k, proc in procs.items():
      _wait_for_checkpoint((outs[k] / name).with_suffix(".ckpt"), proc)
    procs["term"].send_signal(signal.SIGTERM)
    procs["twice"].send_signal(signal.SIGINT)
    time.sleep(0.05)
    procs["twice"].send_signal(signal.SIGINT)
    logs = {k: p.communicate(timeout=120)[0] for k, p in procs.items()}
  finally:
    for p in procs.values():
      if p.poll() is None:
        p.kill()
  # Row 14: SIGTERM stops at the next evaluation and saves a checkpoint, like Ctrl-C.
  assert procs["term"].returncode == 128 + signal.SIGTERM, logs["term"]
  assert re.search(r"stopped B2 seed 0 at epoch \d+; checkpoint at epoch \d+", logs["term"])
  assert "Traceback" not in logs["term"]
  term_ckpt = (outs["term"] / name).with_suffix(".ckpt")
  assert Checkpoints(term_ckpt).latest_epoch() > 0
  # Row 15: a second Ctrl-C ends the run quietly, with no traceback. Python serves a
  # signal only between compiled programs, and two Ctrl-C that arrive during one
  # program are served as one: then the run stops at that evaluation, checkpointed
  # (the handler's "stopped at once" path is tested with a Python loop above).
  assert procs["twice"].returncode == 128 + signal.SIGINT, logs["twice"]
  assert "stiefax grok: stopped at once" in logs["twice"] or re.search(
    r"stopped B2 seed 0 at epoch \d+; checkpoint at epoch \d+", logs["twice"]
  )
  assert "Traceback" not in logs["twice"] and "Exception ignored" not in logs["twice"]
  for out in outs.values():  # the locks were released and removed
    assert not list(out.glob("*.lock"))


# ----------------------------------------------------------------------- row 16: empty --out


@pytest.mark.parametrize("command", ["grok", "patches"])
def test_row16_an_empty_out_is_an_error(command, tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  _one_line(capsys, [command, "--out", "", "--seeds", "0"], "--out is empty")
  assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------- row 17: report's input


def test_row17_report_on_a_file_or_a_bad_experiment_is_one_line(tmp_path, capsys):
  run = tmp_path / "run.json"
  run.write_text(json.dumps({"experiment": 5}))
  _one_line(capsys, ["report", str(run)], "is a file, not a directory")
  line = _one_line(capsys, ["report", str(tmp_path)], "no runs found")
  assert "5: 1 run(s)" not in line


# ----------------------------------------------------------------- row 18: umask honoured


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_row18_result_files_honour_the_umask(umask, tmp_path):
  old = os.umask(umask)
  try:
    store.write_json(tmp_path / "r.json", {"a": 1})
    store.atomic_write(tmp_path / "p.png", lambda f: f.write(b"png"))
  finally:
    os.umask(old)
  for name in ("r.json", "p.png"):
    assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask


def test_row18_a_finished_run_is_readable_by_others(finished):
  assert _run_path(finished).stat().st_mode & 0o777 == 0o644


# --------------------------------------------------- row 19: a finished run leaves no .ckpt


def test_row19_a_finished_run_leaves_no_checkpoint(finished, tiny, capsys):
  assert sorted(p.name for p in finished.iterdir()) == [_run_path(finished).name]
  leftover = _run_path(finished).with_suffix(".ckpt")
  (leftover / "20").mkdir(parents=True)  # left by a process killed after writing the run
  assert cli.main(_argv(finished)) == 0
  assert "finished already" in capsys.readouterr().out
  assert not os.path.lexists(leftover)


# ------------------------------------------- row 20: one check of a run record, everywhere

_FACTS = {"python": "3", "train_bytes": 1}  # a corpus's facts, as a record holds them


def _lm_record(arm="A2", lr=3e-3, seed=0, val=2.0, init=8.0, preset="sweep"):
  """A complete ``stiefax lm`` run record (every field the command and report read)."""
  from stiefax.experiments.lm import config as lm_config
  from stiefax.experiments.lm import runs as lm_runs

  c = dataclasses.replace(lm_config.PRESETS[preset], adamw_lr=lr)
  cfg = lm_runs.run_config(lm_config.ARMS[arm], c, _FACTS, preset)
  steps = [0, c.steps]
  return {
    "experiment": "lm",
    "arm": arm,
    "seed": seed,
    "config": cfg,
    "metrics": {
      "val_bpb": val,
      "test_bpb": val,
      "init_val_bpb": init,
      "train_bpb": val,
      "max_logit": 9.0,
      "max_logit_max": 10.0,
      "entropy": 1.0,
      "isometry": 0.5,
      "diverged": False,
      "tokens_per_second": 1e4,
      "frame_lr": None,
    },
    "history": {"step": steps, "val_bpb": [init, val], "max_logit": [1.0, 9.0]},
  }


def _write_lm(folder, rec) -> pathlib.Path:
  from stiefax.experiments.lm import runs as lm_runs

  path = folder / lm_runs.run_name(rec["arm"], rec["config"], rec["seed"])
  store.write_json(path, rec, overwrite=True)
  return path


def _spoil(rec, how):
  rec = json.loads(json.dumps(rec))
  if how == "metrics as strings":
    rec["metrics"] = {k: str(v) for k, v in rec["metrics"].items()}
  elif how == "no metrics":
    del rec["metrics"]
  elif how == "a NaN loss at init":
    rec["metrics"]["init_val_bpb"] = float("nan")
  elif how == "a float seed":
    rec["seed"] = 0.0
  elif how == "no history":
    del rec["history"]
  elif how == "a ragged history":
    rec["history"]["val_bpb"].pop()
  elif how == "a string rate":
    rec["config"]["adamw_lr"] = "0.003"
  elif how == "a list":
    rec = [rec]
  return rec


_SPOILS = [
  ("metrics as strings", "its metrics"),
  ("no metrics", "'metrics'"),
  ("a NaN loss at init", "not finite"),
  ("a float seed", "'seed' is 0.0"),
  ("no history", "'history'"),
  ("a ragged history", "differ in length"),
  ("a string rate", "'adamw_lr'"),
  ("a list", "not a run object"),
]


@pytest.mark.parametrize("how, match", _SPOILS)
def test_row20_an_invalid_record_is_named_skipped_and_never_kept_as_finished(
  how, match, tmp_path, capsys
):
  from stiefax.experiments import protocol
  from stiefax.experiments.lm import command as lm_command
  from stiefax.experiments.lm import runs as lm_runs

  good = _lm_record()
  assert protocol.record_problem(good) is None
  bad = _spoil(good, how)
  assert match in protocol.record_problem(bad)
  # The report: the good run's tables, and one line naming the bad file.
  folder = tmp_path / "runs"
  _write_lm(folder, _lm_record(seed=1))
  path = folder / "bad.json"
  store.write_json(path, bad)
  assert cli.main(["report", str(folder), "--plots", str(tmp_path / "plots")]) == 0
  out, err = capsys.readouterr()
  assert "Traceback" not in err and "A2" in out
  lines = [ln for ln in err.splitlines() if "bad.json" in ln]
  if how != "a list":  # JSON that is not an object with "experiment" is not a run file
    assert len(lines) == 1 and match in lines[0] and str(path) in lines[0]
  # --reuse: never copied; --out: never counted as finished, set aside when repairing.
  cfg, seed = good["config"], 0
  src, out_dir = tmp_path / "src", tmp_path / "out"
  name = lm_runs.run_name("A2", cfg, seed)
  for d in (src, out_dir):
    d.mkdir()
    store.write_json(d / name, bad)
  job = lm_command.Job("A2", seed, out_dir / name, cfg=cfg)
  assert lm_command._reuse(job, src) is None
  assert match in capsys.readouterr().err
  assert job.finished() is None
  assert job.finished(repair=True) is None
  assert not (out_dir / name).exists() and len(list(out_dir.glob(f"{name}.bad-*"))) == 1
  # The good record is reused.
  store.write_json(src / name, good, overwrite=True)
  assert lm_command._reuse(job, src) == good and job.finished() == good


def test_row20_a_nan_or_infinite_loss_is_never_selected(tmp_path):
  from stiefax.experiments.lm import fair
  from stiefax.experiments.lm import runs as lm_runs

  runs = [_lm_record(lr=lr, seed=s, val=v) for lr, v in ((3e-4, 2.5), (3e-3, 2.0)) for s in (0, 1)]
  nan_init = dict(
    _lm_record(lr=1e-4, seed=0), metrics=dict(runs[0]["metrics"], init_val_bpb=np.nan)
  )
  nan_init2 = dict(nan_init, seed=1)
  assert lm_runs.select_rate(runs + [nan_init, nan_init2]) == 3e-3
  inf = [_lm_record(lr=1e-3, seed=s, val=float("inf")) for s in (0, 1)]
  assert lm_runs.diverged(inf[0]) and lm_runs.select_rate(runs + inf) == 3e-3
  assert lm_runs.best_of({1: float("nan"), 2: 3.0, 3: float("-inf")}) == 2
  assert lm_runs.best_of({1: float("nan")}) is None
  cells = [(3e-4, 1.0), (3e-3, 1.0)]
  nan_cell = [
    dict(
      r, config=dict(r["config"], adamw_lr=1e-4), metrics=dict(r["metrics"], init_val_bpb=np.nan)
    )
    for r in runs[:2]
  ]
  assert fair.select_cell(runs + nan_cell, cells + [(1e-4, 1.0)]) == (3e-3, 1.0)


def test_row20_json_nested_too_deep_is_invalid_not_a_recursion_error(tmp_path, capsys):
  deep = tmp_path / "runs" / "deep.json"
  deep.parent.mkdir()
  deep.write_text("[" * 100_000 + "]" * 100_000)
  obj, problem = store.read_json(deep)
  assert obj is None and "nested deeper" in problem
  shallow_but_over = tmp_path / "over.json"
  shallow_but_over.write_text("[" * 100 + "]" * 100)
  assert "nested deeper" in store.read_json(shallow_but_over)[1]
  run, problem = store.finished_run(deep, lambda r: True)
  assert run is None and "nested deeper" in problem
  _write_lm(deep.parent, _lm_record())
  assert cli.main(["report", str(deep.parent), "--plots", str(tmp_path / "plots")]) == 0
  err = capsys.readouterr().err
  assert "Traceback" not in err and f"skipped {deep}: not readable JSON (nested deeper" in err


# ------------------------------------- row 21: the report reads files, writes in its folder


def test_row21_the_report_never_waits_on_a_fifo_nor_writes_outside_its_folder(
  tmp_path, outside, capsys
):
  from stiefax.experiments.report import file_name

  runs = tmp_path / "runs"
  runs.mkdir()
  os.mkfifo(runs / "x.json")  # a reader that opened it would wait for a writer forever
  victim = "../../" + outside.name + "/pwn"
  for s in (0, 1):
    rec = _lm_record(seed=s)
    rec["config"]["preset"] = victim
    _write_lm(runs, rec)
  plots = tmp_path / "deep" / "plots"
  proc = subprocess.run(
    [sys.executable, "-m", "stiefax.experiments.cli", "report", str(runs), "--plots", str(plots)],
    capture_output=True,
    text=True,
    timeout=120,
    cwd=pathlib.Path(__file__).parent.parent,
  )
  assert proc.returncode == 0, proc.stderr
  assert "Traceback" not in proc.stderr and "A2" in proc.stdout
  (line,) = [ln for ln in proc.stderr.splitlines() if "x.json" in ln]
  assert "not a regular file" in line
  _untouched(outside)
  made = sorted(p.name for p in plots.iterdir())
  assert made and all(name.startswith("lm_") and name.endswith(".png") for name in made)
  assert [p for p in tmp_path.rglob("*.png") if p.parent != plots] == []
  assert file_name("lm_../../x/y.png") == "lm_.._.._x_y.png" and file_name(".h") == "_h"


# --------------------------------------------- row 22: an LM checkpoint's meta is checked


def _meta_file(step_dir: pathlib.Path) -> pathlib.Path:
  return step_dir / "meta" / "metadata"


def _damage_meta(directory: pathlib.Path, step: int, damage: str) -> None:
  if damage == "renamed step":
    os.rename(directory / str(step), directory / str(step + 1))
    return
  path = _meta_file(directory / str(step))
  meta = json.loads(path.read_text())
  if damage == "seed":
    meta["seed"] = 7
  elif damage == "wall_time":
    meta["wall_time"] = "soon"
  else:
    del meta["history"]
  path.write_text(json.dumps(meta))


_META_DAMAGE = [
  ("seed", "meta differs from the digest"),
  ("wall_time", "meta differs from the digest"),
  ("no history", "meta differs from the digest"),
  ("renamed step", "it holds step 2 in the folder of step 3"),
]


@pytest.mark.parametrize("damage, match", _META_DAMAGE)
def test_row22_a_checkpoint_whose_meta_does_not_fit_is_damaged(damage, match, tmp_path):
  import functools

  from stiefax.experiments.checkpoints import DamagedCheckpoint
  from stiefax.experiments.checkpoints import meta_problem

  params, opt_state = {"w": jnp.arange(3.0)}, {"n": jnp.zeros(2)}
  meta = {"step": 2, "seed": 0, "history": {"step": [0, 2]}, "wall_time": 1.5}
  ckpt = Checkpoints(tmp_path / "run.ckpt")
  ckpt.save(2, params, opt_state, meta)
  ckpt.close()
  _damage_meta(ckpt.directory, 2, damage)
  again = Checkpoints(ckpt.directory)
  latest = again.latest_epoch()
  fits = functools.partial(meta_problem, seed=0, step=latest, step_key="step", history=("step",))
  with pytest.raises(DamagedCheckpoint, match=match):
    again.restore(latest, params, opt_state, fits)
  again.close()


@pytest.mark.slow
@pytest.mark.parametrize("damage, match", _META_DAMAGE)
def test_row22_stiefax_lm_sets_a_checkpoint_whose_meta_does_not_fit_aside(
  damage, match, tmp_path, capsys
):
  out = tmp_path / "lm"
  argv = ["lm", "--arms", "A2", "--steps", "4", "--eval-every", "2", "--batch", "2"]
  argv += ["--checkpoint-every", "2", "--out", str(out), "--no-progress"]
  assert cli.main(argv) == 0
  (result,) = out.glob("*.json")
  first = json.loads(result.read_text())
  from stiefax.experiments.lm import config as lm_config
  from stiefax.experiments.lm import training as lm_training

  # A run records matrix_lr only for arms with a matrix rule; A2's is the default.
  fields = lm_config.LMConfig().__dict__
  config = lm_config.LMConfig(**{k: first["config"][k] for k in fields if k in first["config"]})
  ckpt = Checkpoints(result.with_suffix(".ckpt"))
  lm_training.train(
    lm_config.ARMS["A2"], config, 0, progress=False, checkpoints=ckpt, checkpoint_every=2
  )
  ckpt.close()
  result.unlink()
  _damage_meta(ckpt.directory, 2, damage)
  capsys.readouterr()
  assert cli.main(argv) == 0
  err = capsys.readouterr().err
  assert "Traceback" not in err and match in err and "training the run from the start" in err
  assert len(list(out.glob("*.ckpt.damaged-*"))) == 1
  again = json.loads(result.read_text())["metrics"]
  assert again["test_bpb"] == first["metrics"]["test_bpb"]


def test_row22_meta_problem_names_what_does_not_fit():
  from stiefax.experiments.checkpoints import meta_problem

  ok = {"seed": 1, "step": 4, "wall_time": 2.0, "history": {"step": [0, 2, 4], "v": [1, 2, 3]}}
  fits = lambda meta: meta_problem(meta, seed=1, step=4, step_key="step", history=("step",))
  assert fits(ok) is None
  assert "seed 1.0" in fits(dict(ok, seed=1.0))
  assert "step 3" in fits(dict(ok, step=3))
  assert "wall_time 'x'" in fits(dict(ok, wall_time="x"))
  assert "wall_time inf" in fits(dict(ok, wall_time=float("inf")))
  assert "lacks its history" in fits({k: v for k, v in ok.items() if k != "history"})
  assert "lacks step" in fits(dict(ok, history={"v": [1]}))
  assert "one length" in fits(dict(ok, history={"step": [0, 2, 4], "v": [1]}))


# ------------------------------- row 23: a flag has the range of the optimizer it feeds


@pytest.mark.parametrize(
  "extra, message",
  [
    (["--max-norm", "0"], "--max-norm 0.0: must be finite, > 0"),
    (["--max-norm", "1e308"], "--max-norm 1e+308: must be finite, > 0 and <= 1e15"),
    (["--frame-lr", "1e308"], "--frame-lr 1e+308: must be finite, >= 0 and <= 1e15"),
    (["--lr", "1e20"], "--lr 1e+20: must be finite, >= 0 and <= 1e15"),
    (["--reuse", ""], "--reuse is empty"),
    (["--cells-from", " "], "--cells-from is empty"),
    (["--frame-lr", "around"], "must be comma-separated numbers, or 'best'."),
  ],
)
def test_row23_lm_flags_take_the_range_of_their_optimizer(
  tmp_path, monkeypatch, capsys, extra, message
):
  monkeypatch.chdir(tmp_path)
  out = tmp_path / "o"
  line = _one_line(capsys, ["lm", "--out", str(out), "--arms", "A2,B2", *extra], message)
  if extra == ["--frame-lr", "around"]:  # 'around' is given, never offered
    assert line.count("around") == 1
  assert not list(tmp_path.rglob("*.json")) and not list(tmp_path.rglob("*.ckpt"))


def test_row23_the_grok_and_patches_flags_have_the_float32_ceiling(tmp_path, capsys):
  out = tmp_path / "out"
  _one_line(capsys, ["patches", "--max-norm", "1e308", "--out", str(out), "--no-cache"], "1e15")
  _one_line(capsys, ["patches", "--lr", "B2=1e300", "--out", str(out), "--no-cache"], "1e15")
  assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(
  "kwargs", [dict(learning_rate=1e38), dict(learning_rate=1.0, max_norm=1e308)]
)
def test_row23_the_library_refuses_a_rate_or_cap_whose_step_overflows_float32(fused, kwargs):
  arg = list(kwargs)[-1]
  with pytest.raises(ValueError, match=re.escape(f"stiefax.riemannian_adam: {arg}")) as e:
    stiefax.riemannian_adam(**kwargs, fused=fused)
  assert len(str(e.value).splitlines()) == 1 and "<= 1e15" in str(e.value)
  # The largest rate taken still moves the frames (no silent skip).
  w = jnp.linalg.qr(jax.random.normal(jax.random.key(0), (8, 4)))[0]
  g = jax.random.normal(jax.random.key(1), (8, 4))
  for max_norm in (0.1, None):
    tx = stiefax.riemannian_adam(1e15, max_norm=max_norm, fused=fused)
    u, _ = tx.update({"w": g}, tx.init({"w": w}), {"w": w})
    moved = optax.apply_updates({"w": w}, u)["w"]
    assert bool(jnp.isfinite(moved).all()) and float(jnp.abs(moved - w).max()) > 0.01


# -------------------------------------------- row 24: the library's edges are one line


def _frame_and_counter():
  w = jnp.linalg.qr(jax.random.normal(jax.random.key(0), (8, 2)))[0]
  params = {"w": w, "step": jnp.asarray(3), "keep": jnp.asarray([1, 0], jnp.int8)}
  params["b"] = jnp.ones((3, 3))
  labels = {"w": "stiefel", "step": "adamw", "keep": "adamw", "b": "adamw"}
  return params, labels


def test_row24_integer_leaves_are_left_unchanged_by_stiefel_adamw():
  params, labels = _frame_and_counter()
  tx = stiefax.stiefel_adamw(1e-2, labels=labels, frames=stiefax.FrameSpec())
  state = tx.init(params)
  grads = jax.tree.map(jnp.ones_like, params)
  p = params
  for _ in range(3):
    updates, state = jax.jit(tx.update)(grads, state, p)
    p = optax.apply_updates(p, updates)
  assert int(p["step"]) == 3 and p["step"].dtype == params["step"].dtype
  assert p["keep"].tolist() == [1, 0] and p["keep"].dtype == jnp.int8
  assert float(p["b"][0, 0]) < 1.0 and float(jnp.abs(p["w"] - params["w"]).max()) > 0


def test_row24_a_mask_of_the_wrong_structure_names_mask():
  params, labels = _frame_and_counter()
  tx = stiefax.stiefel_adamw(1e-2, labels=labels, frames=stiefax.FrameSpec(), mask=lambda p: [True])
  with pytest.raises(ValueError, match=r"stiefel_adamw: mask= returned a tree of structure") as e:
    tx.init(params)
  assert "must have the structure of the params" in str(e.value) and "'b'" in str(e.value)
  assert len(str(e.value).splitlines()) == 1


def test_row24_the_empty_tree_has_its_own_message():
  with pytest.raises(ValueError, match="init was given no parameters") as e:
    stiefax.stiefel_adamw(1e-3).init({})
  assert len(str(e.value).splitlines()) == 1


@pytest.mark.parametrize("epsilon", [-1.0, 0.0, float("nan"), float("inf")])
def test_row24_qk_norm_checks_epsilon(epsilon):
  from flax import nnx

  x = jnp.ones((2, 4))
  with pytest.raises(ValueError, match=r"^QKNorm: epsilon must be finite and > 0"):
    stiefax.flax.QKNorm(epsilon=epsilon).init(jax.random.key(0), x, x)
  with pytest.raises(ValueError, match=r"^NnxQKNorm: epsilon must be finite and > 0"):
    stiefax.flax.NnxQKNorm(4, epsilon=epsilon, rngs=nnx.Rngs(0))


def test_row24_qk_norm_checks_the_head_size_and_0d_inputs():
  from flax import nnx

  scalar, x = jnp.ones(()), jnp.ones((2, 4))
  with pytest.raises(ValueError, match=r"^QKNorm: q must have the head size as its last axis"):
    stiefax.flax.QKNorm().init(jax.random.key(0), scalar, scalar)
  norm = stiefax.flax.NnxQKNorm(8, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"^NnxQKNorm: the head size .* must be head_dim=8"):
    norm(x, x)
  with pytest.raises(ValueError, match=r"^NnxQKNorm: k must have the head size"):
    norm(jnp.ones((2, 8)), scalar)
  with pytest.raises(ValueError, match=r"^NnxQKNorm: head_dim must be an int >= 1"):
    stiefax.flax.NnxQKNorm(0, rngs=nnx.Rngs(0))
  qn, kn = norm(jnp.ones((2, 8)), jnp.ones((3, 8)))
  assert qn.shape == (2, 8) and kn.shape == (3, 8)


# ------------------------------------------ row 25: a real full disk while checkpointing

_SAVE_UNTIL_FULL = """
import sys, jax
from stiefax.experiments.checkpoints import Checkpoints
from stiefax.experiments.flags import CommandError
ckpt = Checkpoints(sys.argv[1])
ckpt.save(1, {"w": jax.numpy.arange(4.0)}, {}, {"step": 1})
try:
  ckpt.save(2, {"w": jax.random.normal(jax.random.key(0), (1024, 512))}, {}, {"step": 2})
except CommandError as e:
  print(f"stiefax lm: error: {e}", file=sys.stderr)
print("kept", ckpt.latest_epoch())
"""


def _save_until_full(folder: pathlib.Path, limit: int = 0) -> subprocess.CompletedProcess:
  import resource

  def cap() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

  return subprocess.run(
    [sys.executable, "-c", _SAVE_UNTIL_FULL, str(folder / "run.ckpt")],
    capture_output=True,
    text=True,
    timeout=300,
    preexec_fn=cap if limit else None,
    cwd=pathlib.Path(__file__).parent.parent,
  )


def _one_line_kept(proc, cause: str) -> None:
  assert proc.returncode == 0, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr
  assert f"({cause}); the previous checkpoint (at 1) is kept." in lines[0]
  assert proc.stdout.split() == ["kept", "1"]


def test_row25_a_file_size_limit_while_checkpointing_is_one_line(tmp_path):
  proc = _save_until_full(tmp_path, limit=1 << 20)  # RLIMIT_FSIZE: 1 MiB per file
  _one_line_kept(proc, "File too large")
  assert not [p for p in (tmp_path / "run.ckpt").iterdir() if "tmp" in p.name]
