"""Modular-arithmetic grokking, c = (a + b) mod 97 (paper sections 4.3 and 4.4).

The model and task are the paper's: the sequence (a, b, =) with a one-hot 98 x 128
token embedding plus learned positions, a 2-layer, 4-head, d=128, r=32 pre-LN encoder
(FFN 4x with ReLU, no causal mask, a final LayerNorm), readout
concat(3 x 128) -> 128 -> ReLU -> 97; {paper_fraction} pairs (3 764) train as one full
batch, the other 5 645 are held out. AdamW lr {paper_lr}, weight decay {paper_wd} on matrices,
b2 {paper_b2}, no warm-up; the frame rate frame_lr is {paper_rlr} (constant), tau {paper_tau}, eps {paper_eps}.

Arms (they differ only in how W_Q, W_K are treated, except where noted):
{arms}
Stiefel arms start from the polar factor of the default W_Q, W_K initialization;
every other parameter, and the train/held-out split, are shared by all arms of a seed.
The presets run {quick_arms}; every other arm is named with --arms. Every evaluation also
records the attention probe on the training batch: the largest logit |q.k| / sqrt(r)
(max_logit) and the mean attention entropy (attn_entropy).

Presets:
  quick (default)  {quick_arms} at seed {quick_seeds}: the paper's model family (2-layer, 4-head, d=128,
                   r=32 pre-LN encoder, same readout, same optimizers) on a smaller
                   task, c = (a + b) mod {quick_modulus} with {quick_fraction} pairs training, in the
                   Power et al. setting (b2 {quick_b2}, {quick_warmup}-step warm-up) with weight decay
                   {quick_wd}, for {quick_epochs} epochs (evaluation every {quick_eval}). Over seeds 0-4 at 1
                   and 2 XLA CPU threads, every run memorizes by epoch 50, A2 groks
                   (held-out >= 0.95) in 5/5 seeds, B2 in 2/5 and 0/5, every run has
                   training-loss collapses, and the isometry contrast shows (A2 far
                   above 1e-2, B2 at float32 rounding); one run's digits vary with the
                   seed and the machine (README; benchmarks/grok_quick.py).
  paper            {paper_arms} at seed {paper_seeds}, the exact configuration: {paper_epochs} epochs,
                   evaluation every {paper_eval} (about 2 hours per arm on an idle 2-core CPU).
--stabilize runs the Power et al. setting (b2 0.98 and a 10-step linear warm-up, for
the AdamW rate and frame_lr alike).

Each run writes OUT/<arm>[-stab]-<preset>-e<epochs>-<hash>-s<seed>.json, where the hash
covers the whole configuration (every hyperparameter, the budget, the arm), so no two
configurations share a file; the file records the command that reruns it and the code's
commit. A finished run is never trained again nor overwritten: the same command skips it
(--force trains it again; the earlier file is moved aside). An unfinished run keeps an
Orbax checkpoint (parameters, optimizer state, history) in <run>.ckpt every
--checkpoint-every epochs, every --checkpoint-seconds of training if given, and on
Ctrl-C or SIGTERM (a second one stops at once); the same command resumes it, to the same
result as an uninterrupted run, and a damaged checkpoint is moved aside and the run
restarted. --time-limit stops the command cleanly before a deadline (the runs in
training checkpointed, the runs left listed, exit status 75). Each run is claimed by a
lock (<run>.lock), so several processes can share one --out: each trains different runs
and waits for the others' runs (--no-wait: leaves them to the others, exit status 75).
--vmap-seeds trains the seeds of an arm as one program, the seed a batch axis. `stiefax
report OUT` prints the paper-style tables (memorized / grokked / sustained k/n, tail
means, paired differences against A2) and writes PNG plots.

Examples:
  stiefax grok
  stiefax grok --preset paper --arms A2,B2 --seeds 0      # Ctrl-C and rerun: resumes
  stiefax grok --preset paper --arms A2,B2,B2m,B2m-can,B2-frz --seeds 0
  stiefax grok --preset paper --arms A2,B2,B2-frz --seeds 0,1,2,3,4 --stabilize
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from typing import Any
from typing import Optional

from stiefax.experiments import flags
from stiefax.experiments import jobs
from stiefax.experiments import store
from stiefax.experiments.flags import CommandError
from stiefax.experiments.flags import writable_dir
from stiefax.experiments.grok.config import ARMS
from stiefax.experiments.grok.config import PRESETS
from stiefax.experiments.grok.config import STABILIZED
from stiefax.experiments.grok.config import GrokConfig
from stiefax.experiments.grok.quick_seeds import seed_note
from stiefax.experiments.grok.runs import record_identity
from stiefax.experiments.grok.runs import run_command
from stiefax.experiments.grok.runs import run_file_name
from stiefax.experiments.grok.runs import run_identity
from stiefax.experiments.grok.runs import summary_table
from stiefax.experiments.grok.runs import summary_words

__all__ = ["EXPECTED", "help_text", "add_arguments", "resolve_config", "checkpoint_interval", "run"]


#: The last lines of every ``stiefax grok``: what the task is expected to show, and
#: where the constraint wins (README, docs/reproduction.md).
EXPECTED = (
  "What to expect: AdamW (A2) grokking while B2 does not is the paper's expected null on"
  " this task (sections 4.3-4.4), not a broken run: grokking here does not come from the"
  " constraint.\n"
  "Where the constraint wins: image patches, where B2 beats AdamW by 5.4 to 8.4 pp on"
  " CIFAR-10 in every setting and seed measured (docs/reproduction.md); run"
  " `stiefax patches` (embedded digits data, minutes) or"
  " `stiefax patches --data cifar-10-python.tar.gz`."
)


def _number(x: float) -> str:
  """``x`` as the help writes it: ``1e-3`` below 0.01, else ``0.05``, ``1.0``."""
  return f"{x:.0e}".replace("e-0", "e-") if 0 < abs(x) < 0.01 else f"{x}"


def help_text() -> str:
  """The ``--help`` text: this module's docstring with the arms' registry descriptions
  and the presets' own numbers filled in."""
  quick, paper = PRESETS["quick"], PRESETS["paper"]
  q, p = quick["config"], paper["config"]
  return (__doc__ or "").format(
    arms=flags.arm_lines(ARMS),
    quick_arms=",".join(quick["arms"]),
    quick_seeds=",".join(map(str, quick["seeds"])),
    quick_modulus=q.modulus,
    quick_fraction=f"{q.train_fraction:.0%} of the {q.modulus**2}",
    quick_b2=q.b2,
    quick_warmup=q.warmup,
    quick_wd=q.weight_decay,
    quick_epochs=q.epochs,
    quick_eval=q.eval_every,
    paper_arms=",".join(paper["arms"]),
    paper_fraction=f"{p.train_fraction:.0%} of the {p.modulus}^2",
    paper_lr=_number(p.learning_rate),
    paper_wd=p.weight_decay,
    paper_b2=p.b2,
    paper_rlr=p.frame_lr,
    paper_tau=p.tau,
    paper_eps=_number(p.riemannian_eps),
    paper_seeds=",".join(map(str, paper["seeds"])),
    paper_epochs=f"{p.epochs:,}".replace(",", " "),
    paper_eval=p.eval_every,
  )


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.description = help_text()
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  parser.add_argument(
    "--preset",
    choices=sorted(PRESETS),
    default="quick",
    help="configuration preset (default: quick)",
  )

  def per_preset(read: Any) -> str:
    return ", ".join(f"{name}: {read(preset)}" for name, preset in PRESETS.items())

  parser.add_argument(
    "--arms",
    default=None,
    help=f"comma-separated arms from {','.join(ARMS)} (default:"
    f" {per_preset(lambda p: ','.join(p['arms']))})",
  )
  parser.add_argument(
    "--seeds",
    default=None,
    help="comma-separated non-negative integer seeds (default:"
    f" {per_preset(lambda p: ','.join(map(str, p['seeds'])))})",
  )
  parser.add_argument(
    "--epochs",
    type=int,
    default=None,
    help=f"full-batch epochs ({per_preset(lambda p: p['config'].epochs)})",
  )
  parser.add_argument(
    "--eval-every",
    type=int,
    default=None,
    help=f"epochs between evaluations ({per_preset(lambda p: p['config'].eval_every)})",
  )
  parser.add_argument(
    "--frame-lr",
    type=float,
    default=None,
    help="frame_lr, the frames' rate at the AdamW peak for the arms with the Riemannian"
    " Adam (B2 and its variants; the other frame rules keep their arm's rate)"
    f" ({per_preset(lambda p: p['config'].frame_lr)})",
  )
  parser.add_argument(
    "--out", default="runs/grok", help="directory for one JSON file per run (default: runs/grok)"
  )
  parser.add_argument(
    "--stabilize",
    action="store_true",
    help="Power et al. setting: b2 0.98 and a 10-step linear warm-up",
  )
  parser.add_argument(
    "--vmap-seeds",
    action="store_true",
    help="train the seeds of an arm as one program, the seed a batch axis"
    " (jax.vmap; pays on an accelerator)",
  )
  parser.add_argument(
    "--checkpoint-every",
    type=int,
    default=None,
    help="epochs between checkpoints of an unfinished run, rounded up to"
    " a multiple of --eval-every; 0: only on Ctrl-C (default: 1000)",
  )
  parser.add_argument(
    "--checkpoint-seconds",
    type=float,
    default=None,
    help="also checkpoint an unfinished run at the first evaluation this many seconds"
    " after its last checkpoint, so that a killed run loses at most about that much"
    " (default: off)",
  )
  parser.add_argument(
    "--time-limit",
    type=float,
    default=None,
    metavar="SECONDS",
    help="stop cleanly before this many seconds from the start: checkpoint the runs"
    " in training when the next evaluation window would end past it, start no other,"
    f" list what is left and end with status {jobs.EXIT_TIME_LIMIT}; the same command"
    " resumes (default: none)",
  )
  jobs.add_arguments(parser)


