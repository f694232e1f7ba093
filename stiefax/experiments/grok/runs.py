"""What identifies a grokking run (identity, file name, command) and its summaries.

A run's identity is the preset, every field of its :class:`GrokConfig` and how its arm
is recorded (:func:`arm_definition`); its digest goes
into the file name. These are frozen: runs and checkpoints written by an earlier
version of this code are recognised (and resumed) as the same runs.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Optional
from typing import Sequence

from stiefax.experiments import protocol
from stiefax.experiments import store
from stiefax.experiments.arms import Arm
from stiefax.experiments.grok import collapses
from stiefax.experiments.grok.config import ARMS
from stiefax.experiments.grok.config import PRESETS
from stiefax.experiments.grok.config import RECORDED_NAMES
from stiefax.experiments.grok.config import GrokConfig
from stiefax.experiments.grok.config import recorded

__all__ = [
  "arm_definition",
  "recorded_rule",
  "run_identity",
  "record_identity",
  "run_file_name",
  "run_command",
  "summary_table",
  "summary_words",
  "check_run",
  "run_key",
]


def run_identity(config: GrokConfig, arm: str, preset: str) -> dict:
  """What decides a run's result, except its seed: the preset, every field of
  ``config`` (budget, model, optimizer, thresholds) and the arm's definition."""
  return {
    "experiment": "grok",
    "preset": preset,
    "arm": arm,
    "arm_definition": arm_definition(ARMS[arm]),
    **recorded(config),
  }


def record_identity(record: dict) -> dict:
  """:func:`run_identity` of a written run (``KeyError`` if its config lacks a field)."""
  c = record["config"]
  names = (RECORDED_NAMES.get(f.name, f.name) for f in dataclasses.fields(GrokConfig))
  fields = {name: c[name] for name in names}
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


def run_command(
  config: GrokConfig, arm: str, seed: int, preset: str, stabilize: bool, out: object
) -> str:
  """The ``stiefax grok`` command line that reruns (or resumes) exactly this run."""
  preset_config = PRESETS[preset]["config"] if preset in PRESETS else None
  own_frame_lr = preset_config is None or config.frame_lr != preset_config.frame_lr
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
    + (["--frame-lr", repr(config.frame_lr)] if own_frame_lr else [])
    + (["--stabilize"] if stabilize else [])
    + ["--out", shlex.quote(str(out))]
  )


def _fmt_epoch(e: Optional[int]) -> str:
  return "-" if e is None else str(e)


def summary_table(records: Sequence[dict]) -> str:
  """One line per run: the epochs of the first crossings, accuracies, isometry, time.

  ``mem_epoch``, ``grok_epoch``: first evaluation with train accuracy >= 0.99 and
  held-out accuracy >= 0.95; ``sust_epoch``: first of ``sustain_k`` such evaluations in
  a row (``-``: not within the budget). Every header is one token and the columns are
  two spaces apart, so a line splits on whitespace into its columns.
  """
  head = (
    f"{'arm':<9}  {'seed':>4}  {'mem_epoch':>9}  {'grok_epoch':>10}  {'sust_epoch':>10}"
    f"  {'end_heldout':>11}  {'tail_heldout':>12}  {'iso_init':>8}  {'iso_final':>9}"
    f"  {'iso_max':>8}  {'wall_s':>6}"
  )
  lines = [head, "-" * len(head)]
  for r in records:
    m = r["metrics"]
    lines.append(
      f"{r['arm']:<9}  {r['seed']:>4}  {_fmt_epoch(m['memorized_epoch']):>9}"
      f"  {_fmt_epoch(m['grokked_epoch']):>10}  {_fmt_epoch(m['sustained_epoch']):>10}"
      f"  {m['end_test_acc']:>11.4f}  {m['tail_test_acc']:>12.4f}"
      f"  {m['initial_isometry']:>8.2e}  {m['final_isometry']:>9.2e}"
      f"  {m['max_isometry']:>8.2e}  {r['wall_time']:>6.1f}"
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


_METRICS = (
  "memorized_epoch",
  "grokked_epoch",
  "sustained_epoch",
  "end_train_acc",
  "end_test_acc",
  "tail_test_acc",
  "final_isometry",
)


_HISTORY = ("epoch", "train_acc", "test_acc", "isometry")


def check_run(run: dict) -> Optional[str]:
  """What a grokking run lacks for the report (``None`` if nothing); see ``stiefax report``.

  By type: the epochs of :data:`_METRICS` integers or None, the other metrics numbers,
  the histories non-empty lists of numbers of one length, and every config field.
  """
  for key in _METRICS:
    if key not in run["metrics"]:
      return f"lacks the metric {key!r}"
    epoch = key.endswith("_epoch")
    problem = protocol.number_problem(run["metrics"], key, "its metrics", integer=epoch, none=epoch)
    if problem:
      return problem
  problem = protocol.history_problem(run, _HISTORY)
  if problem:
    return problem
  try:
    record_identity(run)
  except KeyError as e:
    return f"lacks the config field {e}"
  return None


def run_key(run: dict) -> tuple:
  """Two files hold the same run when they share :func:`record_identity` and seed."""
  return (store.digest(record_identity(run)), run["seed"])


#: How a run records a frame rule (``Arm.frames``), part of its identity, so fixed: a
#: Riemannian Adam adds its moment, projector and retraction (:func:`recorded_rule`).
_RULES = {
  "adamw": "adamw",
  "adam": "adam",
  "riemannian_adam": "riemannian",
  "riemannian_sgd": "riemannian-sgd",
  "manifold_muon": "mmuon",
  "muon": "muon",
  "zero": "frozen",
}


def recorded_rule(arm: Arm) -> str:
  """The ``"rule"`` runs record for ``arm``: its frame rule's name, for a Riemannian
  Adam ``"elementwise"`` with an elementwise second moment, then the projector and the
  retraction the arm sets (``riemannian-qr``, ``elementwise-canonical``)."""
  rule = _RULES[arm.frames]
  if arm.frames != "riemannian_adam":
    return rule
  o = arm.options
  base = "elementwise" if o.get("moment") == "elementwise" else rule
  return "-".join([base, *(str(o[k]) for k in ("projector", "retraction") if k in o)])


def arm_definition(arm: Arm) -> dict:
  """How runs record ``arm``: ``{"description", "rule", "orthonormal", "weight_decay",
  "circuit_init_scale"}`` (the ``"arm"`` of a run's ``"config"``), and ``"attention"``
  for an arm whose attention is not plain (:mod:`stiefax.experiments.attention`). All
  of it comes from the arm's registry entry: its grok description
  (:meth:`~stiefax.experiments.arms.Arm.description_in`) and :func:`recorded_rule`."""
  definition = {
    "description": arm.description_in("grok"),
    "rule": recorded_rule(arm),
    "orthonormal": arm.orthonormal,
    "weight_decay": arm.weight_decay,
    "circuit_init_scale": arm.circuit_init_scale,
  }
  if arm.attention != "plain":  # absent for the plain arms: their identities predate it
    definition["attention"] = arm.attention
  return definition
