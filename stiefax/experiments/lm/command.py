"""``stiefax lm``: the command line, the runs it asks for, and the loop that trains them.

Every (arm, rate, seed) is one JSON file in ``--out`` (:mod:`stiefax.experiments.store`:
written atomically, never overwritten); a finished run is read back, not trained
again. A run is claimed by a lock (``<run>.lock``), so several processes can share one
``--out``: each trains the runs no other process holds, then waits for the others'.
An unfinished run keeps an Orbax checkpoint in ``<run>.ckpt`` (every
``--checkpoint-every`` steps and on Ctrl-C or SIGTERM); the same command resumes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import sys
import time

import jax

from stiefax.experiments import flags
from stiefax.experiments import jobs
from stiefax.experiments import lm
from stiefax.experiments import store
from stiefax.experiments.checkpoints import Checkpoints
from stiefax.experiments.checkpoints import DamagedCheckpoint
from stiefax.experiments.checkpoints import set_aside
from stiefax.experiments.cli import CommandError
from stiefax.experiments.cli import writable_dir
from stiefax.experiments.lm import data as data_lib
from stiefax.experiments.lm import runs as runs_lib
from stiefax.experiments.lm import tables
from stiefax.experiments.lm import training
from stiefax.experiments.lm.config import ARMS
from stiefax.experiments.lm.config import PRESETS
from stiefax.experiments.lm.config import SWEEP_RATES
from stiefax.experiments.lm.config import LMConfig
from stiefax.experiments.report import load_runs

__all__ = ["add_arguments", "resolve_config", "best_rate", "Job", "run"]

#: Arms and rate of ``stiefax lm`` with no arguments (the quick preset).
QUICK_ARMS = ("A2", "A2-qknorm", "B2")


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.description = lm.__doc__
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  parser.add_argument(
    "--preset", choices=sorted(PRESETS), default="quick", help="model and budget (default quick)"
  )
  parser.add_argument(
    "--arms",
    default=None,
    help=f"comma-separated arms from {','.join(ARMS)} (default {','.join(QUICK_ARMS)})",
  )
  parser.add_argument("--seeds", default="0", help="comma-separated seeds in [0, 2^32) (default 0)")
  parser.add_argument(
    "--lr",
    default=None,
    help="AdamW peak rate(s), comma-separated, or 'best': each arm's rate of the sweep"
    " (3e-4 to 3e-1, x3 apart) with the lowest mean validation loss among the finished"
    " runs in --out (default: the preset's rate)",
  )
  parser.add_argument("--steps", type=int, default=None, help="training steps (preset's)")
  parser.add_argument("--eval-every", type=int, default=None, help="steps between evaluations")
  parser.add_argument("--batch", type=int, default=None, help="sequences per step (preset's)")
  parser.add_argument(
    "--out", default="runs/lm", help="directory for one JSON file per run (default runs/lm)"
  )
  parser.add_argument(
    "--checkpoint-every",
    type=int,
    default=500,
    help="steps between checkpoints of an unfinished run (a multiple of --eval-every"
    " is used; 0: only on Ctrl-C/SIGTERM; default 500)",
  )
  parser.add_argument("--no-progress", action="store_true", help="no progress bars")
  parser.add_argument("--no-wait", action="store_true", help=jobs.NO_WAIT_HELP)


def _rates(text: str) -> list[float]:
  try:
    rates = [float(s) for s in text.split(",") if s.strip()]
  except ValueError:
    raise CommandError(f"--lr {text!r} must be comma-separated numbers or 'best'.") from None
  if not rates or any(not (math.isfinite(r) and r > 0) for r in rates):
    raise CommandError(f"--lr {text!r}: rates must be finite and > 0.")
  return list(dict.fromkeys(rates))


def resolve_config(args: argparse.Namespace) -> tuple[LMConfig, list[str], list[int]]:
  """The configuration (before the rate), arms and seeds ``args`` ask for."""
  base = PRESETS[args.preset]
  changes: dict = {}
  if args.steps is not None:
    if args.steps < 1:
      raise CommandError(f"--steps {args.steps} must be >= 1.")
    changes["steps"] = args.steps
    changes["warmup_steps"] = base.warmup_steps * args.steps // base.steps
    changes["eval_every"] = min(base.eval_every, args.steps)
  if args.eval_every is not None:
    changes["eval_every"] = args.eval_every
  if args.batch is not None:
    changes["batch"] = args.batch
  config = dataclasses.replace(base, **changes)
  try:
    config.check()
  except ValueError as e:
    raise CommandError(str(e)) from None
  if args.checkpoint_every < 0:
    raise CommandError(f"--checkpoint-every {args.checkpoint_every} must be >= 0.")
  # An empty --arms means the default arms, as no --arms does.
  arms = flags.parse_arms(args.arms or None, ARMS, QUICK_ARMS)
  return config, arms, flags.parse_seeds(args.seeds, (0,))


def best_rate(out: pathlib.Path, arm: str, config: LMConfig, facts: dict, preset: str) -> float:
  """The AdamW rate of ``arm`` chosen on the validation split among the finished runs
  of this configuration in ``out`` (:func:`stiefax.experiments.lm.tables.select_rate`).

  Raises CommandError when there are none.
  """
  groups, _ = load_runs(out) if out.is_dir() else ({}, [])
  ref = runs_lib.run_config(ARMS[arm], config, facts, preset)
  same = lambda c: {k: v for k, v in c.items() if k != "adamw_lr"}
  mine = [r for r in groups.get("lm", []) if r["arm"] == arm and same(r["config"]) == same(ref)]
  have = {r["config"]["adamw_lr"] for r in mine}
  missing = [f"{lr:g}" for lr in SWEEP_RATES if lr not in have]
  if missing:
    raise CommandError(
      f"--lr best: the {arm} sweep in {out} is not finished (no run at rate"
      f" {','.join(missing)}); run --lr {','.join(f'{lr:g}' for lr in SWEEP_RATES)} first."
    )
  lr = tables.select_rate([r for r in mine if r["config"]["adamw_lr"] in SWEEP_RATES])
  if lr is None:
    raise CommandError(f"--lr best: no seed of {arm} has every rate in {out}.")
  return lr


@dataclasses.dataclass
class Job(jobs.Job):
  """One (arm, rate, seed) of the command and where its files live."""

  config: LMConfig = dataclasses.field(default_factory=LMConfig)
  cfg: dict = dataclasses.field(default_factory=dict)  # the run's recorded configuration

  command = "stiefax lm"

  def same(self, record: dict) -> bool:
    key = runs_lib.run_key({"arm": self.arm, "config": self.cfg, "seed": self.seed})
    return runs_lib.run_key(record) == key


def run(args: argparse.Namespace) -> int:
  config, arm_names, seeds = resolve_config(args)
  if not str(args.out).strip():
    raise CommandError("--out is empty; give a directory for the run files.")
  out = writable_dir(args.out, "--out")
  facts = data_lib.load().facts
  todo = []
  for arm in arm_names:
    if args.lr is None:
      rates = [config.adamw_lr]
    elif args.lr.strip().lower() == "best":
      rates = [best_rate(out, arm, config, facts, args.preset)]
      print(f"  {arm}: best rate {rates[0]:g} by validation loss in {out}", flush=True)
    else:
      rates = _rates(args.lr)
    for lr in rates:
      c = dataclasses.replace(config, adamw_lr=lr)
      cfg = runs_lib.run_config(ARMS[arm], c, facts, args.preset)
      for seed in seeds:
        path = out / runs_lib.run_name(arm, cfg, seed)
        todo.append(Job(arm, seed, path, config=c, cfg=cfg))
  print(
    f"stiefax lm: preset={args.preset} steps={config.steps} d={config.d_model}"
    f" depth={config.depth} heads={config.heads}/{config.kv_heads} r={config.head_dim};"
    f" {len(todo)} run(s) -> {out}",
    flush=True,
  )
  every = jobs.checkpoint_interval(args.checkpoint_every, config.eval_every)
  records: dict = {}
  told: set = set()
  while len(records) < len(todo):
    before = len(records)
    for job in todo:
      if job.path.name in records:
        continue
      done = job.finished()
      if done is not None:
        records[job.path.name] = done
        continue
      lock = store.RunLock(job.lock_path)
      if not lock.acquire():
        if job.path.name not in told:
          print(f"  {job.path.name}: being trained by {lock.held_by()}; waiting", flush=True)
          told.add(job.path.name)
        continue
      try:
        done = job.finished(repair=True)
        if done is None:
          done = _train(job, every, out, progress=not args.no_progress)
        records[job.path.name] = done
        if job.ckpt_path.is_dir() and not job.ckpt_path.is_symlink():
          Checkpoints(job.ckpt_path).remove()  # the result is written
      finally:
        lock.release()
    if len(records) < len(todo) and len(records) == before:
      if args.no_wait:  # every run left is held by another process
        return jobs.leave_held(len(todo) - len(records))
      time.sleep(2.0)
  ordered = [records[j.path.name] for j in todo]
  print()
  print(tables.summary(ordered))
  print(f"{len(ordered)} run(s) in {out}; tables and plots: stiefax report {out}")
  return 0


def _train(job: Job, every: int, out: pathlib.Path, progress: bool) -> dict:
  arm = ARMS[job.arm]
  desc = f"{job.arm} lr={job.config.adamw_lr:g} seed {job.seed}"
  for attempt in (0, 1):
    ckpt = Checkpoints(job.ckpt_path)
    try:
      result = training.train(
        arm,
        job.config,
        job.seed,
        progress=progress,
        checkpoints=ckpt,
        checkpoint_every=every,
        desc=desc,
      )
      break
    except DamagedCheckpoint as e:
      if attempt:
        raise CommandError(f"checkpoint {ckpt.directory}: {e.reason}") from None
      set_aside(ckpt, e, "stiefax lm")

  record = {
    "experiment": "lm",
    "arm": job.arm,
    "seed": job.seed,
    "config": job.cfg,
    **result,
    "command": runs_lib.run_command(job.arm, job.cfg, job.seed, out),
    "code": store.code_version(),
    "jax_version": jax.__version__,
    "backend": jax.default_backend(),
  }
  try:
    store.write_json(job.path, record)
  except OSError as e:
    raise CommandError(f"cannot write {job.path} ({e.strerror or e}).") from None
  m = record["metrics"]
  print(
    f"  {desc}: val {m['val_bpb']:.4f} test {m['test_bpb']:.4f} bits/byte,"
    f" max logit {m['max_logit_max']:.1f}, isometry {m['isometry']:.1e}"
    f"{' (diverged)' if m['diverged'] else ''}",
    file=sys.stdout,
    flush=True,
  )
  return record