def resolve_config(args: argparse.Namespace) -> tuple[GrokConfig, list[str], list[int]]:
  """The configuration, arms and seeds that ``args`` ask for (``CommandError`` if bad)."""
  preset = PRESETS[args.preset]
  config: GrokConfig = preset["config"]
  changes: dict[str, Any] = {}
  if args.epochs is not None:
    changes["epochs"] = args.epochs
  if args.eval_every is not None:
    changes["eval_every"] = args.eval_every
  if args.frame_lr is not None:
    problem = flags.optimizer_problem("learning_rate", args.frame_lr)
    if problem is not None:
      raise CommandError(f"--frame-lr {args.frame_lr:g} {problem}.")
    changes["frame_lr"] = args.frame_lr
  if args.stabilize:
    changes.update(STABILIZED)
  config = dataclasses.replace(config, **changes)
  if config.epochs < 1:
    raise CommandError(f"--epochs {config.epochs} must be a positive integer.")
  if config.eval_every < 1:
    raise CommandError(f"--eval-every {config.eval_every} must be a positive integer.")
  if config.epochs % config.eval_every:
    raise CommandError(
      f"--epochs {config.epochs} is not a multiple of --eval-every {config.eval_every};"
      " every evaluation window must have the same length (one compiled program)."
    )
  _check_optimizer(config)
  every = getattr(args, "checkpoint_every", None)
  if every is not None and every < 0:
    raise CommandError(f"--checkpoint-every {every} must be >= 0 (0: only on Ctrl-C).")
  for flag in ("checkpoint_seconds", "time_limit"):
    value = getattr(args, flag, None)
    if value is not None and not (math.isfinite(value) and value > 0):
      raise CommandError(
        f"--{flag.replace('_', '-')} {value:g} must be a positive number of seconds."
      )
  arms = flags.parse_arms(args.arms, ARMS, preset["arms"])
  return config, arms, flags.parse_seeds(args.seeds, preset["seeds"])


