"""A decoder-only language model on real text: does the constraint help an LM?

``stiefax lm [--preset quick|sweep|large] [--arms ...] [--lr RATES|best] [--seeds ...]``

The text is the Python standard library's own ``*.py`` sources, read as bytes from the
running interpreter (nothing is downloaded): about 4.7 MB, split by file into
training, a fixed validation split and a fixed test split (about 5% each held out;
:mod:`stiefax.experiments.lm.data`). Losses are in bits per byte.

The model (:mod:`stiefax.experiments.lm.model`) is a small modern decoder: tied byte
embeddings, pre-norm RMSNorm blocks, rotary positions, Gemma's gated-GELU MLP, causal
grouped-query attention with Gemma's parameter layout (``q_einsum/w (H, d, r)``,
``kv_einsum/w (2, K, d, r)``), so every query head and every key head is a frame that
stiefax finds by name.

Arms (the one registry; every other parameter trains with AdamW, weight decay
{weight_decay} on matrices, b1 {b1}, b2 {b2}, linear warm-up over the first {warmup}% of
steps, then cosine to 0; the frames follow it at frame_lr, stiefel_adamw's rule).
Added by study 2 of docs/lm.md: {study2}.
Added by its study 3: {study3}.

{arms}

Presets (the numbers are each preset's own; quick runs {quick_arms} at seed 0, a few
minutes on a 2-core CPU, and prints a summary and plain words; sweep is study 1 of
docs/lm.md, ``studies/lm.sh`` runs it; large is study 2's larger model):

{presets}

Each run is one JSON in --out, named by its arm, rate and a hash of its whole
configuration; finished runs are skipped (--force trains them again, the earlier file
moved aside), unfinished ones resume from their checkpoint, and several processes can
share one --out (--no-wait leaves the runs another holds to it: exit status 75).
``stiefax report OUT`` prints the learning-rate sensitivity table, the largest logits,
the best-rate comparison with paired intervals, and writes the figures.

Examples:
  stiefax lm
  stiefax lm --arms A2,B2 --steps 50
  stiefax lm --preset sweep --arms A2,B2 --lr 1e-3,3e-3,1e-2 --seeds 0,1 --out results/lm
  stiefax lm --preset sweep --arms A2,B2 --lr best --seeds 0,1,2,3,4,5 --out results/lm
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
from typing import Any
from typing import Optional

from stiefax.experiments import flags
from stiefax.experiments import jobs
from stiefax.experiments import store
from stiefax.experiments.flags import CommandError
from stiefax.experiments.flags import writable_dir
from stiefax.experiments.lm import data as data_lib
from stiefax.experiments.lm import fair
from stiefax.experiments.lm import grid as grid_lib
from stiefax.experiments.lm import norms
from stiefax.experiments.lm import runs as runs_lib
from stiefax.experiments.lm import tables
from stiefax.experiments.lm.config import ADDED_BY_STUDY
from stiefax.experiments.lm.config import ARMS
from stiefax.experiments.lm.config import PRESETS
from stiefax.experiments.lm.config import SWEEP_RATES
from stiefax.experiments.lm.config import LMConfig
from stiefax.experiments.protocol import record_problem

__all__ = ["help_text", "add_arguments", "resolve_config", "Job", "run"]

#: Arms and rate of ``stiefax lm`` with no arguments (the quick preset).
QUICK_ARMS = ("A2", "A2-qknorm", "B2")


#: Arm names ``--arms`` resolves from study 2's runs: its best Stiefel arm and that
#: arm's QK-norm partner (:func:`stiefax.experiments.lm.fair.qknorm_partner`).
STUDY2_ARMS = ("best-stiefel", "best-stiefel-partner")


def preset_values(field: str) -> str:
  """The presets' ``field`` in words: one number when they share it, else each preset's
  (``quick 600, sweep 1000, large 2000``). The help's defaults are written with it."""
  values = {name: getattr(c, field) for name, c in PRESETS.items()}
  if len(set(values.values())) == 1:
    return f"{next(iter(values.values())):g}"
  return ", ".join(f"{name} {v:g}" for name, v in values.items())


def _sweep_words() -> str:
  """The sweep's rates in words, e.g. ``3e-4 to 3e-1, x3 apart``."""
  low, high = (f"{r:.0e}".replace("e-0", "e-") for r in (SWEEP_RATES[0], SWEEP_RATES[-1]))
  return f"{low} to {high}"


