"""A run's training state on disk (Orbax), for resuming an interrupted run (grok, lm)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import shutil
import sys
from typing import Any
from typing import Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from stiefax.experiments import store
from stiefax.experiments.flags import CommandError

__all__ = ["Checkpoints", "DamagedCheckpoint", "set_aside"]


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


class Checkpoints:
  """A run's training state on disk (Orbax), for resuming an interrupted run.

  One checkpoint (the latest) is kept in ``directory``: the parameters and optimizer
  state (``state``, an Orbax ``StandardSave`` of the arrays), and as JSON (``meta``) the
  epoch reached, the evaluation history so far, the wall time spent, the seed and the
  SHA-256 of the arrays (``digest``). The training loop draws no random numbers after
  initialization (full batch, no dropout), so the seed is all the random state there
  is. Orbax writes each checkpoint to a temporary folder and renames it when complete:
  a process killed while saving leaves the previous checkpoint.

  The path is never resolved: a ``directory`` that is a symbolic link or a file, or a
  checkpoint that cannot be read back whole (truncated, altered: its digest differs),
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
      self._open().save(
        epoch,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          meta=ocp.args.JsonSave({**meta, "digest": tree_digest(state)}),
        ),
        force=True,
      )
    except DamagedCheckpoint as e:
      raise CommandError(f"cannot save a checkpoint in {e}.") from None
    except Exception as e:  # an OSError, or Orbax's wrapping of one
      self.close()
      self._remove_partial()
      cause: BaseException = e
      while cause.__cause__ is not None and not isinstance(cause, OSError):
        cause = cause.__cause__
      reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else _short(e)
      raise CommandError(f"cannot save a checkpoint in {self.directory} ({reason}).") from None

  def _remove_partial(self) -> None:
    """Removes Orbax's temporary folders of a save that failed (nothing else)."""
    if store.not_a_folder(self.directory) is not None or not self.directory.is_dir():
      return
    for entry in self.directory.iterdir():
      if "orbax-checkpoint-tmp" in entry.name and not entry.is_symlink():
        with contextlib.suppress(OSError):
          shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

  def restore(self, epoch: int, params: Any, opt_state: Any) -> tuple[Any, Any, dict]:
    """``(params, opt_state, meta)`` saved at ``epoch``; ``params``, ``opt_state``
    give the tree structure, shapes and dtypes. ``DamagedCheckpoint`` if it cannot be
    read back whole or its arrays differ from the digest saved with them."""
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
