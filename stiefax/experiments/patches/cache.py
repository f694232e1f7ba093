"""The on-disk cache of ``stiefax patches``: its keys and its files.

Cache files are ``.npz`` archives keyed by :func:`cache_digest` of their inputs (the
source's identity, :func:`file_id` or :func:`folder_id`, and :data:`CACHE_VERSION`),
written atomically (:func:`save_npz`); a damaged one is rebuilt with a notice
(:func:`load_npz`). The image sources of :mod:`stiefax.experiments.patches.images`
and the whitened tokens of :mod:`stiefax.experiments.patches.data` are cached here.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys
from typing import Any
from typing import Optional
from typing import Sequence
import zipfile
import zlib

import numpy as np

from stiefax.experiments import store

__all__ = [
  "CACHE_VERSION",
  "short_error",
  "cache_digest",
  "save_npz",
  "load_npz",
  "file_id",
  "folder_id",
]

#: Version of the on-disk cache layout (part of every cache key).
CACHE_VERSION = 1


def short_error(e: BaseException, limit: int = 120) -> str:
  """An exception as one short line (some messages span lines)."""
  text = " ".join(f"{type(e).__name__}: {e}".split())
  return text if len(text) <= limit else text[: limit - 3] + "..."


def cache_digest(obj: object) -> str:
  """16 hex digits of the SHA-1 of ``obj`` as sorted JSON: the key of a cache file."""
  return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


# ``arrays`` are numpy arrays; typed Any because numpy's stub reads ``np.savez(**kw)`` as
# possibly passing its ``allow_pickle: bool``.
def save_npz(path: pathlib.Path, **arrays: Any) -> bool:
  """Writes a cache file atomically; False (and a one-line notice) if it cannot.

  The cache only saves time, so a full disk or an unwritable cache folder is a notice
  on stderr, not an error; a half-written cache file is never left or read back
  (:func:`stiefax.experiments.store.atomic_write`).
  """
  try:
    store.atomic_write(path, lambda f: np.savez(f, **arrays))
    return True
  except OSError as e:
    print(
      f"stiefax: cannot write the cache file {path} ({e.strerror or short_error(e)});"
      " continuing without it",
      file=sys.stderr,
      flush=True,
    )
    return False


def load_npz(path: pathlib.Path, keys: Sequence[str]) -> Optional[dict]:
  """The arrays of a cache file, or None if it is absent or damaged (it is rebuilt).

  A file that cannot be read whole (truncated, corrupted, not a ``.npz``) or lacks one
  of ``keys`` gets a one-line notice on stderr naming it.
  """
  if not path.is_file():
    return None
  try:
    with np.load(path, allow_pickle=False) as z:
      arrays = {k: z[k] for k in z.files}
    missing = [k for k in keys if k not in arrays]
    if missing:
      raise KeyError(f"no array {missing[0]!r}")
    return arrays
  except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
    print(
      f"stiefax: cache file {path} is damaged ({short_error(e)}); rebuilding it",
      file=sys.stderr,
      flush=True,
    )
    return None


def file_id(path: pathlib.Path) -> dict:
  """What identifies a source file in a cache key: its path, size and mtime."""
  st = path.stat()
  return {"path": str(path.resolve()), "size": st.st_size, "mtime": st.st_mtime_ns}


def folder_id(path: pathlib.Path) -> dict:
  """What identifies a source folder in a cache key: its path and the digest of its
  listing (each file's relative path, size and mtime)."""
  entries = []
  for root, _, files in os.walk(path):
    for f in files:
      st = os.stat(os.path.join(root, f))
      entries.append((os.path.relpath(os.path.join(root, f), path), st.st_size, st.st_mtime_ns))
  entries.sort()
  return {"path": str(path.resolve()), "listing": cache_digest(entries)}
