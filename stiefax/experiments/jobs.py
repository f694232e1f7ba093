"""The run loop of the training commands, and their jobs: one run each.

A :class:`Job` is one run of a command (an arm and a seed) with the paths of its files:
the result JSON, its lock (``<run>.lock``) and its checkpoint (``<run>.ckpt``);
:func:`checkpoint_interval` rounds ``--checkpoint-every`` to whole evaluation windows.

:func:`run_jobs` is the one run loop of ``stiefax grok``, ``stiefax lm`` and
``stiefax patches``: a command builds its jobs and a function that trains a batch of
them, and the loop does the rest. For every job it

1. skips a finished run (its file holds this job's run; ``--force`` trains it again);
2. claims the run's lock (:class:`stiefax.experiments.store.RunLock`), or passes over a
   run another process holds and comes back to it after the other runs;
3. repairs: a file there that is damaged or holds another run is moved aside, never
   deleted (:meth:`Job.finished`), and so is a damaged checkpoint;
4. trains (from the run's checkpoint, if it has one: the command's ``train``);
5. writes the result atomically; a file already there (``--force``) is moved aside
   first, so no result file is ever overwritten or lost;
6. removes the run's checkpoint, which the result makes useless;
7. waits for the runs held by other processes, or, with ``--no-wait``, leaves them to
   them and ends with :data:`EXIT_HELD`; with ``--time-limit``, stops before the limit
   with :data:`EXIT_TIME_LIMIT` and lists what is left.

An ``OSError`` (a full disk, a link where a lock should be) ends the command with one
line naming the file and the reason (exit status 2).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import os
import pathlib
import sys
import time
from typing import Any
from typing import Callable
from typing import Hashable
from typing import Optional
from typing import Sequence
from typing import Union

from stiefax.experiments import protocol
from stiefax.experiments import store
from stiefax.experiments.flags import CommandError
from stiefax.experiments.flags import os_error
from stiefax.experiments.stopping import OutOfTime

__all__ = [
  "checkpoint_interval",
  "EXIT_HELD",
  "EXIT_TIME_LIMIT",
  "Job",
  "leave_held",
  "NO_WAIT_HELP",
  "FORCE_HELP",
  "add_arguments",
  "Outcome",
  "run_jobs",
]

#: The exit status of a command run with ``--no-wait`` that left runs held by other
#: processes to them (``EX_TEMPFAIL`` of ``sysexits.h``: run it again later).
EXIT_HELD = 75

#: The exit status of a command stopped by its ``--time-limit`` with runs unfinished
#: (checkpointed, or not started): ``EX_TEMPFAIL`` too, run the same command again.
EXIT_TIME_LIMIT = 75

NO_WAIT_HELP = (
  "leave the runs another process is training to it: train the free runs, then end"
  f" with status {EXIT_HELD} if any were held (default: wait for them)"
)


FORCE_HELP = (
  "train finished runs again: the earlier result file is moved aside to"
  " <run>.json.replaced-<time>-<pid> (never overwritten nor deleted) when the new one is"
  " written (default: a finished run is read back, not trained)"
)


def add_arguments(parser: Any) -> None:
  """The run loop's flags, the same in every command: ``--no-progress``, ``--no-wait``
  and ``--force`` (``parser``: an ``argparse`` parser or argument group)."""
  parser.add_argument("--no-progress", action="store_true", help="no progress bars")
  parser.add_argument("--no-wait", action="store_true", help=NO_WAIT_HELP)
  parser.add_argument("--force", action="store_true", help=FORCE_HELP)


def leave_held(count: int) -> int:
  """Say that ``count`` runs held by other processes are left to them (``--no-wait``).

  Returns :data:`EXIT_HELD`, the status the command ends with.
  """
  print(f"{count} run(s) held by other processes are left to them (--no-wait)", flush=True)
  return EXIT_HELD


def checkpoint_interval(every: int, eval_every: int) -> int:
  """``every`` rounded up to a multiple of ``eval_every``; 0 (only on Ctrl-C) stays 0."""
  return -(-every // eval_every) * eval_every if every else 0


@dataclasses.dataclass
class Job(abc.ABC):
  """One run of a command (an arm and a seed) and where its files live.

  A command's job defines :meth:`same`: whether a run read back from ``path`` is this
  job's run.
  """

  arm: str
  seed: int
  path: pathlib.Path  # the result JSON

  #: The command that prints this job's notices (``"stiefax grok"``).
  command = "stiefax"
  #: Whether a run of this command keeps a checkpoint (``<run>.ckpt``) to resume from.
  checkpointed = True

  @property
  def label(self) -> str:
    """How the command's lines name the run (``"B2 seed 0"``)."""
    return f"{self.arm} seed {self.seed}"

  @property
  def lock_path(self) -> pathlib.Path:
    return self.path.with_suffix(".lock")

  @property
  def ckpt_path(self) -> pathlib.Path:
    return self.path.with_suffix(".ckpt")

  @abc.abstractmethod
  def same(self, record: dict) -> bool:
    """Whether ``record`` (a run read back from ``path``) is this job's run (each
    command defines it from its run identity)."""

  def finished(self, repair: bool = False) -> Optional[dict]:
    """The run written at ``path`` if it is a valid run file
    (:func:`stiefax.experiments.protocol.record_problem`) and this job's run, else None.

    With ``repair`` (only while holding the job's lock), a file there that is damaged
    or holds another run is moved aside (never deleted), so that the run can be written.
    """
    record, problem = store.finished_run(self.path, self.same, protocol.record_problem)
    if record is not None or not problem or not repair:
      return record
    aside = store.move_aside(self.path, "bad")
    print(
      f"{self.command}: {self.path} is unusable ({problem}); moved it to {aside.name}"
      " and training the run again",
      file=sys.stderr,
      flush=True,
    )
    return None


