"""Pieces shared by the experiments' reports: tables, paired statistics, plots.

Plain text tables (:func:`table`), the order arms are listed in (:func:`arm_order`),
paired differences between two arms on the seeds they share (:func:`paired_by_seed`,
:func:`paired_cells`), and matplotlib loaded on demand with the ``Agg`` back end
(:func:`pyplot`, :func:`save_figure`): without matplotlib the reports print their
tables and write no plots.
"""

from __future__ import annotations

import math
import pathlib
from typing import TYPE_CHECKING
from typing import Any
from typing import Iterable
from typing import Mapping
from typing import Optional
from typing import Sequence

if TYPE_CHECKING:
  from stiefax.experiments import stats

__all__ = [
  "num",
  "table",
  "arm_order",
  "by_seed",
  "paired_by_seed",
  "paired_cells",
  "PAIRED_HEADER",
  "pyplot",
  "save_figure",
]


def num(x: Optional[float], fmt: str) -> str:
  """``x`` formatted with ``fmt``; ``"-"`` for None, nan or inf."""
  return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  """Left-aligned columns two spaces apart, a rule of dashes under the header."""
  widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

  def fmt(row: Sequence[str]) -> str:
    return "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()

  return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def arm_order(names: Iterable[str], offered: Iterable[str]) -> list[str]:
  """``names`` in the order of ``offered``, then unknown names alphabetically.

  A label ``"<arm> <knob>"`` (e.g. ``"B2 lr=0.3"``) sorts with its arm.
  """
  known = list(offered)

  def key(name: str) -> tuple:
    base = name.split(" ")[0]
    return (known.index(base) if base in known else len(known), name)

  return sorted(names, key=key)


def by_seed(runs: Sequence[dict], metric: str) -> dict:
  """``{seed: metrics[metric]}`` over ``runs``, leaving out runs without the metric."""
  return {r["seed"]: r["metrics"].get(metric) for r in runs if r["metrics"].get(metric) is not None}


def paired_by_seed(
  base: Mapping[Any, float], other: Mapping[Any, float], scale: float = 1.0, min_seeds: int = 1
) -> Optional[stats.Paired]:
  """:func:`stiefax.experiments.stats.paired` of ``other - base`` on their shared seeds.

  ``None`` when they share fewer than ``min_seeds`` seeds. Values are multiplied by
  ``scale`` first (100: fractions to percentage points).
  """
  from stiefax.experiments import stats  # pylint: disable=g-import-not-at-top

  common = sorted(set(base) & set(other))
  if len(common) < max(1, min_seeds):
    return None
  return stats.paired([scale * base[s] for s in common], [scale * other[s] for s in common])


#: The columns of :func:`paired_cells`, after the difference's own header.
PAIRED_HEADER = ("t", "p", "wins", "t 95% CI", "boot 95% CI", "verdict")


def paired_cells(p: Optional[stats.Paired]) -> list[str]:
  """``[mean, t, p, wins/n, t CI, bootstrap CI, verdict]`` of a paired difference.

  The verdict is the statistical standard's (:func:`stiefax.experiments.stats.verdict`):
  ``higher``/``lower`` (b than a), ``no difference`` or ``not settled``. Seven dashes
  for None.
  """
  if p is None:
    return ["-"] * 7
  return [
    f"{p.mean:+.2f}",
    num(p.t, ".2f"),
    num(p.p, ".2g"),
    f"{p.wins}/{p.n}",
    "-" if not math.isfinite(p.t_low) else f"[{p.t_low:+.2f}, {p.t_high:+.2f}]",
    f"[{p.ci_low:+.2f}, {p.ci_high:+.2f}]",
    {"b > a": "higher", "b < a": "lower"}.get(p.verdict, p.verdict),
  ]


def pyplot() -> Any:
  """``matplotlib.pyplot`` on the ``Agg`` back end, or None without matplotlib."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

    return plt
  except ImportError:
    return None


def save_figure(fig: Any, plt: Any, out_dir: pathlib.Path, name: str) -> Optional[str]:
  """Writes ``fig`` to ``out_dir / name`` (110 dpi) and closes it; None if it cannot.

  The PNG is written atomically (:func:`stiefax.experiments.store.atomic_write`): a
  symbolic link at ``out_dir / name`` is replaced, its target never written.
  """
  from stiefax.experiments import store  # pylint: disable=g-import-not-at-top

  try:
    path = pathlib.Path(out_dir) / name
    store.atomic_write(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    return str(path)
  except OSError:
    return None
  finally:
    plt.close(fig)