def help_text() -> str:
  """The ``--help`` text: this docstring with the registry's arms and the presets' numbers."""
  warmup = {round(100 * c.warmup_steps / c.steps) for c in PRESETS.values()}
  presets = "\n".join(
    f"  {name:<7}d={c.d_model}, {c.depth} layers, {c.heads} query / {c.kv_heads} key-value"
    f" heads of r={c.head_dim}, {c.steps} steps of {c.batch} x {c.seq} bytes\n"
    f"{'':9}(warm-up {c.warmup_steps}, evaluation every {c.eval_every}), AdamW rate"
    f" {c.adamw_lr:g}, frame rate {c.frame_lr:g}"
    for name, c in PRESETS.items()
  )
  return (__doc__ or "").format(
    arms=flags.arm_lines(ARMS),
    presets=presets,
    quick_arms=",".join(QUICK_ARMS),
    weight_decay=preset_values("weight_decay"),
    b1=preset_values("b1"),
    b2=preset_values("b2"),
    warmup="/".join(map(str, sorted(warmup))),
    study2=", ".join(ADDED_BY_STUDY[2]),
    study3=", ".join(ADDED_BY_STUDY[3]),
  )


def add_arguments(parser: argparse.ArgumentParser) -> None:
  fair_arms = " or ".join(STUDY2_ARMS)
  parser.description = help_text()
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  parser.add_argument(
    "--preset", choices=sorted(PRESETS), default="quick", help="model and budget (default quick)"
  )
  parser.add_argument(
    "--arms",
    default=None,
    help=f"comma-separated arms from {','.join(ARMS)}, or {fair_arms}: study 2's best"
    " Stiefel arm in --cells-from and its QK-norm partner (docs/lm.md; default"
    f" {','.join(QUICK_ARMS)})",
  )
  parser.add_argument("--seeds", default="0", help="comma-separated seeds in [0, 2^32) (default 0)")
  parser.add_argument(
    "--lr",
    default=None,
    help="AdamW peak rate(s), comma-separated, or 'bracket': each arm's grid of study 3"
    " (docs/lm.md: its swept rate from its start, extended x3 past an edge best at seeds"
    " 0-1 until the best is interior), or 'best': each arm's rate of the sweep"
    f" ({_sweep_words()}, x3 apart) with the lowest mean validation loss among the"
    " finished runs in --out, or 'around': each arm's best cell of study 2 in"
    " --cells-from and the AdamW rates x3 either side of it, its frame rate kept"
    f" (default: the preset's, {preset_values('adamw_lr')})",
  )
  parser.add_argument(
    "--frame-lr",
    default=None,
    help="frame_lr, the frames' rate(s) at the AdamW peak, for the arms whose frames have"
    " their own rule (frozen frames stay at 0; the others ignore it), comma-separated, or"
    " 'best': the frame rate of B2's best cell in study 2's grid among the runs in --out"
    f" (default: the preset's, {preset_values('frame_lr')})",
  )
  parser.add_argument(
    "--matrix-lr",
    default=None,
    help="the peak rate(s) of the matrix rule of AdamH, AdamH-qknorm, MuonH, Muon, B2-H and"
    " SphereAdam (the other arms ignore it), comma-separated (default: the preset's,"
    f" {preset_values('matrix_lr')})",
  )
  parser.add_argument(
    "--select-from",
    choices=("sweep", "fair", "around", "norms"),
    default="sweep",
    help=f"the cells 'best' chooses among: sweep, study 1's {len(SWEEP_RATES)} AdamW rates"
    f" ({_sweep_words()}) at the given frame rate; fair, study 2's grid of docs/lm.md, where B2's best"
    " cell also fixes its frame rate; around, the cells of --lr around, by seed 0"
    "; norms, study 3's bracketed grid of docs/lm.md (default sweep)",
  )
  parser.add_argument(
    "--cells-from",
    default=None,
    metavar="DIR",
    help="study 2's small-model runs (docs/lm.md), for --lr around and the arm names"
    f" {fair_arms} (default --out)",
  )
  parser.add_argument(
    "--reuse",
    default=None,
    metavar="DIR",
    help="before training a run, take a finished run of exactly the same configuration"
    " and seed from DIR (study 2 reuses study 1's runs this way)",
  )
  parser.add_argument(
    "--steps", type=int, default=None, help=f"training steps (preset's: {preset_values('steps')})"
  )
  parser.add_argument(
    "--eval-every",
    type=int,
    default=None,
    help=f"steps between evaluations (preset's: {preset_values('eval_every')})",
  )
  parser.add_argument(
    "--batch",
    type=int,
    default=None,
    help=f"sequences per step (preset's, {preset_values('batch')})",
  )
  parser.add_argument(
    "--max-norm",
    type=float,
    default=None,
    help="the Riemannian Adam's step cap tau: |eta|_F <= tau sqrt(r) (preset's,"
    f" {preset_values('max_norm')})",
  )
  parser.add_argument(
    "--out", default="runs/lm", help="directory for one JSON file per run (default runs/lm)"
  )
  parser.add_argument(
    "--checkpoint-every",
    type=int,
    default=500,
    help="steps between checkpoints of an unfinished run (a multiple of --eval-every"
    " is used; 0: only on Ctrl-C/SIGTERM; default 500)",
  )
  jobs.add_arguments(parser)