#: What :func:`run_jobs` trains: a list of jobs, or a function of the results so far
#: (by result path) that gives the jobs (a protocol whose later runs depend on earlier ones).
Plan = Union[Sequence[Job], Callable[[dict], Sequence[Job]]]

#: How a command trains a batch of claimed jobs: ``train(batch, checkpoints)``, where
#: ``checkpoints`` holds each job's :class:`~stiefax.experiments.checkpoints.Checkpoints`
#: (None for a command without checkpoints), returns one result record per job.
Train = Callable[[list, list], list]


@dataclasses.dataclass
class Outcome:
  """What :func:`run_jobs` ends with: the exit status and the runs (in plan order;
  complete only when ``status`` is 0)."""

  status: int
  records: list


def _held_line(job: Job, lock: store.RunLock) -> str:
  return f"  {job.label}: being trained by {lock.held_by()}; coming back to it after the other runs"


def _acquire(lock: store.RunLock) -> bool:
  try:
    return lock.acquire()
  except OSError as e:
    raise CommandError(f"cannot lock the run: {os_error(e)}.") from None


def _checkpoint_epoch(job: Job) -> Optional[int]:
  """The epoch of ``job``'s checkpoint (None: none, or damaged and moved aside)."""
  from stiefax.experiments import checkpoints  # jax and orbax: after --help

  ckpt = checkpoints.Checkpoints(job.ckpt_path)
  try:
    return ckpt.latest_epoch()
  except checkpoints.DamagedCheckpoint as e:
    checkpoints.set_aside(ckpt, e, job.command)
    return None
  finally:
    ckpt.close()


def _remove_checkpoint(job: Job) -> None:
  """Removes a finished run's checkpoint folder; a link there is left, with a warning."""
  if not job.checkpointed or not os.path.lexists(job.ckpt_path):
    return
  from stiefax.experiments import checkpoints  # jax and orbax: after --help

  try:
    checkpoints.Checkpoints(job.ckpt_path).remove()
  except OSError as e:
    print(f"{job.command}: warning: {os_error(e)}", file=sys.stderr, flush=True)


