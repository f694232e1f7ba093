"""A polite stop for long training loops: finish the step, save a checkpoint, exit.

While a :class:`StopRequest` is active, SIGINT (Ctrl-C) and SIGTERM (what ``timeout``
and batch schedulers send) set :attr:`StopRequest.requested`; the loop checks it at
its next evaluation, saves a checkpoint and raises ``KeyboardInterrupt``. A second
signal stops at once. Outside the main thread, where handlers cannot be set, the
signals keep their default behaviour.
"""

from __future__ import annotations

import signal
import sys
import threading

__all__ = ["StopRequest"]


class StopRequest:
  """Context manager: SIGINT/SIGTERM ask the loop to stop at its next evaluation.

  Args:
    who: the command's name, for the one-line message printed on the first signal.
  """

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self, who: str = "stiefax"):
    self.who = who
    self.requested = False
    self._previous: dict = {}

  def _handler(self, signum, frame):
    del frame
    if self.requested:
      raise KeyboardInterrupt
    self.requested = True
    name = signal.Signals(signum).name
    print(
      f"\n{self.who}: {name}: stopping at the next evaluation and saving a checkpoint"
      " (again to stop now)",
      file=sys.stderr,
      flush=True,
    )

  def __enter__(self) -> StopRequest:
    if threading.current_thread() is threading.main_thread():
      for s in self.SIGNALS:
        self._previous[s] = signal.signal(s, self._handler)
    return self

  def __exit__(self, *exc) -> None:
    for s, previous in self._previous.items():
      signal.signal(s, previous)
    self._previous = {}
