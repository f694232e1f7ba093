"""The training commands' progress bars."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

__all__ = ["progress_bar"]


def progress_bar(
  total: int,
  *,
  desc: str = "",
  unit: str = "it",
  enabled: bool = True,
  initial: int = 0,
  leave: bool = False,
) -> tqdm:
  """The commands' progress bar (``tqdm``, on stderr): advance it with ``update(n)``.

  ``enabled=False`` gives a bar that prints nothing (``--no-progress``).
  """
  return tqdm(
    total=total,
    initial=initial,
    desc=desc,
    unit=unit,
    disable=not enabled,
    leave=leave,
    file=sys.stderr,
  )