def _rates(text: str, flag: str = "--lr") -> list[float]:
  try:
    rates = [float(s) for s in text.split(",") if s.strip()]
  except ValueError:
    words = "'best' or 'around'" if flag == "--lr" else "or 'best'"
    raise CommandError(f"{flag} {text!r} must be comma-separated numbers, {words}.") from None
  if not rates or any(not (math.isfinite(r) and r > 0) for r in rates):
    raise CommandError(f"{flag} {text!r}: rates must be finite and > 0.")
  for r in rates:  # the optimizers' range: a step that float32 can represent
    flags.check_setting(flag, "learning_rate", r)
  return list(dict.fromkeys(rates))


def _is_best(text: Optional[str]) -> bool:
  return text is not None and text.strip().lower() == "best"


def _is_around(text: Optional[str]) -> bool:
  return text is not None and text.strip().lower() == "around"


def _own_frame_rate(arm: str) -> bool:
  """Whether ``--frame-lr`` reaches ``arm``: a frame rule of its own, not frozen."""
  return ARMS[arm].apart and ARMS[arm].frame_lr != 0.0


def resolve_config(args: argparse.Namespace) -> tuple[LMConfig, list[str], list[int]]:
  """The configuration (before the rate), arms and seeds ``args`` ask for."""
  base = PRESETS[args.preset]
  changes: dict = {}
  if args.steps is not None:
    if args.steps < 1:
      raise CommandError(f"--steps {args.steps} must be >= 1.")
    changes["steps"] = args.steps
    changes["warmup_steps"] = base.warmup_steps * args.steps // base.steps
    changes["eval_every"] = min(base.eval_every, args.steps)
  if args.eval_every is not None:
    changes["eval_every"] = args.eval_every
  if args.batch is not None:
    changes["batch"] = args.batch
  if args.max_norm is not None:
    changes["max_norm"] = flags.check_setting("--max-norm", "max_norm", args.max_norm)
  config = dataclasses.replace(base, **changes)
  try:
    config.check()
  except ValueError as e:
    raise CommandError(str(e)) from None
  if args.checkpoint_every < 0:
    raise CommandError(f"--checkpoint-every {args.checkpoint_every} must be >= 0.")
  # An empty --arms means the default arms, as no --arms does.
  arms = flags.parse_arms(args.arms or None, ARMS, QUICK_ARMS)
  return config, arms, flags.parse_seeds(args.seeds, (0,))


@dataclasses.dataclass
class Job(jobs.Job):
  """One (arm, rate, seed) of the command and where its files live."""

  config: LMConfig = dataclasses.field(default_factory=LMConfig)
  cfg: dict = dataclasses.field(default_factory=dict)  # the run's recorded configuration

  command = "stiefax lm"

  @property
  def label(self) -> str:
    return self.path.name

  def same(self, record: dict) -> bool:
    key = runs_lib.run_key({"arm": self.arm, "config": self.cfg, "seed": self.seed})
    return runs_lib.run_key(record) == key


