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
  with pytest.raises(flags.CommandError, match=r"data_batch_1.*refused to load io\.open"):
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
    (dict(max_norm=-0.1), "max_norm must be finite and > 0, or None"),  # row 5
    (dict(max_norm=float("nan")), "max_norm must be finite and > 0, or None"),  # row 6
    (dict(eps=float("nan")), "eps must be finite and >= 0"),  # row 7
    (dict(eps=float("inf")), "eps must be finite and >= 0"),
    (dict(eps=-1e-8), "eps must be finite and >= 0"),
    (dict(b2=1.5), "b2 must be in [0, 1)"),  # row 8
    (dict(b1=1.0), "b1 must be in [0, 1)"),
    (dict(b1=-0.1), "b1 must be in [0, 1)"),
    (dict(learning_rate=float("nan")), "learning_rate must be finite and >= 0"),
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
    (lambda: stiefax.step_norm_cap(0.0), "step_norm_cap: max_norm must be finite and > 0"),
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
  else:
    data[len(data) // 2] ^= 0x10
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
