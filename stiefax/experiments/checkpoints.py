"""A run's training state on disk (Orbax), for resuming an interrupted run (grok, lm)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import pathlib
import shutil
import sys
import threading
from typing import Any
from typing import Callable
from typing import Iterator
from typing import Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from stiefax.experiments import store
from stiefax.experiments.flags import CommandError

__all__ = ["Checkpoints", "DamagedCheckpoint", "set_aside", "meta_problem"]


class DamagedCheckpoint(Exception):
  """A checkpoint that cannot be used: unreadable, altered, or not a real folder."""

  def __init__(self, directory: pathlib.Path, reason: str):
    super().__init__(f"{directory}: {reason}")
    self.directory = directory
    self.reason = reason


def _short(e: BaseException, limit: int = 120) -> str:
  text = " ".join(f"{type(e).__name__}: {e}".split())
  return text if len(text) <= limit else text[: limit - 3] + "..."


def tree_digest(tree: Any) -> str:
  """SHA-256 of the bytes, shapes and dtypes of the leaves of ``tree`` (in tree order)."""
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(jax.device_get(tree)):
    a = np.ascontiguousarray(leaf)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def _meta_digest(meta: dict) -> str:
  """SHA-256 of ``meta`` as canonical JSON (:func:`stiefax.experiments.store.canonical`)."""
  return hashlib.sha256(store.canonical(meta).encode()).hexdigest()


def meta_problem(
  meta: dict, *, seed: int, step: int, step_key: str, history: Any = ()
) -> Optional[str]:
  """Why a checkpoint's ``meta`` does not fit the run resuming from it (None if it does).

  It must hold the run's ``seed`` (an integer), ``meta[step_key] == step`` (the step
  folder it was read from), a finite ``wall_time >= 0``, and a ``"history"`` object
  that holds the entries named in ``history`` (those every version wrote) and whose
  entries are all lists of one length, one per evaluation.
  """
  got = meta.get("seed")
  if not isinstance(got, int) or isinstance(got, bool) or got != seed:
    return f"it holds seed {got!r}, not seed {seed}"
  got = meta.get(step_key)
  if not isinstance(got, int) or isinstance(got, bool) or got != step:
    return f"it holds {step_key} {got!r} in the folder of {step_key} {step}"
  wall = meta.get("wall_time")
  if not isinstance(wall, (int, float)) or isinstance(wall, bool) or not 0 <= wall < float("inf"):
    return f"its wall_time {wall!r} is not a finite number >= 0"
  hist = meta.get("history")
  if not isinstance(hist, dict):
    return "it lacks its history"
  missing = [k for k in history if k not in hist]
  if missing:
    return f"its history lacks {', '.join(missing)}"
  lengths = {k: len(v) if isinstance(v, list) else None for k, v in hist.items()}
  if None in lengths.values() or len(set(lengths.values())) > 1:
    return f"its history entries are not lists of one length ({_short_dict(lengths)})"
  return None


def _short_dict(d: dict) -> str:
  text = ", ".join(f"{k} {v}" for k, v in d.items())
  return text if len(text) <= 80 else text[:77] + "..."


#: The causes of a failed save named in the OS's words: a full disk, a quota, a file
#: size limit, a read-only or failing disk, a folder made unwritable.
_CAUSES = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES)


def _cause(e: BaseException) -> str:
  """Why a save failed, in the OS's words (``"No space left on device"``) where the
  cause is one, however deeply Orbax and TensorStore wrap it."""
  chain: list[BaseException] = []
  cause: Optional[BaseException] = e
  while cause is not None and cause not in chain:
    chain.append(cause)
    cause = cause.__cause__ or cause.__context__
  for c in chain:
    if isinstance(c, OSError) and c.strerror:
      return c.strerror
  text = " ".join(str(c) for c in chain)
  for code in _CAUSES:  # TensorStore's message holds the OS's words
    if os.strerror(code) in text:
      return os.strerror(code)
  if "RESOURCE_EXHAUSTED" in text:
    return os.strerror(errno.ENOSPC)
  return _short(e)


@contextlib.contextmanager
def _quiet_threads() -> Iterator[None]:
  """Keeps Orbax's worker threads from logging a failed save (absl errors, their
  tracebacks, an exception hook's report): the save's own exception says it once."""
  loggers = [logging.getLogger(name) for name in ("absl", "orbax", "asyncio")]
  levels = [lg.level for lg in loggers]
  hook = threading.excepthook
  for lg in loggers:
    lg.setLevel(logging.CRITICAL + 1)
  threading.excepthook = lambda args: None
  try:
    yield
  finally:
    for lg, level in zip(loggers, levels):
      lg.setLevel(level)
    threading.excepthook = hook


class Checkpoints:
  """A run's training state on disk (Orbax), for resuming an interrupted run.

  One checkpoint (the latest) is kept in ``directory``: the parameters and optimizer
  state (``state``, an Orbax ``StandardSave`` of the arrays), and as JSON (``meta``) the
  epoch reached, the evaluation history so far, the wall time spent, the seed, the
  SHA-256 of the arrays (``digest``) and the SHA-256 of the rest of the meta as
  canonical JSON (``meta_digest``). The training loop draws no random numbers after
  initialization (full batch, no dropout), so the seed is all the random state there
  is. Orbax writes each checkpoint to a temporary folder and renames it when complete:
  a process killed while saving leaves the previous checkpoint.

  The path is never resolved: a ``directory`` that is a symbolic link or a file, or a
  checkpoint that cannot be read back whole (truncated, altered: a digest differs), or
  whose meta does not fit the run (``restore(check=...)``, e.g. :func:`meta_problem`),
  raises :class:`DamagedCheckpoint`, and the command moves it aside
  (:meth:`move_aside`) and trains the run afresh. :meth:`remove` deletes only a real
  folder, never a link's target.
  """

  def __init__(self, directory: pathlib.Path):
    self.directory = pathlib.Path(os.path.abspath(directory))  # absolute, links kept
    self._manager = None

  def _open(self) -> ocp.CheckpointManager:
    problem = store.not_a_folder(self.directory)
    if problem is not None:
      raise DamagedCheckpoint(self.directory, problem)
    if self._manager is None:
      self._remove_partial()  # a save cut short (the run's lock is held: nobody saves)
      options = ocp.CheckpointManagerOptions(
        max_to_keep=1, create=True, enable_async_checkpointing=False
      )
      self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "meta")
      )
    return self._manager

  def latest_epoch(self) -> Optional[int]:
    """The epoch of the checkpoint kept (None: none); ``DamagedCheckpoint`` if unusable."""
    if not os.path.lexists(self.directory):
      return None
    try:
      return self._open().latest_step()
    except DamagedCheckpoint:
      raise
    except Exception as e:  # Orbax raises many types for a damaged folder
      self.close()
      raise DamagedCheckpoint(self.directory, _short(e)) from None

  def save(self, epoch: int, params: Any, opt_state: Any, meta: dict) -> None:
    """Saves a checkpoint; a failure (a full disk) is one ``CommandError`` line.

    A failed save leaves no temporary folder behind, and the previous checkpoint.
    """
    state = {"params": params, "opt_state": opt_state}
    try:
      with _quiet_threads():
        self._open().save(
          epoch,
          args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            meta=ocp.args.JsonSave(
              {**meta, "digest": tree_digest(state), "meta_digest": _meta_digest(meta)}
            ),
          ),
          force=True,
        )
    except DamagedCheckpoint as e:
      raise CommandError(f"cannot save a checkpoint in {e}.") from None
    except Exception as e:  # an OSError, or Orbax's wrapping of one
      with _quiet_threads():
        self.close()
      self._remove_partial()
      kept = self._kept()
      raise CommandError(
        f"cannot save a checkpoint in {self.directory} ({_cause(e)}); "
        + (f"the previous checkpoint (at {kept}) is kept." if kept is not None else "none is kept.")
      ) from None

  def _kept(self) -> Optional[int]:
    """The step (epoch) of the checkpoint folder left in ``directory``, if any."""
    if store.not_a_folder(self.directory) is not None or not self.directory.is_dir():
      return None
    steps = [int(e.name) for e in self.directory.iterdir() if e.name.isdigit() and e.is_dir()]
    return max(steps) if steps else None

  def _remove_partial(self) -> None:
    """Removes Orbax's temporary folders of a save that failed (nothing else)."""
    if store.not_a_folder(self.directory) is not None or not self.directory.is_dir():
      return
    for entry in self.directory.iterdir():
      if "orbax-checkpoint-tmp" in entry.name and not entry.is_symlink():
        with contextlib.suppress(OSError):
          shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

  def restore(
    self,
    epoch: int,
    params: Any,
    opt_state: Any,
    check: Optional[Callable[[dict], Optional[str]]] = None,
  ) -> tuple[Any, Any, dict]:
    """``(params, opt_state, meta)`` saved at ``epoch``; ``params``, ``opt_state``
    give the tree structure, shapes and dtypes. ``DamagedCheckpoint`` if it cannot be
    read back whole, its arrays or meta differ from the digests saved with them, or
    ``check(meta)`` gives a reason (the meta does not fit the run)."""
    target = {"params": params, "opt_state": opt_state}
    try:
      abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
      got = self._open().restore(
        epoch,
        args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
        ),
      )
      # Orbax returns optax's named tuples as plain tuples: rebuild the original tree.
      state = jax.tree.unflatten(jax.tree.structure(target), jax.tree.leaves(got["state"]))
      meta = dict(got["meta"])
    except DamagedCheckpoint:
      raise
    except Exception as e:  # Orbax raises many types for a damaged checkpoint
      self.close()
      raise DamagedCheckpoint(self.directory, _short(e)) from None
    saved = meta.pop("digest", None)  # checkpoints of earlier versions have none
    if saved is not None and saved != tree_digest(state):
      self.close()
      raise DamagedCheckpoint(self.directory, "its arrays differ from the digest saved with them")
    saved = meta.pop("meta_digest", None)  # nor this
    problem = None
    if saved is not None and saved != _meta_digest(meta):
      problem = "its meta differs from the digest saved with it"
    elif check is not None:
      problem = check(meta)
    if problem:
      self.close()
      raise DamagedCheckpoint(self.directory, problem)
    return state["params"], state["opt_state"], meta

  def close(self) -> None:
    if self._manager is not None:
      with contextlib.suppress(Exception):
        self._manager.close()
      self._manager = None

  def move_aside(self) -> pathlib.Path:
    """Renames the checkpoint folder (or the link there) to ``<name>.damaged-...``."""
    self.close()
    return store.move_aside(self.directory, "damaged")

  def remove(self) -> None:
    """Deletes the checkpoint folder; a symbolic link or a file there is an ``OSError``."""
    self.close()
    store.remove_folder(self.directory)


def set_aside(ckpt: Checkpoints, damage: DamagedCheckpoint, who: str) -> None:
  """Moves a damaged checkpoint (or a link at its path) aside, with one line saying so.

  ``who``: the command (``"stiefax grok"``) that prints the line.
  """
  aside = ckpt.move_aside()
  print(
    f"{who}: checkpoint {ckpt.directory} is unusable ({damage.reason}); moved it to"
    f" {aside.name} and training the run from the start",
    file=sys.stderr,
    flush=True,
  )
