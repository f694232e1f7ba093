"""What identifies a grokking run (identity, file name, command) and its summaries.

A run's identity is the preset, every field of its :class:`GrokConfig` and how its arm
is recorded (:func:`~stiefax.experiments.grok.config.arm_definition`); its digest goes
into the file name. These are frozen: runs and checkpoints written by an earlier
version of this code are recognised (and resumed) as the same runs.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Sequence

from stiefax.experiments import store
from stiefax.experiments.grok import collapses
from stiefax.experiments.grok.config import ARMS
from stiefax.experiments.grok.config import GrokConfig
from stiefax.experiments.grok.config import arm_definition

__all__ = [
  "run_identity",
  "record_identity",
  "run_file_name",
  "run_command",
  "summary_table",
  "summary_words",
]


def run_identity(config: GrokConfig, arm: str, preset: str) -> dict:
  """What decides a run's result, except its seed: the preset, every field of
  ``config`` (budget, model, optimizer, thresholds) and the arm's definition."""
  return {
    "experiment": "grok",
    "preset": preset,
    "arm": arm,
    "arm_definition": arm_definition(ARMS[arm]),
    **dataclasses.asdict(config),
  }


def record_identity(record: dict) -> dict:
  """:func:`run_identity` of a written run (``KeyError`` if its config lacks a field)."""
  c = record["config"]
  fields = {f.name: c[f.name] for f in dataclasses.fields(GrokConfig)}
  return {
    "experiment": "grok",
    "preset": c.get("preset"),
    "arm": record["arm"],
    "arm_definition": c["arm"],
    **fields,
  }


def run_file_name(
  config: GrokConfig, arm: str, seed: int, preset: str, stabilize: bool = False
) -> str:
  """``<arm>[-stab]-<preset>-e<epochs>-<config hash>-s<seed>.json``.

  The hash (:func:`stiefax.experiments.store.digest` of :func:`run_identity`) makes the
  name a function of the whole configuration: runs that differ in any setting, the
  budget included, never share a file.
  """
  stem = f"{arm}{'-stab' if stabilize else ''}-{preset}-e{config.epochs}"
  return store.run_file_name(stem, run_identity(config, arm, preset), seed)


def run_command(config: GrokConfig, arm: str, seed: int, preset: str, stabilize: bool, out) -> str:
  """The ``stiefax grok`` command line that reruns (or resumes) exactly this run."""
  return " ".join(
    [
      "stiefax",
      "grok",
      "--preset",
      preset,
      "--epochs",
      str(config.epochs),
      "--eval-every",
      str(config.eval_every),
      "--arms",
      arm,
      "--seeds",
      str(seed),
    ]
    + (["--stabilize"] if stabilize else [])
    + ["--out", shlex.quote(str(out))]
  )


def _fmt_epoch(e) -> str:
  return "-" if e is None else str(e)


def summary_table(records: Sequence[dict]) -> str:
  """One line per run: the epochs of the first crossings, accuracies, isometry, time.

  ``mem epoch``, ``grok epoch``: first evaluation with train accuracy >= 0.99 and
  held-out accuracy >= 0.95; ``sust epoch``: first of ``sustain_k`` such evaluations in
  a row (``-``: not within the budget).
  """
  head = (
    f"{'arm':<8} {'seed':>4} {'mem epoch':>9} {'grok epoch':>10} {'sust epoch':>10}"
    f" {'end held-out':>12} {'tail held-out':>13} {'iso init':>9} {'iso final':>9}"
    f" {'iso max':>9} {'wall s':>7}"
  )
  lines = [head, "-" * len(head)]
  for r in records:
    m = r["metrics"]
    lines.append(
      f"{r['arm']:<8} {r['seed']:>4} {_fmt_epoch(m['memorized_epoch']):>9}"
      f" {_fmt_epoch(m['grokked_epoch']):>10} {_fmt_epoch(m['sustained_epoch']):>10}"
      f" {m['end_test_acc']:>12.4f} {m['tail_test_acc']:>13.4f}"
      f" {m['initial_isometry']:>9.2e} {m['final_isometry']:>9.2e}"
      f" {m['max_isometry']:>9.2e} {r['wall_time']:>7.1f}"
    )
  return "\n".join(lines)


def summary_words(records: Sequence[dict]) -> str:
  """The runs in plain words: what each run did (memorized, grokked, the peak and end
  held-out accuracy, the training collapses its evaluations caught, and whether it ends
  inside one), and the isometry of its frames. One run's epochs and accuracies are its
  own: they move with the seed and with float32 rounding (see :func:`seed_note`)."""
  lines = []
  for r in records:
    m, c, h = r["metrics"], r["config"], r["history"]
    epochs = h["epoch"][-1]
    text = f"{r['arm']} seed {r['seed']}: "
    text += (
      f"memorized (train accuracy >= {c['memorize_threshold']:g}) at epoch {m['memorized_epoch']}"
      if m["memorized_epoch"] is not None
      else f"did not memorize within {epochs} epochs"
    )
    if m["grokked_epoch"] is not None:
      text += (
        f"; grokked (held-out accuracy >= {c['grok_threshold']:g}) at epoch {m['grokked_epoch']}"
      )
      text += (
        f", {c['sustain_k']} evaluations in a row from epoch {m['sustained_epoch']}"
        if m["sustained_epoch"] is not None
        else f", never {c['sustain_k']} evaluations in a row"
      )
    else:
      text += f"; did not grok within {epochs} epochs"
    peak, peak_epoch = collapses.peak_test(h)
    text += (
      f"; held-out accuracy peak {peak:.3f} (epoch {peak_epoch}), {m['end_test_acc']:.3f}"
      f" at the end, {m['tail_test_acc']:.3f} over the last {c['tail_fraction']:.0%} of the run"
    )
    threshold = c["memorize_threshold"]
    found = collapses.find_collapses(h, threshold)
    if found:
      text += (
        f"; {len(found)} training collapse{'s' * (len(found) > 1)} caught by the evaluations"
        f" (train accuracy below {threshold:g} after memorizing, from epoch"
        f"{'s' * (len(found) > 1)} {', '.join(str(x['start']) for x in found)})"
      )
    last = collapses.ends_in_collapse(h, threshold)
    if last is not None:
      since = (
        f"below {threshold:g} since epoch {last['start']}"
        if last["start"] < epochs
        else "the last evaluation"
      )
      text += (
        f"; the run ends inside a collapse (train accuracy {m['end_train_acc']:.3f} at"
        f" epoch {epochs}, {since}), so its end accuracy is not its level: see the peak,"
        " or train longer"
      )
    iso = m["max_isometry_after_init"]
    text += (
      f"; W_Q, W_K {'stayed on' if iso < 1e-4 else 'left'} the Stiefel manifold"
      f" (isometry error up to {iso:.1e})."
    )
    lines.append(text)
  return "\n".join(lines)
