"""Float64 trajectories of every case of the common suite, frozen to a file.

``tests/data/golden_f64.npz`` holds, for each case of :mod:`tests.cases`, the
params and every state leaf after ``STEPS`` float64 updates from fixed params and
gradients. :mod:`tests.test_golden` checks the code against it to 1e-12, so a change
that is meant to move code without changing behaviour is checked to be exactly that.
A change that is meant to alter the numbers regenerates the file, and says why, with::

    python -m tests.golden
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from tests import cases as common

PATH = pathlib.Path(__file__).parent / "data" / "golden_f64.npz"
STEPS = 6


def trajectory(name: str) -> dict[str, np.ndarray]:
  """``{"params/<path>": ..., "state/<path>": ...}`` after ``STEPS`` float64 updates.

  Call under ``jax.enable_x64(True)``.
  """
  case = common.CASES[name]
  tx = case.make()
  params = jax.tree.map(
    lambda x: jnp.asarray(x, jnp.float64), common.make_params(case.params, jnp.float64)
  )
  state = tx.init(params)
  update = jax.jit(tx.update)
  for i in range(STEPS):
    grads = common.make_grads(params, jax.random.key(1000 + i), 0.3)
    updates, state = update(grads, state, params)
    params = common.apply_step(case, params, updates)
  out = {}
  for prefix, tree in (("params", params), ("state", state)):
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
      out[f"{prefix}{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
  return out


def all_trajectories() -> dict[str, np.ndarray]:
  with jax.enable_x64(True):
    return {f"{name}|{k}": v for name in common.NAMES for k, v in trajectory(name).items()}


if __name__ == "__main__":
  PATH.parent.mkdir(parents=True, exist_ok=True)
  np.savez_compressed(PATH, **all_trajectories())
  print(f"wrote {PATH}")
