"""The jobs of the training commands: one run each, and where its files live.

A :class:`Job` is one run of a command (an arm and a seed) with the paths of its files:
the result JSON, its lock (``<run>.lock``) and its checkpoint (``<run>.ckpt``);
:func:`checkpoint_interval` rounds ``--checkpoint-every`` to whole evaluation windows.
"""

from __future__ import annotations

import abc
import dataclasses
import pathlib
import sys
from typing import Optional

from stiefax.experiments import protocol
from stiefax.experiments import store

__all__ = [
  "checkpoint_interval",
  "EXIT_HELD",
  "EXIT_TIME_LIMIT",
  "Job",
  "leave_held",
  "NO_WAIT_HELP",
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
