"""What the training commands share: the arms and seeds asked for, and their jobs.

:func:`parse_arms` and :func:`parse_seeds` read ``--arms`` and ``--seeds`` (one-line
``CommandError`` messages), :func:`checkpoint_interval` rounds ``--checkpoint-every``
to whole evaluation windows, and a :class:`Job` is one run of a command (an arm and a
seed) with the paths of its files: the result JSON, its lock (``<run>.lock``) and its
checkpoint (``<run>.ckpt``).
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Mapping
from typing import Optional
from typing import Sequence

from stiefax.experiments import arms as arms_lib
from stiefax.experiments import store
from stiefax.experiments.arms import Arm
from stiefax.experiments.cli import CommandError
from stiefax.experiments.cli import check_seeds

__all__ = ["parse_arms", "parse_seeds", "checkpoint_interval", "Job"]


def parse_arms(
  text: Optional[str], offered: Mapping[str, Arm], default: Sequence[str]
) -> list[str]:
  """The arms ``--arms text`` names (``default`` for None), by their registry names.

  Names are looked up in ``offered`` in any case or by alias
  (:func:`stiefax.experiments.arms.lookup`); a repeated arm counts once.
  """
  if text is None:
    return list(default)
  names = [a.strip() for a in text.split(",") if a.strip()]
  if not names:
    raise CommandError(f"--arms {text!r} names no arm; choose from {','.join(offered)}.")
  found = {a: arms_lib.lookup(a, offered) for a in names}
  unknown = [a for a, arm in found.items() if arm is None]
  if unknown:
    raise CommandError(
      f"unknown arm(s) {','.join(unknown)} in --arms; choose from {','.join(offered)}."
    )
  return list(dict.fromkeys(arm.name for arm in found.values() if arm is not None))


def parse_seeds(text: Optional[str], default: Sequence[int]) -> list[int]:
  """The seeds ``--seeds text`` names (``default`` for None); a repeated seed counts once."""
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


def checkpoint_interval(every: int, eval_every: int) -> int:
  """``every`` rounded up to a multiple of ``eval_every``; 0 (only on Ctrl-C) stays 0."""
  return -(-every // eval_every) * eval_every if every else 0


@dataclasses.dataclass
class Job:
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

  def same(self, record: dict) -> bool:
    """Whether ``record`` (a run read back from ``path``) is this job's run."""
    raise NotImplementedError

  def finished(self, repair: bool = False) -> Optional[dict]:
    """The run written at ``path`` if it is this job's run, else None.

    With ``repair`` (only while holding the job's lock), a file there that is damaged
    or holds another run is moved aside (never deleted), so that the run can be written.
    """
    record, problem = store.finished_run(self.path, self.same)
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
