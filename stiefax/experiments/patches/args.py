"""The command line of ``stiefax patches``: its arguments and their checks."""

from __future__ import annotations

import argparse
import math
from typing import Optional

from stiefax.experiments.cli import CommandError
from stiefax.experiments.patches.settings import PROTOCOLS
from stiefax.experiments.patches.settings import arm_by_name

__all__ = ["add_arguments", "validate", "floats", "ints", "arm_map", "knob"]


def floats(text: str, flag: str) -> list[float]:
  """Comma-separated numbers (``CommandError`` naming ``flag`` otherwise)."""
  try:
    return [float(t) for t in text.split(",") if t.strip()]
  except ValueError:
    raise CommandError(f"{flag}: expected comma-separated numbers, got {text!r}") from None


def ints(text: str, flag: str) -> list[int]:
  """Comma-separated distinct integers or ranges such as ``0-11``."""
  out: list[int] = []
  try:
    for t in text.split(","):
      t = t.strip()
      if not t:
        continue
      if "-" in t[1:]:
        lo, hi = t.split("-", 1)
        out.extend(range(int(lo), int(hi) + 1))
      else:
        out.append(int(float(t)) if "e" in t.lower() else int(t))
  except ValueError:
    raise CommandError(
      f"{flag}: expected comma-separated integers or ranges like 0-11, got {text!r}"
    ) from None
  if not out:
    raise CommandError(f"{flag}: empty list")
  if len(set(out)) != len(out):
    raise CommandError(f"{flag}: repeated values in {text!r}")
  return out


def arm_map(text: Optional[str], flag: str, sep: str = ",") -> dict:
  """``"B2=1.0,A2=0.01"`` -> ``{"B2": "1.0", ...}`` with arm names resolved."""
  out: dict[str, str] = {}
  if not text:
    return out
  for item in text.split(sep):
    if not item.strip():
      continue
    if "=" not in item:
      raise CommandError(f"{flag}: expected ARM=VALUE items, got {item!r}")
    name, value = item.split("=", 1)
    out[arm_by_name(name).name] = value.strip()
  return out


def knob(text: str, flag: str) -> float:
  """A rate: a finite number >= 0."""
  try:
    v = float(text)
  except ValueError:
    raise CommandError(f"{flag}: {text!r} is not a number") from None
  if not math.isfinite(v) or v < 0:
    raise CommandError(f"{flag}: rates must be finite and >= 0, got {text!r}")
  return v


def add_arguments(parser: argparse.ArgumentParser) -> None:
  from stiefax.experiments import patches  # pylint: disable=g-import-not-at-top

  doc = patches.__doc__ or ""
  parser.description = doc.split("\n\n", 1)[0]
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  parser.epilog = doc.split("\n\n", 1)[1]
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
    help="per-arm rate overrides, e.g. B2=1.0,A2=0.003 (the Riemannian rate"
    " of frame arms; the AdamW rate of A2, A2-orth; lambda of soft)",
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
  g.add_argument(
    "--force",
    action="store_true",
    help="rerun runs whose JSON already exists with the same configuration",
  )
  g.add_argument("--no-progress", action="store_true", help="no progress bars")


def _positive(value, flag: str, allow_zero: bool = False) -> None:
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
  from stiefax import _routing  # pylint: disable=g-import-not-at-top

  # The optimizers' own ranges (what they would raise when built), checked before any data
  # is read or run trained.
  for flag, arg, value in (
    ("--eps", "eps", args.eps),
    ("--max-norm", "max_norm", args.max_norm),
    ("--adamw-lr", "learning_rate", args.adamw_lr),
    ("--weight-decay", "weight_decay", args.weight_decay),
  ):
    problem = _routing.hyperparam_problem(arg, value)
    if problem is not None:
      raise CommandError(f"{flag} {problem}")
  import stiefax  # pylint: disable=g-import-not-at-top

  if args.polar not in stiefax.POLAR_METHODS:
    raise CommandError(f"--polar {args.polar!r}: choose from {', '.join(stiefax.POLAR_METHODS)}")