def _check_optimizer(config: GrokConfig) -> None:
  """The optimizer settings in the optimizers' own ranges (``CommandError`` if not)."""
  for arg, field in (
    ("learning_rate", "learning_rate"),
    ("learning_rate", "frame_lr"),
    ("weight_decay", "weight_decay"),
    ("b1", "b1"),
    ("b2", "b2"),
    ("eps", "riemannian_eps"),
    ("max_norm", "tau"),
  ):
    problem = flags.optimizer_problem(arg, getattr(config, field))
    if problem is not None:
      raise CommandError(f"the setting {field} {problem}.")


def checkpoint_interval(config: GrokConfig, every: Optional[int]) -> int:
  """``every`` (default 1000) rounded up to a multiple of ``eval_every``; 0 stays 0."""
  return jobs.checkpoint_interval(1000 if every is None else every, config.eval_every)


@dataclasses.dataclass
class _Job(jobs.Job):
  """One (arm, seed) of the command and where its files live."""

  identity: dict = dataclasses.field(default_factory=dict)

  command = "stiefax grok"

  def same(self, record: dict) -> bool:
    return record_identity(record) == self.identity and record["seed"] == self.seed


def run(args: argparse.Namespace) -> int:
  """``stiefax grok``: trains the (arm, seed) runs ``args`` ask for, then prints their summary.

  Each (arm, seed) is a job of the run loop (:func:`stiefax.experiments.jobs.run_jobs`:
  finished runs skipped, locks, checkpoints, atomic writes, ``--no-wait``, ``--force``,
  ``--time-limit``); with ``--vmap-seeds`` the seeds of an arm are one batch.
  """
  started = time.monotonic()  # --time-limit counts from here, JAX's import included
  from stiefax.experiments.grok import training  # JAX: after --help

  config, arms, seeds = resolve_config(args)
  out = writable_dir(args.out, "--out")
  setting = (
    f"preset={args.preset} epochs={config.epochs} eval_every={config.eval_every}"
    f"{' stabilize' if args.stabilize else ''}"
  )
  print(
    f"stiefax grok: {setting}; arms {','.join(arms)}; seeds {','.join(map(str, seeds))} -> {out}",
    flush=True,
  )
  todo = [
    _Job(
      arm,
      seed,
      out / run_file_name(config, arm, seed, args.preset, args.stabilize),
      run_identity(config, arm, args.preset),
    )
    for arm in arms
    for seed in seeds
  ]
  every = checkpoint_interval(config, args.checkpoint_every)
  vmap = bool(getattr(args, "vmap_seeds", False)) and len(seeds) > 1
  limit = getattr(args, "time_limit", None)
  deadline = None if limit is None else started + limit

  def train(batch: list, checkpoints: list) -> list:
    """Trains ``batch`` (jobs of one arm, checkpointed at the same epoch)."""
    records = training.train_seeds(
      config,
      batch[0].arm,
      [job.seed for job in batch],
      progress=not getattr(args, "no_progress", False),
      checkpoints=checkpoints,
      checkpoint_every=every,
      vmap=vmap,
      checkpoint_seconds=getattr(args, "checkpoint_seconds", None) or 0.0,
      deadline=deadline,
    )
    for job, record in zip(batch, records):
      record["config"].update(preset=args.preset, stabilize=bool(args.stabilize), setting=setting)
      record["run_id"] = store.digest(job.identity)
      record["command"] = run_command(config, job.arm, job.seed, args.preset, args.stabilize, out)
      record["code"] = store.code_version()
    return records

  outcome = jobs.run_jobs(
    todo,
    train,
    no_wait=getattr(args, "no_wait", False),
    force=getattr(args, "force", False),
    together=(lambda job: job.arm) if vmap else None,
    time_limit=limit,
    started=started,
    clock=time.monotonic,
  )
  if outcome.status:
    return outcome.status
  by_path = {job.path: record for job, record in zip(todo, outcome.records)}
  ordered = [by_path[job.path] for seed in seeds for job in todo if job.seed == seed]
  print(summary_table(ordered))
  print()
  print(summary_words(ordered))
  print(seed_note(ordered))
  print(f"{len(ordered)} run(s) in {out}; tables and plots: stiefax report {out}")
  print(EXPECTED)
  return 0
