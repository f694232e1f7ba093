"""The command line of ``stiefax grok``: arguments, configuration, and the run loop.

Each (arm, seed) is a job: a finished run (same identity and seed in its file) is not
trained again; otherwise the job is claimed with a lock (``<run>.lock``), trained from
its checkpoint (``<run>.ckpt``) if there is one, and written atomically
(:mod:`stiefax.experiments.store`). A job another process holds is waited for.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from typing import Any
from typing import Optional

from stiefax.experiments import flags
from stiefax.experiments import grok
from stiefax.experiments import jobs
from stiefax.experiments import store
from stiefax.experiments.checkpoints import Checkpoints
from stiefax.experiments.checkpoints import DamagedCheckpoint
from stiefax.experiments.checkpoints import set_aside
from stiefax.experiments.flags import CommandError
from stiefax.experiments.flags import os_error
from stiefax.experiments.flags import writable_dir
from stiefax.experiments.grok.config import ARMS
from stiefax.experiments.grok.config import PRESETS
from stiefax.experiments.grok.config import STABILIZED
from stiefax.experiments.grok.config import GrokConfig
from stiefax.experiments.grok.quick_seeds import seed_note
from stiefax.experiments.grok.runs import record_identity
from stiefax.experiments.grok.runs import run_command
from stiefax.experiments.grok.runs import run_file_name
from stiefax.experiments.grok.runs import run_identity
from stiefax.experiments.grok.runs import summary_table
from stiefax.experiments.grok.runs import summary_words
from stiefax.experiments.grok.training import train_seeds

__all__ = ["add_arguments", "resolve_config", "checkpoint_interval", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.description = grok.__doc__
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  parser.add_argument(
    "--preset",
    choices=sorted(PRESETS),
    default="quick",
    help="configuration preset (default: quick)",
  )
  parser.add_argument(
    "--arms", default=None, help=f"comma-separated arms from {','.join(ARMS)} (default: A2,B2)"
  )
  parser.add_argument(
    "--seeds", default=None, help="comma-separated non-negative integer seeds (default: 0)"
  )
  parser.add_argument(
    "--epochs", type=int, default=None, help="full-batch epochs (quick: 200, paper: 20000)"
  )
  parser.add_argument(
    "--eval-every",
    type=int,
    default=None,
    help="epochs between evaluations (quick: 20, paper: 100)",
  )
  parser.add_argument(
    "--out", default="runs/grok", help="directory for one JSON file per run (default: runs/grok)"
  )
  parser.add_argument(
    "--stabilize",
    action="store_true",
    help="Power et al. setting: b2 0.98 and a 10-step linear warm-up",
  )
  parser.add_argument(
    "--vmap-seeds",
    action="store_true",
    help="train the seeds of an arm as one program, the seed a batch axis"
    " (jax.vmap; pays on an accelerator)",
  )
  parser.add_argument(
    "--checkpoint-every",
    type=int,
    default=None,
    help="epochs between checkpoints of an unfinished run, rounded up to"
    " a multiple of --eval-every; 0: only on Ctrl-C (default: 1000)",
  )


def resolve_config(args: argparse.Namespace) -> tuple[GrokConfig, list[str], list[int]]:
  """The configuration, arms and seeds that ``args`` ask for (``CommandError`` if bad)."""
  preset = PRESETS[args.preset]
  config: GrokConfig = preset["config"]
  changes: dict[str, Any] = {}
  if args.epochs is not None:
    changes["epochs"] = args.epochs
  if args.eval_every is not None:
    changes["eval_every"] = args.eval_every
  if args.stabilize:
    changes.update(STABILIZED)
  config = dataclasses.replace(config, **changes)
  if config.epochs < 1:
    raise CommandError(f"--epochs {config.epochs} must be a positive integer.")
  if config.eval_every < 1:
    raise CommandError(f"--eval-every {config.eval_every} must be a positive integer.")
  if config.epochs % config.eval_every:
    raise CommandError(
      f"--epochs {config.epochs} is not a multiple of --eval-every {config.eval_every};"
      " every evaluation window must have the same length (one compiled program)."
    )
  _check_optimizer(config)
  every = getattr(args, "checkpoint_every", None)
  if every is not None and every < 0:
    raise CommandError(f"--checkpoint-every {every} must be >= 0 (0: only on Ctrl-C).")
  arms = flags.parse_arms(args.arms, ARMS, preset["arms"])
  return config, arms, flags.parse_seeds(args.seeds, preset["seeds"])


def _check_optimizer(config: GrokConfig) -> None:
  """The optimizer settings in the optimizers' own ranges (``CommandError`` if not)."""
  for arg, field in (
    ("learning_rate", "learning_rate"),
    ("learning_rate", "riemannian_lr"),
    ("weight_decay", "weight_decay"),
    ("b1", "b1"),
    ("b2", "b2"),
    ("eps", "riemannian_eps"),
    ("max_norm", "tau"),
  ):
    problem = flags.optimizer_problem(arg, getattr(config, field))
    if problem is not None:
      raise CommandError(f"the setting {field} {problem}.")


def checkpoint_interval(config: GrokConfig, every: Optional[int]) -> int:
  """``every`` (default 1000) rounded up to a multiple of ``eval_every``; 0 stays 0."""
  return jobs.checkpoint_interval(1000 if every is None else every, config.eval_every)


@dataclasses.dataclass
class _Job(jobs.Job):
  """One (arm, seed) of the command and where its files live."""

  identity: dict = dataclasses.field(default_factory=dict)

  command = "stiefax grok"

  def same(self, record: dict) -> bool:
    return record_identity(record) == self.identity and record["seed"] == self.seed