def run(args: argparse.Namespace) -> int:
  """``stiefax lm``: trains the runs ``args`` ask for, then prints their summary.

  Every (arm, rate, seed) is one job of the run loop
  (:func:`stiefax.experiments.jobs.run_jobs`): one JSON file in ``--out``, finished runs
  read back, locks, checkpoints (every ``--checkpoint-every`` steps and on Ctrl-C or
  SIGTERM), ``--no-wait``, ``--force``; ``--reuse`` copies a finished run in first.
  """
  for flag, given in (
    ("--out", args.out),
    ("--reuse", args.reuse),
    ("--cells-from", args.cells_from),
  ):
    if given is not None and not str(given).strip():  # '' would mean the current folder
      raise CommandError(f"{flag} is empty; name a folder (e.g. {flag} runs).")
  out = writable_dir(args.out, "--out")
  facts = data_lib.load().facts
  src = out if args.cells_from is None else pathlib.Path(args.cells_from)
  if args.cells_from is not None and not src.is_dir():
    raise CommandError(f"--cells-from {args.cells_from}: not a directory.")
  if args.arms and args.arms.strip() == "norms-large":
    names = grid_lib.norms_large_arms(src, facts)
    print(f"  --arms norms-large: {','.join(names)} (study 3's small-model runs in {src})")
    args = argparse.Namespace(**{**vars(args), "arms": ",".join(names)})
  if args.arms and any(a.strip() in STUDY2_ARMS for a in args.arms.split(",")):
    names = [a.strip() for a in args.arms.split(",")]
    names = [grid_lib.study2_arm(a, src, facts) if a in STUDY2_ARMS else a for a in names]
    print(f"  --arms {args.arms}: {','.join(names)} (study 2's runs in {src})", flush=True)
    args = argparse.Namespace(**{**vars(args), "arms": ",".join(dict.fromkeys(names))})
  config, arm_names, seeds = resolve_config(args)
  if args.frame_lr is not None and not _is_best(args.frame_lr):
    frame_rates = _rates(args.frame_lr, "--frame-lr")
  elif _is_best(args.frame_lr):
    frame_rates = [grid_lib.best_cell(out, "B2", config, facts, args.preset)[1]]
    print(f"  frame rate: {frame_rates[0]:g}, B2's best cell of study 2 in {out}", flush=True)
  else:
    frame_rates = [config.frame_lr]
  todo = []
  for arm in arm_names:
    arm_frames = frame_rates if _own_frame_rate(arm) else [config.frame_lr]
    todo_cells: list[tuple[float, float]] = []
    bracketed = args.lr is not None and args.lr.strip().lower() == "bracket"
    if bracketed or (_is_best(args.lr) and args.select_from == "norms"):
      grid = grid_lib.norms_cells(arm, config, args.preset, out, src, facts, best=not bracketed)
      shown = ", ".join(f"{getattr(c, norms.swept(arm)):g}" for c in grid)
      what = "grid so far" if bracketed else "best cell"
      print(f"  {arm}: {norms.swept(arm)} {shown} (study 3's {what} in {out})", flush=True)
      for c in grid:
        cfg = runs_lib.run_config(ARMS[arm], c, facts, args.preset)
        for seed in seeds:
          todo.append(Job(arm, seed, out / runs_lib.run_name(arm, cfg, seed), config=c, cfg=cfg))
      continue
    if args.lr is None:
      todo_cells = [(config.adamw_lr, f) for f in arm_frames]
    elif _is_around(args.lr):
      todo_cells = grid_lib.around_cells(src, arm, facts)
      shown = ", ".join(f"lr {a:g} frame-lr {f:g}" for a, f in todo_cells)
      print(f"  {arm}: {shown} (around its best cell of study 2 in {src})", flush=True)
    elif _is_best(args.lr) and args.select_from == "around":
      wanted = grid_lib.around_cells(src, arm, facts)
      mine = grid_lib.setting_runs(out, arm, config, facts, args.preset)
      cell = fair.select_cell(mine, wanted, fair.LARGE_SELECTION_SEEDS)
      if cell is None:
        missing = fair.missing(mine, wanted, fair.LARGE_SELECTION_SEEDS)
        raise CommandError(
          f"--lr best --select-from around: {arm}'s cells in {out} are not finished"
          f" ({len(missing)} run(s) missing)."
        )
      todo_cells = [cell]
      print(f"  {arm}: best cell lr {cell[0]:g} frame-lr {cell[1]:g} in {out}", flush=True)
    elif _is_best(args.lr) and args.select_from == "fair":
      frame_best = frame_rates[0] if args.frame_lr is not None and len(frame_rates) == 1 else None
      todo_cells = [grid_lib.best_cell(out, arm, config, facts, args.preset, frame_best)]
      a, f = todo_cells[0]
      print(f"  {arm}: best cell lr {a:g} frame-lr {f:g} of study 2 in {out}", flush=True)
    elif _is_best(args.lr):
      for f in arm_frames:
        lr = grid_lib.best_rate(
          out, arm, dataclasses.replace(config, frame_lr=f), facts, args.preset
        )
        print(f"  {arm}: best rate {lr:g} by validation loss in {out}", flush=True)
        todo_cells.append((lr, f))
    else:
      todo_cells = [(lr, f) for f in arm_frames for lr in _rates(args.lr)]
    matrix_rates = [config.matrix_lr]
    if args.matrix_lr is not None and ARMS[arm].matrices != "adamw":
      matrix_rates = _rates(args.matrix_lr, "--matrix-lr")
    for lr, f in todo_cells:
      for m in matrix_rates:
        c = dataclasses.replace(config, adamw_lr=lr, frame_lr=f, matrix_lr=m)
        cfg = runs_lib.run_config(ARMS[arm], c, facts, args.preset)
        for seed in seeds:
          path = out / runs_lib.run_name(arm, cfg, seed)
          todo.append(Job(arm, seed, path, config=c, cfg=cfg))
  reuse = None
  if args.reuse is not None:
    reuse = pathlib.Path(args.reuse)
    if not reuse.is_dir():
      raise CommandError(f"--reuse {args.reuse}: not a directory.")
  print(
    f"stiefax lm: preset={args.preset} steps={config.steps} d={config.d_model}"
    f" depth={config.depth} heads={config.heads}/{config.kv_heads} r={config.head_dim};"
    f" {len(todo)} run(s) -> {out}",
    flush=True,
  )
  every = jobs.checkpoint_interval(args.checkpoint_every, config.eval_every)
  outcome = jobs.run_jobs(
    todo,
    lambda batch, ckpts: [_train(batch[0], ckpts[0], every, out, not args.no_progress)],
    no_wait=args.no_wait,
    force=args.force,
    take=None if reuse is None else (lambda job: _reuse(job, reuse)),
  )
  if outcome.status:
    return outcome.status
  print()
  print(tables.summary(outcome.records))
  print(f"{len(outcome.records)} run(s) in {out}; tables and plots: stiefax report {out}")
  return 0


