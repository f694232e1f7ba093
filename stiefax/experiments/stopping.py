"""A polite stop for long training loops: finish the chunk, save a checkpoint, exit.

While a :class:`StopRequest` is active, SIGINT (Ctrl-C) and SIGTERM (what ``kill``,
``timeout`` and batch schedulers send) set :attr:`StopRequest.requested`; the loop
checks it at its next evaluation, saves a checkpoint and raises :class:`Stopped`. A
request that comes when the loop has no evaluation left (during the last chunk) lets
the run finish, and is kept: the next :class:`StopRequest` entered in the process (the
command's next run) raises :class:`Stopped` at once, after the finished run is written. A
second signal ends the process at once and quietly (exit status 128 + the signal):
the run locks are released and the last checkpoint saved is kept (a save cut short
leaves only Orbax's temporary folder, removed when the run resumes). Outside the main
thread, where handlers cannot be set, both signals keep their default behaviour.

A command given a time limit (``stiefax grok --time-limit``) stops the same way when the
next evaluation window would end past it: the loop saves a checkpoint and raises
:class:`OutOfTime`, and the command ends with the unfinished runs listed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Optional

from stiefax.experiments import store

__all__ = ["Stopped", "OutOfTime", "StopRequest"]


class Stopped(KeyboardInterrupt):
  """Training stopped by a signal (``signum``: SIGINT or SIGTERM), checkpointed if it could."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


class OutOfTime(Exception):
  """Training stopped at a time limit: checkpointed at ``epoch`` (the next window would
  have ended past the limit), or ``epoch`` None when no run was in training."""

  def __init__(self, epoch: Optional[int]):
    super().__init__(epoch)
    self.epoch = epoch


class StopRequest:
  """Context manager: SIGINT/SIGTERM ask the loop to stop at its next evaluation.

  Args:
    who: the command (``"stiefax grok"``), for the one-line messages.
  """

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  #: The signal of a request that came too late to stop its run (0: none): the next
  #: request of the process stops before its loop starts.
  pending = 0

  def __init__(self, who: str = "stiefax"):
    self.who = who
    self.requested = False
    self.signum = 0
    self._previous: dict = {}

  def _handler(self, signum: int, frame: Optional[FrameType]) -> None:
    del frame
    if self.requested:  # stop now: quietly, without unwinding through JAX or Orbax
      store.release_all()
      print(f"\n{self.who}: stopped at once; the last checkpoint saved is kept", file=sys.stderr)
      sys.stderr.flush()
      sys.stdout.flush()
      os._exit(128 + signum)
    self.requested = True
    self.signum = signum
    print(
      f"\n{self.who}: stopping at the next evaluation and saving a checkpoint"
      " (Ctrl-C again to stop now)",
      file=sys.stderr,
      flush=True,
    )

  def __enter__(self) -> StopRequest:
    if StopRequest.pending:
      signum, StopRequest.pending = StopRequest.pending, 0
      print(
        f"{self.who}: stopped before the next run; every finished run is written",
        file=sys.stderr,
        flush=True,
      )
      raise Stopped(signum)
    if threading.current_thread() is threading.main_thread():
      for s in self.SIGNALS:
        self._previous[s] = signal.signal(s, self._handler)
    return self

  def __exit__(self, exc_type: Optional[type], *exc: object) -> None:
    if self.requested and exc_type is None:  # the run finished before it could stop
      StopRequest.pending = self.signum
    for s, previous in self._previous.items():
      signal.signal(s, previous)
    self._previous = {}