def _write(job: Job, record: dict) -> None:
  """Writes ``job``'s result atomically; a file already there is moved aside first."""
  try:
    if os.path.lexists(job.path):
      aside = store.move_aside(job.path, "replaced")
      print(
        f"{job.command}: moved the earlier {job.path.name} to {aside.name}",
        file=sys.stderr,
        flush=True,
      )
    store.write_json(job.path, record)
  except OSError as e:
    raise CommandError(f"cannot write {job.path} ({e.strerror or e}).") from None


@dataclasses.dataclass
class _Loop:
  train: Train
  force: bool
  deadline: Optional[float]
  take: Optional[Callable[[Any], Optional[dict]]]
  clock: Callable[[], float]
  records: dict = dataclasses.field(default_factory=dict)  # result path -> record
  told: set = dataclasses.field(default_factory=set)  # held runs said so

  def out_of_time(self) -> None:
    """Raises ``OutOfTime`` (no run in training) once the deadline has passed."""
    if self.deadline is not None and self.clock() >= self.deadline:
      raise OutOfTime(None)

  def finished(self, job: Job) -> bool:
    """Reads ``job``'s finished run into ``records`` (not with ``--force``)."""
    done = None if self.force else job.finished()
    if done is None:
      return False
    print(f"  {job.label}: finished already ({job.path.name})", flush=True)
    self.records[job.path] = done
    if job.checkpointed and os.path.lexists(job.ckpt_path):  # left by a process ended
      leftover = store.RunLock(job.lock_path)  # between writing and removing it
      with contextlib.suppress(OSError):
        if leftover.acquire():  # nobody trains it: the training state is not needed
          try:
            _remove_checkpoint(job)
          finally:
            leftover.release()
    return True

  def claim(self, job: Job, locks: list) -> bool:
    """True if this process now holds ``job`` (its lock in ``locks``) and must train it."""
    if self.finished(job):
      return False
    lock = store.RunLock(job.lock_path)
    if not _acquire(lock):
      if job.path not in self.told:
        print(_held_line(job, lock), flush=True)
        self.told.add(job.path)
      return False
    locks.append(lock)
    done = job.finished(repair=True)  # finished meanwhile? (a bad file: moved aside)
    if self.force:
      return True
    if done is None and self.take is not None:
      done = self.take(job)
    if done is not None:
      _remove_checkpoint(job)  # left by a process ended just after writing the run
      self.records[job.path] = done
      return False
    return True

  def train_claimed(self, claimed: list) -> None:
    """Trains ``claimed`` in batches checkpointed at the same epoch, writes them."""
    if not claimed:
      return
    by_epoch: dict = {}
    for job in claimed:
      at = _checkpoint_epoch(job) if job.checkpointed else None
      by_epoch.setdefault(-1 if at is None else at, []).append(job)
    for batch in by_epoch.values():
      self.out_of_time()
      self.train_batch(batch)

  def train_batch(self, batch: list) -> None:
    ckpts: list = [None] * len(batch)
    if batch[0].checkpointed:
      from stiefax.experiments import checkpoints  # jax and orbax: after --help

      ckpts = [checkpoints.Checkpoints(job.ckpt_path) for job in batch]
      try:
        results = self.train(batch, ckpts)
      except checkpoints.DamagedCheckpoint as e:  # unreadable when restored: aside, again
        damaged = [c for c in ckpts if c.directory == e.directory]
        if not damaged or not os.path.lexists(e.directory):
          raise CommandError(f"checkpoint {e.directory}: {e.reason}") from None
        checkpoints.set_aside(damaged[0], e, batch[0].command)
        return self.train_claimed(batch)
      finally:
        for c in ckpts:
          c.close()
    else:
      results = self.train(batch, ckpts)
    for job, record in zip(batch, results):
      _write(job, record)
      _remove_checkpoint(job)  # the result is written: the training state is not needed
      self.records[job.path] = record


