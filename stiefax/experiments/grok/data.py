"""The grokking task's data: every pair (a, b) of the modulus, split by the seed."""

from __future__ import annotations

import numpy as np

from stiefax.experiments.flags import CommandError
from stiefax.experiments.grok.config import GrokConfig

__all__ = ["make_data"]


def make_data(config: GrokConfig, seed: int) -> dict:
  """All ``p^2`` sequences ``(a, b, =)`` and labels, split by ``seed``."""
  p = config.modulus
  grid_a, grid_b = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
  a, b = grid_a.ravel(), grid_b.ravel()
  x = np.stack([a, b, np.full_like(a, p)], axis=1).astype(np.int32)
  y = ((a + b) % p).astype(np.int32)
  n_train = round(config.train_fraction * p * p)
  if not 0 < n_train < p * p:
    raise CommandError(
      f"train_fraction {config.train_fraction} leaves {n_train} of {p * p} pairs for"
      " training; it must leave at least one pair on each side."
    )
  perm = np.random.default_rng(seed).permutation(p * p)
  tr, te = perm[:n_train], perm[n_train:]
  return {"x_train": x[tr], "y_train": y[tr], "x_test": x[te], "y_test": y[te]}