def _reuse(job: Job, source: pathlib.Path) -> Optional[dict]:
  """Copies ``job``'s finished run from ``source`` into its place, if there is a valid
  one (:func:`stiefax.experiments.protocol.record_problem`); an invalid one is skipped
  with one line."""
  found, problem = store.finished_run(source / job.path.name, job.same, record_problem)
  if found is None:
    if problem:
      grid_lib.warn_skipped([f"--reuse: skipped {source / job.path.name}: {problem}"])
    return None
  try:
    store.write_json(job.path, found)
  except OSError as e:
    raise CommandError(f"cannot write {job.path} ({e.strerror or e}).") from None
  print(f"  {job.path.name}: reused from {source}", flush=True)
  return found


def _train(job: Job, ckpt: Any, every: int, out: pathlib.Path, progress: bool) -> dict:
  """Trains ``job`` from its checkpoint ``ckpt`` (if it has one); its record."""
  import jax  # JAX and the training code: not imported by `stiefax lm --help`

  from stiefax.experiments.lm import training

  desc = f"{job.arm} lr={job.config.adamw_lr:g} seed {job.seed}"
  if _own_frame_rate(job.arm) and job.config.frame_lr != LMConfig().frame_lr:
    desc = f"{job.arm} lr={job.config.adamw_lr:g} frame-lr={job.config.frame_lr:g} seed {job.seed}"
  result = training.train(
    ARMS[job.arm],
    job.config,
    job.seed,
    progress=progress,
    checkpoints=ckpt,
    checkpoint_every=every,
    desc=desc,
  )
  record = {
    "experiment": "lm",
    "arm": job.arm,
    "seed": job.seed,
    "config": job.cfg,
    **result,
    "command": runs_lib.run_command(job.arm, job.cfg, job.seed, out),
    "code": store.code_version(),
    "jax_version": jax.__version__,
    "backend": jax.default_backend(),
  }
  m = record["metrics"]
  print(
    f"  {desc}: val {m['val_bpb']:.4f} test {m['test_bpb']:.4f} bits/byte,"
    f" max logit {m['max_logit_max']:.1f}, isometry {m['isometry']:.1e}"
    f"{' (diverged)' if m['diverged'] else ''}",
    flush=True,
  )
  return record
