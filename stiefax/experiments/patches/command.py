"""Image-patch benchmark (paper sections 3.3, 4.1, 4.2, 4.5-4.7).

``stiefax patches [run|sweep-n|sweep-eps] [options]``

Data: CIFAR-10 from the python-format archive or folder, or an image-folder copy
(``--data``; see :mod:`stiefax.experiments.patches.data`), or, with no ``--data``,
scikit-learn's ``digits`` (real 8x8 images shipped with the package: 4x4 patches, 4
tokens of raw dimension 16 whitened to d=16, 4 heads of r=4). Tokens are contrast-
normalized, PCA-whitened patches, cached on disk (``--cache``).

Model (the paper leaves depth, positions and pooling open; chosen here): the
whitened tokens are the embeddings (no extra input projection: the whitening *is*
the embedding), plus a learned positional embedding ``(P, d)`` (normal, std 0.02);
``--depth`` (default 1) pre-LN blocks ``x += MHA(LN(x)); x += MLP(LN(x))`` (Flax
``MultiHeadDotProductAttention`` with H heads of width r, so W_Q, W_K are
``(d, H, r)`` kernels = H frames in St(d, r); MLP d -> 4d -> d with GELU); final
LayerNorm, mean pooling over tokens, classifier ``W_cls``. Xavier-uniform kernels.

Training: batch 256 (the last partial batch of an epoch is kept), AdamW on every
non-frame parameter (rate ``--adamw-lr``, decay 0.05 on rank >= 2 tensors only, not
LayerNorm), 5-epoch linear warm-up then cosine to zero
(``optax.warmup_cosine_decay_schedule``), applied to the frame rate frame_lr too; plain
cross-entropy; test accuracy at the final epoch. The batch order and the initial
non-frame parameters depend on the seed only (shared across arms); the orthonormal
frames are drawn from the seed too (identical across the arms that use them).

Arms (``--arms``, or ``all`` for the paper's eight above the blank line):

{arms}

Protocols: ``run`` (default; ``--seeds`` paired, ``--select-lr`` first picks each
arm's rate on the validation images [n_train : n_train + n_val]), ``sweep-n``
(``--ns`` at about ``--budget`` 2000 steps per run, paper Table 3), ``sweep-eps``
(``--eps-values`` for B2, Section 4.7). One JSON file per run goes to ``--out``: a
finished run is read back (``--force`` trains it again, the earlier file moved aside),
several processes can share one ``--out`` (``--no-wait`` leaves the runs another holds
to it: exit status 75); ``stiefax report DIR`` (or the table printed at the end) gives
per-arm mean +- std, the paired difference to A2 (t, p, wins, paired-t and bootstrap
95% CIs), isometry error and wall-clock per epoch.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time
from typing import Optional

import stiefax
from stiefax.experiments import flags
from stiefax.experiments import jobs
from stiefax.experiments.arms import Arm
from stiefax.experiments.flags import CommandError
from stiefax.experiments.flags import check_seeds
from stiefax.experiments.flags import writable_dir
from stiefax.experiments.patches import tables
from stiefax.experiments.patches.config import ARMS
from stiefax.experiments.patches.config import PAPER_ARMS
from stiefax.experiments.patches.config import PRESETS
from stiefax.experiments.patches.config import PROTOCOLS
from stiefax.experiments.patches.config import arm_by_name
from stiefax.experiments.patches.config import arm_help

__all__ = ["add_arguments", "validate", "defaults", "select_arms", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
  doc = __doc__ or ""
  parser.description = doc.split("\n\n", 1)[0]
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  parser.epilog = doc.split("\n\n", 1)[1].replace("{arms}", arm_help())
  add = parser.add_argument
  add(
    "protocol",
    nargs="?",
    default="run",
    choices=PROTOCOLS,
    help="run (default): paired seeds; sweep-n: data-size sweep; sweep-eps: eps probe",
  )
  g = parser.add_argument_group("data")
  g.add_argument(
    "--data",
    default=None,
    help="cifar-10-python.tar.gz, cifar-10-batches-py/, an image-folder copy"
    " (folder or .tar.gz), or 'random' (timing); default: sklearn digits",
  )
  g.add_argument(
    "--cache", default=None, help="cache folder (default $STIEFAX_CACHE or ~/.cache/stiefax)"
  )
  g.add_argument("--no-cache", action="store_true", help="do not read or write the cache")
  g.add_argument(
    "--n-train", type=int, default=None, help="first n training images (default 10000; digits 1000)"
  )
  g.add_argument(
    "--n-val",
    type=int,
    default=None,
    help="validation images after the training set, for --select-lr"
    " (default min(5000, rest of the pool))",
  )
  g.add_argument("--patch", type=int, default=None, help="patch side (default 8; digits 4)")
  g.add_argument(
    "--d", type=int, default=None, help="whitened dimension = model width (default 128; digits 16)"
  )
  g.add_argument("--whiten-eps", type=float, default=0.1, help="whitening eps (default 0.1)")
  g.add_argument(
    "--pca-samples", type=int, default=100_000, help="patches in the whitening fit (default 100000)"
  )
  g.add_argument(
    "--order-seed",
    type=int,
    default=0,
    help="seed of the class-interleaved order of image-folder copies",
  )
  g = parser.add_argument_group("model")
  g.add_argument("--depth", type=int, default=1, help="encoder blocks (default 1)")
  g.add_argument("--heads", type=int, default=None, help="H (default 8; digits 4)")
  g.add_argument("--head-dim", type=int, default=None, help="r (default 16; digits 4)")
  g.add_argument("--mlp-ratio", type=int, default=4, help="MLP width / d (default 4)")
  g = parser.add_argument_group("training")
  g.add_argument("--arms", default="A2,B2", help="comma-separated arms, or all (default A2,B2)")
  g.add_argument("--seeds", default="0,1,2", help="seeds, e.g. 0,1,2 or 0-11 (default 0,1,2)")
  g.add_argument(
    "--epochs", type=int, default=None, help="epochs (default 40; 100 when n-train >= 50000)"
  )
  g.add_argument("--batch-size", type=int, default=256)
  g.add_argument("--warmup-epochs", type=int, default=5)
  g.add_argument(
    "--adamw-lr",
    type=float,
    default=1e-2,
    help="AdamW rate of the non-frame parameters (default 1e-2, the paper's"
    " validation-selected A2 rate)",
  )
  g.add_argument("--weight-decay", type=float, default=0.05)
  g.add_argument(
    "--lr",
    default=None,
    help="per-arm rate overrides, e.g. B2=1.0,A2=0.003 (the frame rate"
    " frame_lr of frame arms; the AdamW rate of A2, A2-orth; lambda of soft)",
  )
  g.add_argument("--eps", type=float, default=1e-8, help="Riemannian Adam eps (default 1e-8)")
  g.add_argument("--max-norm", type=float, default=0.1, help="step cap tau (default 0.1)")
  g.add_argument("--penalty", type=float, default=0.1, help="soft-penalty lambda (default 0.1)")
  g.add_argument("--polar", default="auto", help="polar retraction method (default auto)")
  g = parser.add_argument_group("protocols")
  g.add_argument(
    "--select-lr", action="store_true", help="pick each arm's rate on the validation images first"
  )
  g.add_argument("--grid", default=None, help="--select-lr grids, e.g. B2=0.3:1:3,A2=0.001:0.01")
  g.add_argument("--select-seeds", default="0", help="seeds of the selection (default 0)")
  g.add_argument(
    "--ns",
    default=None,
    help="sweep-n sizes (default 1000,2000,5000,10000,20000,50000; digits 125,250,500,1000)",
  )
  g.add_argument("--budget", type=int, default=2000, help="sweep-n steps per run (default 2000)")
  g.add_argument(
    "--eps-values",
    default="1e-8,1e-6,1e-4,1e-2,1e-1",
    help="sweep-eps values (default 1e-8,1e-6,1e-4,1e-2,1e-1)",
  )
  g = parser.add_argument_group("output")
  g.add_argument("--out", default="runs/patches", help="results folder (default runs/patches)")
  g.add_argument(
    "--eval-every",
    type=int,
    default=0,
    help="also record accuracy every k epochs (default: final epoch only)",
  )
  jobs.add_arguments(g)


def _positive(value: Optional[float], flag: str, allow_zero: bool = False) -> None:
  if value is None:
    return
  if not math.isfinite(value):
    raise CommandError(f"{flag} must be a finite number, got {value}")
  if value < 0 or (value == 0 and not allow_zero):
    raise CommandError(f"{flag} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def validate(args: argparse.Namespace) -> None:
  """One-line ``CommandError`` for a value out of range."""
  for flag in (
    "n_train",
    "patch",
    "d",
    "depth",
    "heads",
    "head_dim",
    "mlp_ratio",
    "epochs",
    "batch_size",
    "budget",
    "pca_samples",
  ):
    _positive(getattr(args, flag), "--" + flag.replace("_", "-"))
  for flag in (
    "n_val",
    "warmup_epochs",
    "adamw_lr",
    "weight_decay",
    "eps",
    "penalty",
    "eval_every",
  ):
    _positive(getattr(args, flag), "--" + flag.replace("_", "-"), allow_zero=True)
  _positive(args.max_norm, "--max-norm")
  _positive(args.whiten_eps, "--whiten-eps")  # Lambda + eps must be invertible
  # The optimizers' own ranges (what they would raise when built), checked before any data
  # is read or run trained.
  for flag, arg, value in (
    ("--eps", "eps", args.eps),
    ("--max-norm", "max_norm", args.max_norm),
    ("--adamw-lr", "learning_rate", args.adamw_lr),
    ("--weight-decay", "weight_decay", args.weight_decay),
  ):
    problem = flags.optimizer_problem(arg, value)
    if problem is not None:
      raise CommandError(f"{flag} {problem}")
  if args.polar not in stiefax.POLAR_METHODS:
    raise CommandError(f"--polar {args.polar!r}: choose from {', '.join(stiefax.POLAR_METHODS)}")


def defaults(args: argparse.Namespace) -> dict:
  """The settings left unset on the command line: the paper's, or digits' without --data
  (:data:`~stiefax.experiments.patches.config.PRESETS`)."""
  preset = PRESETS["digits" if args.data is None else "paper"]
  out = {k: getattr(args, k) or preset[k] for k in ("n_train", "patch", "d", "heads", "head_dim")}
  out["ns"] = list(preset["ns"])
  return out


def select_arms(args: argparse.Namespace) -> list[Arm]:
  """The arms of ``--arms`` (``all``: the paper's eight; sweep-eps defaults to B2)."""
  if args.arms.strip().lower() == "all":
    arms = [ARMS[n] for n in PAPER_ARMS]
  else:
    names = [t for t in args.arms.split(",") if t.strip()]
    if not names:
      raise CommandError("--arms: empty list")
    arms = [arm_by_name(t) for t in names]
    if len({a.name for a in arms}) != len(arms):
      raise CommandError(f"--arms: repeated arm in {args.arms!r}")
  if args.protocol == "sweep-eps" and args.arms == "A2,B2":
    arms = [ARMS["B2"]]
  return arms


def _cache_dir(args: argparse.Namespace) -> Optional[pathlib.Path]:
  """The cache folder (None: no cache). ``--cache`` must be writable (``CommandError``);
  the default one, when it is not, is left out with a notice."""
  from stiefax.experiments.patches import images as images_lib  # after --help

  if args.no_cache:
    return None
  if args.cache is not None:
    return writable_dir(pathlib.Path(args.cache).expanduser() if args.cache else "", "--cache")
  cache = images_lib.default_cache_dir()
  try:
    return writable_dir(cache, "the cache folder")
  except CommandError as e:
    print(f"stiefax patches: {e} Continuing without a cache.", file=sys.stderr, flush=True)
    return None


def run(args: argparse.Namespace) -> int:
  """``stiefax patches``: trains what ``args`` ask for, prints the report.

  It checks the arguments, loads the images, hands the runs of the protocol asked for
  (:mod:`stiefax.experiments.patches.protocols`) to the run loop
  (:func:`stiefax.experiments.jobs.run_jobs`), then prints the report.
  """
  # The images and training code (scikit-learn, JAX) are imported here, not by --help.
  from stiefax.experiments.patches import images as images_lib
  from stiefax.experiments.patches import protocols

  validate(args)
  arms = select_arms(args)
  seeds = check_seeds(flags.ints(args.seeds, "--seeds"), "--seeds")
  check_seeds(flags.ints(args.select_seeds, "--select-seeds"), "--select-seeds")
  check_seeds([args.order_seed], "--order-seed")
  out_path = pathlib.Path(args.out).expanduser() if str(args.out).strip() else ""
  writable_dir(out_path, "--out")  # fail before reading data or training
  cache = _cache_dir(args)
  progress = not args.no_progress
  images = images_lib.load_images(
    args.data, order_seed=args.order_seed, cache_dir=cache, progress=progress
  )
  out = writable_dir(out_path, "--out")
  ctx = protocols.Context(args, images, out, cache, progress, defaults(args))
  t0 = time.perf_counter()
  plan = protocols.PROTOCOL_FNS[args.protocol](ctx, arms, seeds)
  outcome = jobs.run_jobs(plan, protocols.trainer(ctx), no_wait=args.no_wait, force=args.force)
  if outcome.status:
    return outcome.status
  done = outcome.records
  print(f"\n{len(done)} runs in {time.perf_counter() - t0:.1f} s; results in {ctx.out}\n")
  print(tables.report(done, ctx.out))
  return 0