def run_jobs(
  plan: Plan,
  train: Train,
  *,
  no_wait: bool = False,
  force: bool = False,
  together: Optional[Callable[[Job], Hashable]] = None,
  take: Optional[Callable[[Any], Optional[dict]]] = None,
  time_limit: Optional[float] = None,
  started: Optional[float] = None,
  clock: Callable[[], float] = time.monotonic,
) -> Outcome:
  """Trains the jobs of ``plan`` that are not finished, and returns their runs.

  ``plan`` is the jobs, or a function of the results so far that gives them (it is
  asked again after each pass, so that it can add runs that depend on finished ones).
  ``train(batch, checkpoints)`` trains a batch of claimed jobs and returns their
  records; the loop writes them. Jobs with the same ``together(job)`` key are claimed
  and trained as one batch (split by the epoch of their checkpoints); by default each
  job is its own batch. ``take(job)``, called while holding the job's lock, may give a
  finished run from elsewhere, already written in place, instead of training.

  ``no_wait`` (``--no-wait``): when every run left is held by other processes, say so
  and end with :data:`EXIT_HELD` instead of waiting. ``force`` (``--force``): train
  finished runs again (the earlier file is moved aside when the new one is written).
  ``time_limit`` (``--time-limit``, seconds from ``started``, a ``clock()`` value;
  ``train`` is given the deadline by its command) ends with :data:`EXIT_TIME_LIMIT`
  once it has passed, listing the runs left.

  Raises:
    CommandError: a lock, a result or a checkpoint could not be used (one line).
  """
  start = clock() if started is None else started
  deadline = None if time_limit is None else start + time_limit
  loop = _Loop(train, force, deadline, take, clock)
  key = together or (lambda job: job.path)
  waiting = False
  try:
    while True:
      todo = list(plan(loop.records) if callable(plan) else plan)
      left = [job for job in todo if job.path not in loop.records]
      if not left:
        return Outcome(0, [loop.records[job.path] for job in todo])
      before = len(loop.records)
      groups: dict = {}
      for job in left:
        groups.setdefault(key(job), []).append(job)
      for group in groups.values():
        locks: list = []
        try:
          loop.train_claimed([job for job in group if loop.claim(job, locks)])
        finally:
          for lock in locks:
            lock.release()
      if len(loop.records) > before:
        waiting = False
        continue
      held = [job for job in left if job.path not in loop.records]
      if no_wait:  # every run left is held by another process
        return Outcome(leave_held(len(held)), [])
      if not waiting:
        print(f"waiting for {len(held)} run(s) held by other processes", flush=True)
        waiting = True
      loop.out_of_time()
      time.sleep(2.0)
  except OutOfTime:
    return Outcome(_left_at_the_time_limit(todo, loop.records, time_limit), [])


def _left_at_the_time_limit(todo: list, records: dict, limit: Optional[float]) -> int:
  """Says which runs ``--time-limit`` left unfinished (and where each stands); returns
  :data:`EXIT_TIME_LIMIT`."""
  left = [job for job in todo if job.path not in records]
  command = todo[0].command if todo else "stiefax"
  print(
    f"{command}: time limit of {limit:g} s reached; {len(todo) - len(left)} of"
    f" {len(todo)} run(s) finished, {len(left)} left:",
    flush=True,
  )
  for job in left:
    at = None
    if job.checkpointed and os.path.lexists(job.ckpt_path):
      at = _checkpoint_epoch(job)
    where = "not started" if at is None else f"checkpoint at epoch {at} ({job.ckpt_path.name})"
    print(f"  {job.label}: {where}", flush=True)
  print("The same command resumes them.", flush=True)
  return EXIT_TIME_LIMIT