def _checkpoint_epoch(job: _Job) -> Optional[int]:
  """The epoch of ``job``'s checkpoint (None: none, or damaged and moved aside)."""
  ckpt = Checkpoints(job.ckpt_path)
  try:
    return ckpt.latest_epoch()
  except DamagedCheckpoint as e:
    set_aside(ckpt, e, "stiefax grok")
    return None
  finally:
    ckpt.close()


def _remove_checkpoint(job: _Job) -> None:
  """Removes a finished run's checkpoint folder; a link there is left, with a warning."""
  try:
    Checkpoints(job.ckpt_path).remove()
  except OSError as e:
    print(f"stiefax grok: warning: {os_error(e)}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
  config, arms, seeds = resolve_config(args)
  out = writable_dir(args.out, "--out")
  setting = (
    f"preset={args.preset} epochs={config.epochs} eval_every={config.eval_every}"
    f"{' stabilize' if args.stabilize else ''}"
  )
  print(
    f"stiefax grok: {setting}; arms {','.join(arms)}; seeds {','.join(map(str, seeds))} -> {out}",
    flush=True,
  )
  todo = [
    _Job(
      arm,
      seed,
      out / run_file_name(config, arm, seed, args.preset, args.stabilize),
      run_identity(config, arm, args.preset),
    )
    for seed in seeds
    for arm in arms
  ]
  records: dict = {}
  waiting: set = set()
  every = checkpoint_interval(config, args.checkpoint_every)
  vmap = bool(getattr(args, "vmap_seeds", False)) and len(seeds) > 1

  def claim(job, locks) -> bool:
    """True if this process now holds ``job`` (its lock in ``locks``) and must train it."""
    key = (job.arm, job.seed)
    done = job.finished()
    if done:
      print(f"  {job.arm} seed {job.seed}: finished already ({job.path.name})", flush=True)
      records[key] = done
      if os.path.lexists(job.ckpt_path):  # left by a process ended between the two
        leftover = store.RunLock(job.lock_path)
        with contextlib.suppress(OSError):
          if leftover.acquire():  # nobody trains it: the training state is not needed
            try:
              _remove_checkpoint(job)
            finally:
              leftover.release()
      return False
    lock = store.RunLock(job.lock_path)
    try:
      acquired = lock.acquire()
    except OSError as e:
      raise CommandError(f"cannot lock the run: {os_error(e)}.") from None
    if not acquired:
      if key not in waiting:
        print(
          f"  {job.arm} seed {job.seed}: being trained by {lock.held_by()}; waiting for it",
          flush=True,
        )
        waiting.add(key)
      return False
    locks.append(lock)
    done = job.finished(repair=True)  # finished meanwhile?
    if done:
      if os.path.lexists(job.ckpt_path):  # left by a process ended just after
        _remove_checkpoint(job)
      records[key] = done
      return False
    return True

  def train_batch(batch: list) -> None:
    """Trains ``batch`` (jobs of one arm, checkpointed at the same epoch), writes them."""
    checkpoints = [Checkpoints(job.ckpt_path) for job in batch]
    try:
      results = train_seeds(
        config,
        batch[0].arm,
        [job.seed for job in batch],
        checkpoints=checkpoints,
        checkpoint_every=every,
        vmap=vmap,
      )
    finally:
      for c in checkpoints:
        c.close()
    for job, record, ckpt in zip(batch, results, checkpoints):
      record["config"].update(preset=args.preset, stabilize=bool(args.stabilize), setting=setting)
      record["run_id"] = store.digest(job.identity)
      record["command"] = run_command(config, job.arm, job.seed, args.preset, args.stabilize, out)
      record["code"] = store.code_version()
      try:
        store.write_json(job.path, record)
      except OSError as e:
        raise CommandError(f"cannot write {job.path} ({e.strerror or e}).") from None
      ckpt.close()
      _remove_checkpoint(job)  # the result is written: the training state is not needed
      records[(job.arm, job.seed)] = record

  def train_claimed(claimed: list) -> None:
    """Trains ``claimed`` in batches of seeds checkpointed at the same epoch."""
    by_epoch: dict = {}
    for job in claimed:
      at = _checkpoint_epoch(job)
      by_epoch.setdefault(-1 if at is None else at, []).append(job)
    for batch in by_epoch.values():
      try:
        train_batch(batch)
      except DamagedCheckpoint as e:  # unreadable when restored: aside, then again
        damaged = next(j for j in batch if Checkpoints(j.ckpt_path).directory == e.directory)
        set_aside(Checkpoints(damaged.ckpt_path), e, "stiefax grok")
        train_claimed(batch)

  while len(records) < len(todo):
    before = len(records)
    for arm in arms:
      pending = [j for j in todo if j.arm == arm and (j.arm, j.seed) not in records]
      for candidates in [pending] if vmap else [[j] for j in pending]:
        locks: list = []
        try:
          claimed = [job for job in candidates if claim(job, locks)]
          train_claimed(claimed)
        finally:
          for lock in locks:
            lock.release()
    if len(records) < len(todo) and len(records) == before:
      time.sleep(2.0)  # every remaining run is held by another process
  ordered = [records[(j.arm, j.seed)] for j in todo]
  print(summary_table(ordered))
  print()
  print(summary_words(ordered))
  print(seed_note(ordered))
  print(f"{len(ordered)} run(s) in {out}; tables and plots: stiefax report {out}")
  return 0
