"""Parsers of the commands' flag values, each error one ``CommandError`` line.

:func:`parse_arms` and :func:`parse_seeds` read ``--arms`` and ``--seeds`` of the
commands that train arms over seeds (``stiefax grok``, ``stiefax lm``);
:func:`floats`, :func:`ints` and :func:`knob` read lists of numbers and rates
(``stiefax patches``).
"""

from __future__ import annotations

import math
from typing import Mapping
from typing import Optional
from typing import Sequence

from stiefax.experiments import arms as arms_lib
from stiefax.experiments.arms import Arm
from stiefax.experiments.cli import CommandError
from stiefax.experiments.cli import check_seeds

__all__ = ["parse_arms", "parse_seeds", "floats", "ints", "knob"]


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


def floats(text: str, flag: str) -> list[float]:
  """Comma-separated numbers (``CommandError`` naming ``flag`` otherwise)."""
  try:
    return [float(t) for t in text.split(",") if t.strip()]
  except ValueError:
    raise CommandError(f"{flag}: expected comma-separated numbers, got {text!r}") from None


def ints(text: str, flag: str) -> list[int]:
  """Comma-separated distinct integers or ranges such as ``0-11``."""
  out: list[int] = []
  try:
    for t in text.split(","):
      t = t.strip()
      if not t:
        continue
      if "-" in t[1:]:
        lo, hi = t.split("-", 1)
        out.extend(range(int(lo), int(hi) + 1))
      else:
        out.append(int(float(t)) if "e" in t.lower() else int(t))
  except ValueError:
    raise CommandError(
      f"{flag}: expected comma-separated integers or ranges like 0-11, got {text!r}"
    ) from None
  if not out:
    raise CommandError(f"{flag}: empty list")
  if len(set(out)) != len(out):
    raise CommandError(f"{flag}: repeated values in {text!r}")
  return out


def knob(text: str, flag: str) -> float:
  """A rate: a finite number >= 0."""
  try:
    v = float(text)
  except ValueError:
    raise CommandError(f"{flag}: {text!r} is not a number") from None
  if not math.isfinite(v) or v < 0:
    raise CommandError(f"{flag}: rates must be finite and >= 0, got {text!r}")
  return v
