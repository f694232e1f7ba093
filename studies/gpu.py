"""A device lease in one command: the benchmark, then the paper's grokking studies.

``studies/gpu.sh`` runs this module. On the device (``--out "$OUT"``, the folder whose
files come back), inside ``--budget`` seconds:

1. ``python -m benchmarks.gpu`` (its JSON under ``results/gpu/``), unless a benchmark
   of this device's platform is already there or fewer seconds are left than it needs;
2. the grokking studies of :data:`stiefax.experiments.grok.config.STUDIES`, in their
   order of value: run (a) A2 then B2 at seeds 0-4, run (b) the same with
   ``--stabilize``, then Table 5's four arms at seed 0. Each arm is one
   ``stiefax grok --preset paper --vmap-seeds`` command (its seeds one program), with
   ``--checkpoint-seconds`` (a checkpoint at least every 40 s of training) and
   ``--time-limit`` (it stops, checkpointed, before the budget ends).

The runs train in ``--work`` (finished runs of ``results/grok`` and the checkpoints
carried in ``studies/carry/grok`` are copied in first, so nothing is trained twice and
an unfinished run resumes). While they train, a packer thread copies what is new into
``--out`` as one tar archive in parts of at most 15 MiB (the files that come back from
a lease: at most 8, 16 MiB each): the benchmark, the finished run JSONs and the
checkpoints of the unfinished runs. It packs only a consistent state (the folder's
listing the same before and after) and replaces the previous archive only once the new
one is whole, so a lease cut off at any moment gives back the last checkpoint, at most
40 s of training and a few seconds of packing old. At the end it
lists what is left and ends with status 0 (everything finished), 75 (something left
for the next lease) or 1 (a command failed).

Here, on what came back: ``studies/gpu.sh unpack DIR`` puts the runs in
``results/grok``, the benchmark in ``results/gpu`` and the checkpoints of unfinished
runs in ``studies/carry/grok`` (never overwriting a result), to be committed; the next
lease, or ``studies/gpu.sh`` on a CPU, resumes from there. ``studies/gpu.sh status``
says what is finished and what is left. ``--tiny`` runs every step at toy sizes (the
paper's model for 4 epochs, ``benchmarks.gpu --tiny``): the CPU check, whose archive
``unpack`` puts only in a results folder named with ``--results``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import io
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence

from stiefax.experiments import jobs
from stiefax.experiments import protocol
from stiefax.experiments import store
from stiefax.experiments.grok import command as grok_command
from stiefax.experiments.grok import runs as grok_runs
from stiefax.experiments.grok.config import STUDIES

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: The largest part of the archive (the lease gives back files of at most 16 MiB).
PART_BYTES = 15 * 2**20
#: The largest archive: four parts and the log stay within the 8 files and 64 MiB that
#: come back, with room for the previous archive while the new one replaces it.
PACK_LIMIT = 4 * PART_BYTES
#: The archive's part names: ``lease-g<generation>-p<part>of<parts>.tar``.
PART_GLOB = "lease-g*-p*of*.tar"
#: The exit statuses: everything finished, something left for the next lease.
EXIT_DONE, EXIT_LEFT, EXIT_FAILED = 0, jobs.EXIT_TIME_LIMIT, 1


@dataclasses.dataclass(frozen=True)
class Sizes:
  """How big a lease's steps are and what each needs (paper scale, or ``--tiny``)."""

  grok: tuple[str, ...]  # the arguments that pick the grokking configuration
  bench: tuple[str, ...]  # extra arguments of benchmarks.gpu
  bench_budget: float  # benchmarks.gpu --budget-s: no part starts after it
  bench_need: float  # seconds the whole benchmark takes (its budget, its last part)
  min_start: float  # no grokking command starts with fewer seconds left (start, compile)
  checkpoint_seconds: float  # a checkpoint at least this often while training
  reserve: float  # seconds kept for the last pack


