"""A grokking run's training state on disk (Orbax), for resuming an interrupted run."""

from __future__ import annotations

import pathlib
from typing import Any
from typing import Optional

__all__ = ["Checkpoints"]


class Checkpoints:
  """A run's training state on disk (Orbax), for resuming an interrupted run.

  One checkpoint (the latest) is kept in ``directory``: the parameters and optimizer
  state (``state``, an Orbax ``StandardSave`` of the arrays), and as JSON (``meta``) the
  epoch reached, the evaluation history so far, the wall time spent and the seed. The
  training loop draws no random numbers after initialization (full batch, no dropout),
  so the seed is all the random state there is. Orbax writes each checkpoint to a
  temporary folder and renames it when complete: a process killed while saving leaves
  the previous checkpoint.
  """

  def __init__(self, directory: pathlib.Path):
    self.directory = pathlib.Path(directory).resolve()
    self._manager = None

  def _open(self):
    if self._manager is None:
      import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

      options = ocp.CheckpointManagerOptions(
        max_to_keep=1, create=True, enable_async_checkpointing=False
      )
      self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "meta")
      )
    return self._manager

  def latest_epoch(self) -> Optional[int]:
    if not self.directory.is_dir():
      return None
    return self._open().latest_step()

  def save(self, epoch: int, params, opt_state, meta: dict) -> None:
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    self._open().save(
      epoch,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
        meta=ocp.args.JsonSave(meta),
      ),
      force=True,
    )

  def restore(self, epoch: int, params, opt_state) -> tuple[Any, Any, dict]:
    """``(params, opt_state, meta)`` saved at ``epoch``; ``params``, ``opt_state``
    give the tree structure, shapes and dtypes."""
    import jax  # pylint: disable=g-import-not-at-top
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    target = {"params": params, "opt_state": opt_state}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    got = self._open().restore(
      epoch,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
      ),
    )
    # Orbax returns optax's named tuples as plain tuples: rebuild the original tree.
    state = jax.tree.unflatten(jax.tree.structure(target), jax.tree.leaves(got["state"]))
    return state["params"], state["opt_state"], dict(got["meta"])

  def close(self) -> None:
    if self._manager is not None:
      self._manager.close()
      self._manager = None

  def remove(self) -> None:
    import shutil  # pylint: disable=g-import-not-at-top

    self.close()
    shutil.rmtree(self.directory, ignore_errors=True)
