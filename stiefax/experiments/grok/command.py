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
import pathlib
import sys
import time
from typing import Any
from typing import Optional
from typing import Sequence

from stiefax.experiments import arms as arms_lib
from stiefax.experiments import store
from stiefax.experiments.cli import CommandError
from stiefax.experiments.cli import check_seeds
from stiefax.experiments.cli import os_error
from stiefax.experiments.cli import writable_dir
from stiefax.experiments.grok.checkpoints import Checkpoints
from stiefax.experiments.grok.checkpoints import DamagedCheckpoint
from stiefax.experiments.grok.checkpoints import set_aside
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
  from stiefax.experiments import grok  # pylint: disable=g-import-not-at-top

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


def _parse_arms(text: Optional[str], default: Sequence[str]) -> list[str]:
  if text is None:
    return list(default)
  names = [a.strip() for a in text.split(",") if a.strip()]
  if not names:
    raise CommandError(f"--arms {text!r} names no arm; choose from {','.join(ARMS)}.")
  found = {a: arms_lib.lookup(a, ARMS) for a in names}
  unknown = [a for a, arm in found.items() if arm is None]
  if unknown:
    raise CommandError(
      f"unknown arm(s) {','.join(unknown)} in --arms; choose from {','.join(ARMS)}."
    )
  return list(dict.fromkeys(arm.name for arm in found.values() if arm is not None))


def _parse_seeds(text: Optional[str], default: Sequence[int]) -> list[int]:
  if text is None:
    return list(default)
  parts = [s.strip() for s in text.split(",") if s.strip()]
  if not parts:
    raise CommandError(f"--seeds {text!r} is empty; give e.g. --seeds 0,1,2.")
  try:
    seeds = [int(s) for s in parts]
  except ValueError:
    raise CommandError(
      f"--seeds {text!r} must be comma-separated integers, e.g. --seeds 0,1,2."
    ) from None
  check_seeds(seeds, "--seeds")
  return list(dict.fromkeys(seeds))


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
  return config, _parse_arms(args.arms, preset["arms"]), _parse_seeds(args.seeds, preset["seeds"])


def _check_optimizer(config: GrokConfig) -> None:
  """The optimizer settings in the optimizers' own ranges (``CommandError`` if not)."""
  from stiefax import _routing  # pylint: disable=g-import-not-at-top

  for arg, field in (
    ("learning_rate", "learning_rate"),
    ("learning_rate", "riemannian_lr"),
    ("weight_decay", "weight_decay"),
    ("b1", "b1"),
    ("b2", "b2"),
    ("eps", "riemannian_eps"),
    ("max_norm", "tau"),
  ):
    problem = _routing.hyperparam_problem(arg, getattr(config, field))
    if problem is not None:
      raise CommandError(f"the setting {field} {problem}.")


def checkpoint_interval(config: GrokConfig, every: Optional[int]) -> int:
  """``every`` (default 1000) rounded up to a multiple of ``eval_every``; 0 stays 0."""
  every = 1000 if every is None else every
  return -(-every // config.eval_every) * config.eval_every if every else 0


def _finished(
  path: pathlib.Path, identity: dict, seed: int, repair: bool = False
) -> Optional[dict]:
  """The run written at ``path`` if it is this run (same identity and seed), else None.

  With ``repair`` (only while holding the run's lock), a file there that is damaged or
  holds another run is moved aside (never deleted), so that the run can be written.
  """
  record, problem = store.finished_run(
    path, lambda r: record_identity(r) == identity and r["seed"] == seed
  )
  if record is not None or not problem or not repair:
    return record
  aside = store.move_aside(path, "bad")
  print(
    f"stiefax grok: {path} is unusable ({problem}); moved it to {aside.name}"
    " and training the run again",
    file=sys.stderr,
    flush=True,
  )
  return None


@dataclasses.dataclass
class _Job:
  """One (arm, seed) of the command and where its files live."""

  arm: str
  seed: int
  path: pathlib.Path  # the result JSON
  identity: dict

  @property
  def lock_path(self) -> pathlib.Path:
    return self.path.with_suffix(".lock")

  @property
  def ckpt_path(self) -> pathlib.Path:
    return self.path.with_suffix(".ckpt")


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
  jobs = [
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
    done = _finished(job.path, job.identity, job.seed)
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
    done = _finished(job.path, job.identity, job.seed, repair=True)  # finished meanwhile?
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

  while len(records) < len(jobs):
    before = len(records)
    for arm in arms:
      pending = [j for j in jobs if j.arm == arm and (j.arm, j.seed) not in records]
      for candidates in [pending] if vmap else [[j] for j in pending]:
        locks: list = []
        try:
          claimed = [job for job in candidates if claim(job, locks)]
          train_claimed(claimed)
        finally:
          for lock in locks:
            lock.release()
    if len(records) < len(jobs) and len(records) == before:
      time.sleep(2.0)  # every remaining run is held by another process
  ordered = [records[(j.arm, j.seed)] for j in jobs]
  print(summary_table(ordered))
  print()
  print(summary_words(ordered))
  print(seed_note(ordered))
  print(f"{len(ordered)} run(s) in {out}; tables and plots: stiefax report {out}")
  return 0