#: Paper scale. The benchmark is budgeted to 420 s and may start its last part just
#: before, so it needs about 480 s. A grokking command spends its first 20-40 s on the
#: process, JAX's start and compiling, so it starts only with 60 s left. A checkpoint of
#: five seeds takes 1-3 s: every 40 s costs a few per cent and bounds what a cut-off loses.
PAPER = Sizes(
  grok=("--preset", "paper"),
  bench=(),
  bench_budget=420.0,
  bench_need=480.0,
  min_start=60.0,
  checkpoint_seconds=40.0,
  reserve=15.0,
)
#: The CPU check: the same steps at toy sizes: the paper's model and task for 4 epochs
#: (the quick preset would not do: its default is the stabilized setting already).
TINY = Sizes(
  grok=("--preset", "paper", "--epochs", "4", "--eval-every", "2"),
  bench=("--tiny",),
  bench_budget=420.0,
  bench_need=0.0,
  min_start=0.0,
  checkpoint_seconds=1.0,
  reserve=2.0,
)


@dataclasses.dataclass(frozen=True)
class Entry:
  """One arm of a study: one ``stiefax grok`` command, its seeds one program."""

  study: str
  arm: str
  seeds: tuple[int, ...]
  stabilize: bool

  @property
  def label(self) -> str:
    seeds = ",".join(map(str, self.seeds))
    return f"{self.study} {self.arm} seed{'s' * (len(self.seeds) > 1)} {seeds}"

  def argv(self, sizes: Sizes) -> list[str]:
    """The ``stiefax grok`` arguments of this entry (without ``--out`` and the limits)."""
    argv = ["grok", *sizes.grok, "--arms", self.arm, "--seeds", ",".join(map(str, self.seeds))]
    return (
      argv
      + (["--vmap-seeds"] if len(self.seeds) > 1 else [])
      + (["--stabilize"] if self.stabilize else [])
    )

  def file_names(self, sizes: Sizes) -> dict[int, str]:
    """``{seed: run file name}``, as ``stiefax grok`` names them."""
    parser = argparse.ArgumentParser()
    grok_command.add_arguments(parser)
    args = parser.parse_args(self.argv(sizes)[1:])
    config, (arm,), seeds = grok_command.resolve_config(args)
    return {s: grok_runs.run_file_name(config, arm, s, args.preset, args.stabilize) for s in seeds}


def plan() -> list[Entry]:
  """The lease's grokking commands in their order of value: each study's arms in turn.

  Returns:
    One :class:`Entry` per arm of each study of ``STUDIES``.
  """
  return [Entry(s.name, arm, s.seeds, s.stabilize) for s in STUDIES for arm in s.arms]


def checkpoint_epoch(path: pathlib.Path) -> Optional[int]:
  """The epoch of the checkpoint kept in ``path`` (its step folder), without Orbax.

  Args:
    path: a run's ``<run>.ckpt`` folder.

  Returns:
    The largest step folder's number, or None when there is none.
  """
  if not path.is_dir() or path.is_symlink():
    return None
  steps = [int(p.name) for p in path.iterdir() if p.name.isdigit() and p.is_dir()]
  return max(steps) if steps else None


@dataclasses.dataclass
class Progress:
  """Where one entry stands: its finished seeds and the epochs its checkpoints hold."""

  entry: Entry
  finished: list[int]
  checkpoints: dict[int, int]

  @property
  def done(self) -> bool:
    return len(self.finished) == len(self.entry.seeds)

  def words(self) -> str:
    if self.done:
      return "finished"
    many = "s" * (len(self.finished) > 1)
    parts = [f"seed{many} {','.join(map(str, self.finished))} finished"] if self.finished else []
    parts += [f"seed {s} at epoch {e}" for s, e in sorted(self.checkpoints.items())]
    return "; ".join(parts) or "not started"


def progress(entry: Entry, sizes: Sizes, dirs: Sequence[pathlib.Path]) -> Progress:
  """Which seeds of ``entry`` are finished in ``dirs`` and where the others stand.

  Args:
    entry: one arm of a study.
    sizes: the lease's sizes (which configuration the runs have).
    dirs: folders of run JSONs and ``<run>.ckpt`` checkpoints, searched in order.

  Returns:
    The entry's :class:`Progress`.
  """
  finished, at = [], {}
  for seed, name in entry.file_names(sizes).items():
    if any((d / name).is_file() for d in dirs):
      finished.append(seed)
      continue
    epochs = [checkpoint_epoch((d / name).with_suffix(".ckpt")) for d in dirs]
    found = [e for e in epochs if e is not None]
    if found:
      at[seed] = max(found)
  return Progress(entry, finished, at)


