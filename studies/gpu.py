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
a lease: at most 8, 16 MiB each; :mod:`studies.archive`): the benchmark, the finished
run JSONs and the checkpoints of the unfinished runs. It packs only a consistent state
and replaces the previous archive only once the new one is whole, so a lease cut off at
any moment gives back the last checkpoint, at most 40 s of training and a few seconds
of packing old. At the end it lists what is left and ends with status 0 (everything
finished), 75 (something left for the next lease) or 1 (a command failed).

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
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence

from stiefax.experiments import jobs
from stiefax.experiments import store
from stiefax.experiments.grok import command as grok_command
from stiefax.experiments.grok import runs as grok_runs
from stiefax.experiments.grok.config import STUDIES
from studies.archive import ROOT
from studies.archive import Packer
from studies.archive import checkpoint_epoch
from studies.archive import unpack

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
    """``"run (a) A2 seeds 0,1,2,3,4"``."""
    seeds = ",".join(map(str, self.seeds))
    return f"{self.study} {self.arm} seed{'s' * (len(self.seeds) > 1)} {seeds}"

  def argv(self, sizes: Sizes) -> list[str]:
    """The ``stiefax grok`` arguments of this entry.

    Args:
      sizes: the lease's sizes (paper scale or ``--tiny``).

    Returns:
      ``["grok", ...]``, without ``--out`` and the time flags.
    """
    argv = ["grok", *sizes.grok, "--arms", self.arm, "--seeds", ",".join(map(str, self.seeds))]
    return (
      argv
      + (["--vmap-seeds"] if len(self.seeds) > 1 else [])
      + (["--stabilize"] if self.stabilize else [])
    )

  def file_names(self, sizes: Sizes) -> dict[int, str]:
    """The run files of this entry, named as ``stiefax grok`` names them.

    Args:
      sizes: the lease's sizes (paper scale or ``--tiny``).

    Returns:
      ``{seed: run file name}``.
    """
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


@dataclasses.dataclass
class Progress:
  """Where one entry stands: its finished seeds and the epochs its checkpoints hold."""

  entry: Entry
  finished: list[int]
  checkpoints: dict[int, int]

  @property
  def done(self) -> bool:
    """Whether every seed is finished."""
    return len(self.finished) == len(self.entry.seeds)

  def words(self) -> str:
    """Where the entry stands, in words (``"seed 0 finished; seed 1 at epoch 3400"``)."""
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
# The lease.
# ----------------------------------------------------------------------------


#: Seconds between a SIGTERM to the lease and its forwarding to the command in training.
FORWARD_AFTER = 10.0


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
    stop: set by SIGTERM: the child is asked to stop (checkpointed) too, after a grace
      of :data:`FORWARD_AFTER` seconds, in case the signal reached it already (a second
      one would stop it at once, without its checkpoint).

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
    with contextlib.suppress(subprocess.TimeoutExpired):
      proc.wait(FORWARD_AFTER)
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
# Here, after the lease: what is left.
# ----------------------------------------------------------------------------


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
