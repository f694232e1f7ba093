"""What the quick preset does over seeds and XLA CPU thread settings.

One run's epochs and accuracies are one sample: they move with the seed and with the
float32 rounding of the machine (CPU, XLA thread count). :data:`FIGURES` is the quick
preset over seeds 0-4 under two XLA CPU thread settings, measured by
``python -m benchmarks.grok_quick`` (``results/checks/grok-quick-summary.json``, whose
figures the README quotes; a test checks these lines against that file). ``stiefax
grok`` prints them after its own runs (:func:`seed_note`).
"""

from __future__ import annotations

from typing import Sequence

from stiefax.experiments.grok.config import QUICK
from stiefax.experiments.grok.config import recorded

__all__ = ["FIGURES", "SUMMARY", "seed_note"]

SUMMARY = "results/checks/grok-quick-summary.json"

#: The quick preset over seeds 0-4, "k and k": 1 XLA CPU thread and 2 (the default).
FIGURES: tuple[str, ...] = (
  (
    "A2: memorized 5/5 and 5/5 seeds, grokked 5/5 and 5/5 (first at epoch 450-800), "
    "sustained 1/5 and 1/5; held-out peak 0.96-1.00, end 0.52-0.99; 2-4 training "
    "collapses per run, 1/5 and 1/5 runs ending inside one"
  ),
  (
    "B2: memorized 5/5 and 5/5 seeds, grokked 2/5 and 0/5 (first at epoch 800), sustained"
    " 0/5 and 0/5; held-out peak 0.66-0.98, end 0.21-0.98; 2-4 training collapses per "
    "run, 1/5 and 4/5 runs ending inside one"
  ),
)


def _is_quick(record: dict) -> bool:
  c = record.get("config", {})
  return c.get("preset") == "quick" and all(c.get(k) == v for k, v in recorded(QUICK).items())


def seed_note(records: Sequence[dict]) -> str:
  """What the runs above are a sample of; for the quick preset, its figures over seeds."""
  text = (
    "These are one run per arm and seed on this machine: a run's epochs and accuracies"
    " move with the seed and with float32 rounding (CPU, XLA thread count)."
  )
  if not records or not FIGURES:
    return text
  if all(_is_quick(r) for r in records):
    return "\n".join(
      [
        text + f" The quick preset over seeds 0-4, at 1 and 2 XLA CPU threads (README; {SUMMARY}):",
        *(f"  {line}" for line in FIGURES),
      ]
    )
  if all(r.get("config", {}).get("preset") == "quick" for r in records):
    text += (
      f" The quick preset's figures over seeds 0-4 (README; {SUMMARY}) are for its"
      f" {QUICK.epochs} epochs, evaluated every {QUICK.eval_every}."
    )
  return text
