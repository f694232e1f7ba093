"""The text of ``stiefax lm``: the Python standard library's sources, as bytes.

The corpus is every top-level ``*.py`` file of the running interpreter's standard
library (``sysconfig.get_paths()["stdlib"]``), read as bytes: nothing is downloaded,
and the tokenizer is the identity on bytes (vocabulary 256), so the loss in nats per
token divided by ``ln 2`` is bits per byte. Files, not bytes, are split: a file goes to
the test split when the SHA-256 of its name is 0 modulo 20, to validation when it is 1,
else to training (fixed for a given interpreter, about 5% each held out). Inside a
split the files are concatenated in name order.

Training batches are windows of ``seq + 1`` bytes at positions drawn from the run's
seed (the same for every arm and rate of a seed). Validation and test are fixed:
consecutive non-overlapping windows from the start of their split.

A run records the corpus's digest (:attr:`Corpus.facts`), so runs on another
interpreter's library, whose text differs, never pair with these.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import pathlib
import sys
import sysconfig
from typing import Optional

import numpy as np

__all__ = ["Corpus", "load", "split_of", "windows", "train_positions"]

SPLITS = ("train", "val", "test")


def split_of(name: str) -> str:
  """``"test"``, ``"val"`` or ``"train"``: the split of the file called ``name``."""
  k = int(hashlib.sha256(name.encode()).hexdigest(), 16) % 20
  return "test" if k == 0 else "val" if k == 1 else "train"


@dataclasses.dataclass(frozen=True)
class Corpus:
  """The three splits as ``uint8`` arrays, and what identifies them."""

  train: np.ndarray
  val: np.ndarray
  test: np.ndarray
  files: dict  # split -> number of files

  @property
  def facts(self) -> dict:
    """What a run records: sizes, file counts, and the SHA-256 prefix of each split."""
    out: dict = {"source": "python-stdlib", "python": sys.version.split()[0]}
    for s in SPLITS:
      arr = getattr(self, s)
      out[f"{s}_bytes"] = int(arr.size)
      out[f"{s}_files"] = int(self.files[s])
      out[f"{s}_sha256"] = hashlib.sha256(arr.tobytes()).hexdigest()[:16]
    return out


@functools.lru_cache(maxsize=2)
def load(root: Optional[str] = None) -> Corpus:
  """The corpus of the standard library at ``root`` (default: the running one's)."""
  base = pathlib.Path(root or sysconfig.get_paths()["stdlib"])
  parts: dict = {s: [] for s in SPLITS}
  for path in sorted(base.glob("*.py")):
    parts[split_of(path.name)].append(path.read_bytes())
  if not parts["train"] or not parts["val"] or not parts["test"]:
    raise ValueError(f"{base}: too few .py files for a train/val/test split")
  arrays = {s: np.frombuffer(b"".join(parts[s]), np.uint8) for s in SPLITS}
  return Corpus(**arrays, files={s: len(parts[s]) for s in SPLITS})


def windows(data: np.ndarray, seq: int, count: int) -> np.ndarray:
  """``(count, seq + 1)`` consecutive non-overlapping windows from the start of ``data``."""
  need = count * (seq + 1)
  if need > data.size:
    raise ValueError(f"{count} windows of {seq + 1} bytes need {need} bytes; have {data.size}")
  return data[:need].reshape(count, seq + 1).astype(np.int32)


def train_positions(n: int, seq: int, steps: int, batch: int, seed: int) -> np.ndarray:
  """``(steps, batch)`` window starts in a split of ``n`` bytes, drawn from ``seed``."""
  rng = np.random.default_rng([seed, 7])
  return rng.integers(0, n - seq - 1, size=(steps, batch), dtype=np.int64)
