"""Training collapses of a grokking run, read off its evaluation history.

Full-batch Adam on these tasks memorizes and then, again and again, has its training
loss spike: the training accuracy falls, sometimes to chance, and recovers within a
few hundred steps (the "slingshot mechanism", Thilak et al. 2022, arXiv 2206.04817,
which ties the spikes to the growth of the last layer's weights under adaptive
optimizers). The history records the training accuracy only at evaluations, so a
collapse is what an evaluation catches (:data:`RULE`): a lower bound on the spikes.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["RULE", "find_collapses", "ends_in_collapse", "peak_test"]

RULE = (
  "a collapse: after the run first memorized (training accuracy >= the memorize"
  " threshold, 0.99, at an evaluation), a maximal stretch of consecutive evaluations"
  " with training accuracy below that threshold; it starts at the first such"
  " evaluation and ends at the next one back at or above it (end null: the run ended"
  " inside it). Evaluations sample the run, so spikes between two evaluations are"
  " missed: the counts are lower bounds."
)


def find_collapses(history: dict, threshold: float = 0.99) -> list[dict]:
  """The collapses (:data:`RULE`) in ``history`` (``epoch``, ``train_acc``, ``test_acc``,
  ``train_loss``), in order: ``{"start", "end", "min_train_acc", "max_train_loss",
  "min_test_acc"}``, ``end`` ``None`` if the run ended inside it.

  >>> h = {"epoch": [0, 50, 100, 150, 200, 250], "train_acc": [0.0, 1.0, 0.3, 0.5, 1.0, 0.9],
  ...      "test_acc": [0.0] * 6, "train_loss": [3.0] * 6}
  >>> [(c["start"], c["end"], c["min_train_acc"]) for c in find_collapses(h)]
  [(100, 200, 0.3), (250, None, 0.9)]
  """
  found: list[dict] = []
  memorized, current = False, None
  loss = history.get("train_loss") or [float("nan")] * len(history["epoch"])
  for e, tr, te, lo in zip(history["epoch"], history["train_acc"], history["test_acc"], loss):
    if tr >= threshold:
      memorized = True
      if current is not None:
        current["end"] = int(e)
        found.append(current)
        current = None
    elif memorized:
      if current is None:
        current = {
          "start": int(e),
          "end": None,
          "min_train_acc": tr,
          "max_train_loss": lo,
          "min_test_acc": te,
        }
      else:
        current["min_train_acc"] = min(current["min_train_acc"], tr)
        current["max_train_loss"] = max(current["max_train_loss"], lo)
        current["min_test_acc"] = min(current["min_test_acc"], te)
  if current is not None:
    found.append(current)
  for c in found:
    for k in ("min_train_acc", "max_train_loss", "min_test_acc"):
      c[k] = round(float(c[k]), 4)
  return found


def ends_in_collapse(history: dict, threshold: float = 0.99) -> Optional[dict]:
  """The collapse the run ends inside (:func:`find_collapses`), or ``None``."""
  found = find_collapses(history, threshold)
  return found[-1] if found and found[-1]["end"] is None else None


def peak_test(history: dict) -> tuple[float, int]:
  """The highest held-out accuracy of ``history`` and its (first) epoch."""
  te = history["test_acc"]
  i = max(range(len(te)), key=lambda j: (te[j], -j))
  return float(te[i]), int(history["epoch"][i])
