"""The commands' user errors and the checks of their flags, each error one line.

A :class:`CommandError` raised by a command is printed by the ``stiefax`` command as
``stiefax <command>: error: ...`` (exit status 2, no traceback). Every command and
every module it uses raises it from here; :mod:`stiefax.experiments.cli`, the entry
point, only catches it.

:func:`check_seeds` and :func:`writable_dir` check seeds and output folders;
:func:`optimizer_problem` checks an optimizer setting against the range the stiefax
optimizers themselves enforce; :func:`parse_arms` and :func:`parse_seeds` read
``--arms`` and ``--seeds`` of the commands that train arms over seeds (``stiefax
grok``, ``stiefax lm``); :func:`floats`, :func:`ints` and :func:`knob` read lists of
numbers and rates (``stiefax patches``); :func:`arm_lines` writes the arms a command
offers into its ``--help`` from their registry descriptions; :func:`check_setting`
gives a flag the range of the optimizer argument it feeds.
"""

from __future__ import annotations

import math
import os
import pathlib
import tempfile
from typing import Callable
from typing import Mapping
from typing import Optional
from typing import Sequence

import stiefax
from stiefax.experiments import arms as arms_lib
from stiefax.experiments.arms import Arm

__all__ = [
  "CommandError",
  "SEED_LIMIT",
  "check_seeds",
  "writable_dir",
  "os_error",
  "optimizer_problem",
  "parse_arms",
  "parse_seeds",
  "floats",
  "ints",
  "knob",
  "arm_lines",
  "check_setting",
]


class CommandError(Exception):
  """A user error: printed as one line, exit status 2."""


#: Seeds are 32-bit: ``jax.random.key`` and NumPy take seeds in [0, SEED_LIMIT).
SEED_LIMIT = 2**32


def arm_lines(arms: Mapping[str, Arm], indent: str = "  ") -> str:
  """One ``--help`` line per arm: its name, padded, then ``Arm.description``."""
  width = max(len(name) for name in arms) + 2
  return "\n".join(f"{indent}{name:<{width}}{arm.description}" for name, arm in arms.items())


def check_seeds(seeds: Sequence[int], flag: str) -> list[int]:
  """``seeds`` as a list, or a ``CommandError`` naming ``flag`` if one is outside [0, 2**32)."""
  bad = [s for s in seeds if not 0 <= s < SEED_LIMIT]
  if bad:
    raise CommandError(f"{flag} {bad[0]}: seeds must be non-negative integers below 2**32.")
  return list(seeds)


def writable_dir(path: str | os.PathLike[str], what: str) -> pathlib.Path:
  """Creates ``path`` if needed and checks that a file can be written there.

  Raises:
    CommandError: ``"<what> <path>: cannot write there (<reason>)."``; also for an
      empty path (which would mean the current folder) and for a file.
  """
  if not str(path).strip():
    raise CommandError(f"{what} is empty; name a folder (e.g. {what} runs).")
  out = pathlib.Path(path)
  if out.exists() and not out.is_dir():
    raise CommandError(f"{what} {path}: is a file, not a folder.")
  try:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
      pass
  except OSError as e:
    raise CommandError(f"{what} {path}: cannot write there ({e.strerror or e}).") from None
  return out


def os_error(e: OSError) -> str:
  """An ``OSError`` as one line: ``"<file>: <reason>"``."""
  where = f"{e.filename}: " if e.filename else ""
  return f"{where}{e.strerror or ' '.join(str(e).split())}"


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
  """A rate: a finite number >= 0 that the optimizers take (:func:`optimizer_problem`)."""
  try:
    v = float(text)
  except ValueError:
    raise CommandError(f"{flag}: {text!r} is not a number") from None
  if not math.isfinite(v) or v < 0:
    raise CommandError(f"{flag}: rates must be finite and >= 0, got {text!r}")
  check_setting(flag, "learning_rate", v)
  return v


def check_setting(flag: str, arg: str, value: float) -> float:
  """``value`` of ``flag``, or a ``CommandError`` naming ``flag`` when the optimizer it
  feeds refuses it as its argument ``arg`` (:func:`optimizer_problem`): one line such
  as ``--max-norm 0.0: must be finite, > 0 and <= 1e15, or None, got 0.0.``"""
  problem = optimizer_problem(arg, value)
  if problem is not None:
    raise CommandError(f"{flag} {value!r}: {problem}.")
  return value


# Which public optimizer takes each setting: building it with the value runs the
# optimizer's own range check, so a flag has exactly the range of its optimizer.
_TAKES: dict[str, Callable[[float], object]] = {
  "learning_rate": lambda v: stiefax.riemannian_adam(v),
  "b1": lambda v: stiefax.riemannian_adam(1.0, b1=v),
  "b2": lambda v: stiefax.riemannian_adam(1.0, b2=v),
  "eps": lambda v: stiefax.riemannian_adam(1.0, eps=v),
  "max_norm": lambda v: stiefax.riemannian_adam(1.0, max_norm=v),
  "weight_decay": lambda v: stiefax.stiefel_adamw(1e-3, weight_decay=v),
}


def optimizer_problem(arg: str, value: float) -> Optional[str]:
  """``"must be <range>, got <value>"`` if the stiefax optimizers refuse ``value`` for
  their argument ``arg`` (``learning_rate``, ``b1``, ``b2``, ``eps``, ``max_norm`` or
  ``weight_decay``); ``None`` if they take it.

  The optimizer is built with the value (nothing is traced or compiled) and its
  one-line ``ValueError``, e.g. ``"stiefax.riemannian_adam: b1 must be in [0, 1), got
  1.5."``, gives the words: the ranges are written once, in the optimizers.

  >>> optimizer_problem("b1", 1.5)
  'must be in [0, 1), got 1.5'
  >>> optimizer_problem("b1", 0.9) is None
  True
  """
  try:
    _TAKES[arg](value)
  except ValueError as e:
    _, found, problem = str(e).partition(f": {arg} ")
    if not found:
      raise
    return problem.removesuffix(".")
  return None