# ----------------------------------------------------------------------------
# What comes back: one tar archive in parts, replaced whole whenever the work changes.
# ----------------------------------------------------------------------------


def _listing(work: pathlib.Path) -> tuple:
  """What the packer sees of ``work``: the run files and the benchmark (names, sizes,
  times) and each checkpoint folder's entries (a save renames a new step folder in
  and then deletes the old one, so any save changes them)."""
  seen: list = []
  for p in sorted(work.iterdir()) if work.is_dir() else []:
    if p.suffix == ".ckpt" and p.is_dir():
      seen.append((p.name, tuple((c.name, c.lstat().st_ino) for c in sorted(p.iterdir()))))
    elif p.suffix == ".json" or p.name == "gpu":
      st = p.lstat()
      inner = (
        [(c.name, c.lstat().st_size, c.lstat().st_mtime_ns) for c in sorted(p.iterdir())]
        if p.is_dir()
        else []
      )
      seen.append((p.name, st.st_size, st.st_mtime_ns, tuple(inner)))
  return tuple(seen)


def _skip_partial(info: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
  """Leaves out Orbax's temporary folder of a save in progress."""
  return None if "orbax-checkpoint-tmp" in info.name else info


class Packer:
  """Packs ``work`` into ``out``: the benchmark, new runs and unfinished checkpoints.

  Args:
    work: where the runs train (``--work``).
    out: the folder that comes back from the lease (``--out``).
    known: run files already in the repository (not packed again).
    manifest: called at each pack for the archive's ``lease.json`` (what is left).
  """

  def __init__(
    self,
    work: pathlib.Path,
    out: pathlib.Path,
    known: Callable[[str], bool],
    manifest: Callable[[], dict],
  ):
    self.work, self.out, self.known, self.manifest = work, out, known, manifest
    self.generation = 0
    self.packed: Optional[tuple] = None
    self.lock = threading.Lock()
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    # Three folders down: a file there never comes back, half-written or not.
    self.staging = out / ".staging" / "parts" / "new"

  def pack(self, force: bool = False) -> bool:
    """Packs the work if it changed (or ``force``: the last pack, with the last word on
    what is left) and held still while it was read; True if it packed."""
    with self.lock:
      try:
        before = _listing(self.work)
        if before == self.packed and not force:
          return False
        data = self._archive()
        if _listing(self.work) != before:
          return False
      except FileNotFoundError:  # a file went while it was read: a save, a finished run
        return False
      self._write(data)
      self.packed = before
      return True

  def _archive(self) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
      manifest = json.dumps(self.manifest(), indent=1).encode()
      info = tarfile.TarInfo("lease.json")
      info.size, info.mtime = len(manifest), int(time.time())
      tar.addfile(info, io.BytesIO(manifest))
      bench = self.work / "gpu"
      for p in sorted(bench.iterdir()) if bench.is_dir() else []:
        if p.is_file() and not p.name.startswith("."):
          tar.add(p, arcname=f"gpu/{p.name}")
      runs = {p.stem for p in self.work.glob("*.json")}
      for p in sorted(self.work.glob("*.json")):
        if not p.name.startswith(".") and not self.known(p.name):
          tar.add(p, arcname=f"grok/{p.name}")
      ckpts = [
        p
        for p in sorted(self.work.glob("*.ckpt"))
        if p.is_dir() and not p.is_symlink() and p.stem not in runs
      ]
      size = sum(f.stat().st_size for c in ckpts for f in c.rglob("*") if f.is_file())
      if buf.tell() + size > PACK_LIMIT:  # cannot come back whole: keep the runs, say so
        print(
          f"lease: the checkpoints are {size / 2**20:.0f} MiB, more than can come back;"
          " packing the runs and the benchmark only",
          flush=True,
        )
        ckpts = []
      for p in ckpts:
        tar.add(p, arcname=f"grok/{p.name}", filter=_skip_partial)
    return buf.getvalue()

  def _write(self, data: bytes) -> None:
    self.generation += 1
    shutil.rmtree(self.out / ".staging", ignore_errors=True)
    self.staging.mkdir(parents=True)
    n = max(1, -(-len(data) // PART_BYTES))
    names = [f"lease-g{self.generation:04d}-p{i + 1}of{n}.tar" for i in range(n)]
    for i, name in enumerate(names):
      (self.staging / name).write_bytes(data[i * PART_BYTES : (i + 1) * PART_BYTES])
    for name in names:
      os.replace(self.staging / name, self.out / name)
    for old in self.out.glob(PART_GLOB):
      if old.name not in names:
        old.unlink()
    shutil.rmtree(self.out / ".staging", ignore_errors=True)

  def start(self, every: float = 1.0) -> None:
    """Packs in a thread every ``every`` seconds while the lease trains."""

    def loop() -> None:
      while not self._stop.wait(every):
        try:
          self.pack()
        except OSError as e:  # a full disk: say so, and try again at the next change
          print(f"lease: cannot pack ({e})", flush=True)

    self._thread = threading.Thread(target=loop, name="packer", daemon=True)
    self._thread.start()

  def stop(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()


# ----------------------------------------------------------------------------
# The lease.
# ----------------------------------------------------------------------------


class Log:
  """Prints the lease's lines and keeps them in ``out/lease.log``."""

  def __init__(self, path: pathlib.Path):
    self.path = path

  def __call__(self, line: str) -> None:
    print(line, flush=True)
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(line + "\n")


def run_child(argv: Sequence[str], log: Callable[[str], None], stop: threading.Event) -> int:
  """Runs ``python argv`` from the repository root, its lines into ``log``; its status.

  Args:
    argv: the arguments after ``python`` (``-m benchmarks.gpu ...``).
    log: where its output goes, line by line.
    stop: set by SIGTERM: the child is asked to stop (checkpointed) too.

  Returns:
    The child's exit status.
  """
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
  proc = subprocess.Popen(
    [sys.executable, *argv],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    errors="replace",
    bufsize=1,
  )

  def forward() -> None:
    stop.wait()
    if proc.poll() is None:
      with contextlib.suppress(OSError):
        proc.send_signal(signal.SIGTERM)

  threading.Thread(target=forward, daemon=True).start()
  assert proc.stdout is not None
  for line in proc.stdout:
    log("  " + line.rstrip("\n"))
  return proc.wait()


def _device(log: Log, stop: threading.Event) -> str:
  """The platform JAX trains on here (``gpu``, ``cpu``), from a child process."""
  found: list[str] = []
  code = "import jax; d = jax.devices()[0]; print('device:', d.platform, d.device_kind)"

  def keep(line: str) -> None:
    log(line)
    if "device:" in line:
      found.append(line.split("device:")[1].split()[0])

  run_child(["-c", code], keep, stop)
  return found[0] if found else "unknown"


def _bench_done(dirs: Sequence[pathlib.Path], platform: str, tiny: bool) -> bool:
  for d in dirs:
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
      data, problem = store.read_json(p)
      if (
        problem is None
        and isinstance(data, dict)
        and data.get("tiny") == tiny
        and str(data.get("device", "")).split(" ")[0] == platform
      ):
        return True
  return False


def _copy_in(results: pathlib.Path, carry: pathlib.Path, work: pathlib.Path, log: Log) -> None:
  """Finished runs and carried checkpoints into ``work`` (nothing there is replaced)."""
  work.mkdir(parents=True, exist_ok=True)
  for p in sorted(results.glob("*.json")) if results.is_dir() else []:
    if not (work / p.name).exists():
      shutil.copy2(p, work / p.name)
  for c in sorted(carry.glob("*.ckpt")) if carry.is_dir() else []:
    target = work / c.name
    if c.is_dir() and not os.path.lexists(target) and not target.with_suffix(".json").exists():
      shutil.copytree(c, target)
      log(f"lease: resuming from the carried {c.name} (epoch {checkpoint_epoch(target)})")


def lease(args: argparse.Namespace, clock: Callable[[], float] = time.monotonic) -> int:
  """Runs the lease (see the module docstring) and says what is left.

  Args:
    args: the parsed ``studies/gpu.sh`` arguments.
    clock: the clock the budget is counted on (a test's fake one).

  Returns:
    0 when every study is finished, 75 when some is left, 1 when a command failed.
  """
  t0 = clock()
  sizes = TINY if args.tiny else PAPER
  out, work = pathlib.Path(args.out), pathlib.Path(args.work)
  results = pathlib.Path(args.results)
  carry = pathlib.Path(args.carry)
  out.mkdir(parents=True, exist_ok=True)
  log = Log(out / "lease.log")
  stop = threading.Event()
  left = lambda: args.budget - (clock() - t0)
  entries = plan()

  def on_term(signum: int, frame: Any) -> None:
    del frame
    log(f"lease: signal {signum}: stopping the command in training, then packing")
    stop.set()

  previous = signal.signal(signal.SIGTERM, on_term)
  log(
    f"lease: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M:%S} UTC, budget"
    f" {args.budget:g} s{', tiny sizes' if args.tiny else ''}; work {work}, out {out}"
  )
  _copy_in(results / "grok", carry, work, log)
  notes: dict[str, str] = {}

  def manifest() -> dict:
    dirs = [work]
    return {
      "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
      "tiny": args.tiny,
      "budget_s": args.budget,
      "elapsed_s": round(clock() - t0, 1),
      "benchmark": notes.get("benchmark", "not run"),
      "entries": [
        {
          "label": e.label,
          "progress": progress(e, sizes, dirs).words(),
          "note": notes.get(e.label, ""),
        }
        for e in entries
      ],
    }

  known = lambda name: (results / "grok" / name).is_file()
  packer = Packer(work, out, known, manifest)
  packer.start()
  failed = False
  try:
    platform = _device(log, stop)
    if not args.tiny and platform != "gpu":
      log(f"lease: warning: JAX runs on {platform}, not a GPU; the runs will be slow")
    bench_dirs = [results / "gpu", work / "gpu"]
    if _bench_done(bench_dirs, platform, args.tiny):
      notes["benchmark"] = "done earlier"
      log("lease: benchmark: done earlier (results/gpu); skipped")
    elif left() - sizes.reserve < sizes.bench_need:
      notes["benchmark"] = "left: needs a fresh lease"
      log(f"lease: benchmark: left ({sizes.bench_need:.0f} s needed, {left():.0f} s left)")
    elif not stop.is_set():
      budget = max(1.0, min(sizes.bench_budget, left() - sizes.reserve - 60.0))
      log(f"lease: benchmark, budget {budget:.0f} s ({left():.0f} s left)")
      argv = ["-m", "benchmarks.gpu", "--out", str(work / "gpu"), "--budget-s", f"{budget:.0f}"]
      code = run_child([*argv, *sizes.bench], log, stop)
      notes["benchmark"] = "done" if code == 0 else f"failed (status {code})"
      failed |= code != 0
      packer.pack()
    for e in entries:
      if progress(e, sizes, [work]).done:
        notes[e.label] = "finished"
        continue
      if stop.is_set() or left() - sizes.reserve < max(sizes.min_start, 1.0):
        break
      limit = left() - sizes.reserve
      log(f"lease: {e.label}: training, time limit {limit:.0f} s")
      argv = ["-m", "stiefax.experiments.cli", *e.argv(sizes), "--out", str(work)]
      argv += ["--checkpoint-seconds", f"{sizes.checkpoint_seconds:g}"]
      argv += ["--time-limit", f"{limit:.0f}", "--no-progress"]
      code = run_child(argv, log, stop)
      notes[e.label] = {0: "finished", EXIT_LEFT: "stopped at the time limit"}.get(
        code, f"failed (status {code})"
      )
      failed |= code not in (0, EXIT_LEFT) and not stop.is_set()
      packer.pack()
      if code == EXIT_LEFT:
        break
  finally:
    packer.stop()
    packer.pack(force=True)
    signal.signal(signal.SIGTERM, previous)
  return _summary(entries, sizes, work, notes, log, failed, clock() - t0)


def _summary(
  entries: Sequence[Entry],
  sizes: Sizes,
  work: pathlib.Path,
  notes: dict,
  log: Log,
  failed: bool,
  elapsed: float,
) -> int:
  states = [progress(e, sizes, [work]) for e in entries]
  log(f"lease: {elapsed:.0f} s; benchmark: {notes.get('benchmark', 'not run')}")
  for p in states:
    log(f"  {p.entry.label}: {p.words()}")
  left = [p for p in states if not p.done] + (
    [] if notes.get("benchmark", "").startswith("done") else ["benchmark"]
  )
  if left:
    log(f"lease: {len(left)} left for the next lease: studies/gpu.sh resumes them")
  else:
    log("lease: every study is finished")
  return EXIT_FAILED if failed else (EXIT_LEFT if left else EXIT_DONE)


# ----------------------------------------------------------------------------
# Here, after the lease: unpack what came back; what is left.
# ----------------------------------------------------------------------------


def latest_archive(folder: pathlib.Path) -> list[pathlib.Path]:
  """The parts of the newest whole archive in ``folder``, in order.

  Args:
    folder: what came back from a lease.

  Returns:
    The part files (``[]`` when no archive has all its parts).
  """
  groups: dict = {}
  for p in folder.glob(PART_GLOB):
    gen, part = p.stem.split("-")[1:3]
    i, n = (int(x) for x in part[1:].split("of"))
    groups.setdefault((int(gen[1:]), n), {})[i] = p
  for (_, n), parts in sorted(groups.items(), reverse=True):
    if sorted(parts) == list(range(1, n + 1)):
      return [parts[i] for i in range(1, n + 1)]
  return []


def _same_file(a: pathlib.Path, b: pathlib.Path) -> bool:
  return a.read_bytes() == b.read_bytes()


def unpack(args: argparse.Namespace) -> int:
  """Puts what a lease gave back where the repository keeps it (see the module docstring).

  Args:
    args: ``dir`` (what came back), ``results``, ``carry``.

  Returns:
    0, or 1 when nothing could be read.
  """
  folder = pathlib.Path(args.dir)
  parts = latest_archive(folder)
  if not parts:
    print(f"unpack: no whole lease archive ({PART_GLOB}) in {folder}", file=sys.stderr)
    return 1
  results, carry = pathlib.Path(args.results), pathlib.Path(args.carry)
  with tempfile.TemporaryDirectory() as tmp:
    joined = pathlib.Path(tmp) / "lease.tar"
    with open(joined, "wb") as f:
      for p in parts:
        f.write(p.read_bytes())
    with tarfile.open(joined) as tar:
      tar.extractall(pathlib.Path(tmp) / "x", filter="data")
    got = pathlib.Path(tmp) / "x"
    manifest = json.loads((got / "lease.json").read_text())
    if manifest.get("tiny") and results.resolve() == (ROOT / "results").resolve():
      print(
        "unpack: a --tiny lease's runs are a check, not results; give --results a folder"
        " of their own",
        file=sys.stderr,
      )
      return 1
    print(f"unpack: {parts[0].name} ({len(parts)} part(s)), made {manifest['created']}")
    counts = {"runs": 0, "benchmark": 0, "checkpoints": 0, "removed": 0}
    for src, dest, kind in [(p, results / "gpu", "benchmark") for p in _files(got / "gpu")] + [
      (p, results / "grok", "runs") for p in _files(got / "grok", "*.json")
    ]:
      if kind == "runs":
        run, problem = store.read_json(src)
        problem = problem or (
          protocol.record_problem(run, "grok") if isinstance(run, dict) else "not a run"
        )
        if problem:
          print(f"unpack: warning: {src.name} left out: {problem}")
          continue
      target = dest / src.name
      if target.exists():
        if not _same_file(src, target):
          print(f"unpack: warning: {target} exists and differs; kept it, left {src.name} out")
        continue
      dest.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, target)
      counts[kind] += 1
    for c in sorted((got / "grok").glob("*.ckpt")) if (got / "grok").is_dir() else []:
      if (results / "grok" / f"{c.stem}.json").exists():
        continue
      target = carry / c.name
      had = checkpoint_epoch(target) if target.is_dir() else None
      new = checkpoint_epoch(c)
      if new is None or (had is not None and had >= new):
        continue
      carry.mkdir(parents=True, exist_ok=True)
      tmp_copy = carry / f".{c.name}.tmp"
      shutil.rmtree(tmp_copy, ignore_errors=True)
      shutil.copytree(c, tmp_copy)
      if os.path.lexists(target):
        shutil.rmtree(target)
      os.replace(tmp_copy, target)
      counts["checkpoints"] += 1
      print(f"unpack: carried {c.name} at epoch {new}")
  for c in sorted(carry.glob("*.ckpt")) if carry.is_dir() else []:
    if (results / "grok" / f"{c.stem}.json").exists() and c.is_dir() and not c.is_symlink():
      shutil.rmtree(c)
      counts["removed"] += 1
  print(
    f"unpack: {counts['runs']} new run(s) in {results / 'grok'}, {counts['benchmark']}"
    f" benchmark file(s) in {results / 'gpu'}, {counts['checkpoints']} checkpoint(s) carried"
    f" in {carry}, {counts['removed']} carried checkpoint(s) of finished runs removed"
  )
  print(f"unpack: the lease said: benchmark {manifest['benchmark']}")
  for e in manifest["entries"]:
    print(f"  {e['label']}: {e['progress']}")
  print(f"commit: git add {results / 'grok'} {results / 'gpu'} {carry}")
  return 0


def _files(folder: pathlib.Path, pattern: str = "*") -> list[pathlib.Path]:
  return [p for p in sorted(folder.glob(pattern)) if p.is_file()] if folder.is_dir() else []


def status(args: argparse.Namespace) -> int:
  """Prints what is finished and what is left (no device needed).

  Args:
    args: ``results``, ``carry``, ``tiny``.

  Returns:
    0 when everything is finished, else 75.
  """
  sizes = TINY if args.tiny else PAPER
  dirs = [pathlib.Path(args.results) / "grok", pathlib.Path(args.carry)]
  states = [progress(e, sizes, dirs) for e in plan()]
  bench = sorted((pathlib.Path(args.results) / "gpu").glob("*.json"))
  print(f"benchmark: {', '.join(p.name for p in bench) or 'not run'}")
  for p in states:
    print(f"{p.entry.label}: {p.words()}")
  return EXIT_DONE if all(p.done for p in states) and bench else EXIT_LEFT


def main(argv: Optional[Sequence[str]] = None) -> int:
  """``studies/gpu.sh [run] [...] | unpack DIR | status``.

  Args:
    argv: the arguments (default: the program's).

  Returns:
    The exit status.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] not in ("run", "unpack", "status", "-h", "--help"):
    argv = ["run", *argv]
  parser = argparse.ArgumentParser(
    prog="studies/gpu.sh",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  sub = parser.add_subparsers(dest="verb", required=True)
  common = argparse.ArgumentParser(add_help=False)
  common.add_argument("--results", default="results", help="the results folder (default: results)")
  common.add_argument(
    "--carry",
    default="studies/carry/grok",
    help="checkpoints carried between leases (default: studies/carry/grok)",
  )
  common.add_argument("--tiny", action="store_true", help="toy sizes: the CPU check")
  run = sub.add_parser("run", parents=[common], help="the lease (the default)")
  run.add_argument(
    "--budget",
    type=float,
    default=540.0,
    metavar="SECONDS",
    help="stop cleanly (checkpointed, packed) within this many seconds (default: 540)",
  )
  run.add_argument(
    "--out",
    default=os.environ.get("OUT") or "runs/lease",
    help="the folder that comes back from the lease (default: $OUT, else runs/lease)",
  )
  run.add_argument(
    "--work",
    default=str(pathlib.Path.home() / ".cache/stiefax/studies/gpu"),
    help="where the runs train, with their checkpoints (default: ~/.cache/stiefax/studies/gpu)",
  )
  unpack_parser = sub.add_parser("unpack", parents=[common], help="put a lease's files in place")
  unpack_parser.add_argument("dir", help="the folder of files that came back")
  sub.add_parser("status", parents=[common], help="what is finished and what is left")
  args = parser.parse_args(argv)
  if args.verb == "run" and not args.budget > 0:
    parser.error(f"--budget {args.budget:g} must be a positive number of seconds")
  return {"run": lease, "unpack": unpack, "status": status}[args.verb](args)


if __name__ == "__main__":
  sys.exit(main())
