"""O(d)-equivariance of optimizers on the Stiefel manifold (the paper's Table 9).

On f(W) = -tr(W^T A W) (A symmetric; d=24, r=6, H=3 frames; T=15 steps) each
optimizer is run from W_0 and, for five random orthogonal Q, from Q^T W_0 on the
rotated problem; the table reports the worst max|W_T^(Q) - Q^T W_T| (float64).
Adam with zero decay ("AdamW") is off by the order of W itself, the elementwise
("naive") Riemannian Adam far above 1e-6, the corrected Riemannian Adam and
Riemannian SGD at float64 rounding.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from stiefax.experiments.arms import ARMS
from stiefax.experiments.flags import CommandError
from stiefax.experiments.flags import check_seeds

if TYPE_CHECKING:
  import optax

#: Violations below this are float64 rounding: the update is equivariant.
EQUIVARIANT_BELOW = 1e-10


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--seed", type=int, default=0, help="random draw of A, W_0 and Q")
  parser.add_argument("--steps", type=int, default=15, help="updates T (default 15)")
  parser.add_argument("--rotations", type=int, default=5, help="random Q; the worst is shown")
  parser.add_argument("--d", type=int, default=24, help="rows of each frame")
  parser.add_argument("--r", type=int, default=6, help="columns of each frame")
  parser.add_argument("--heads", type=int, default=3, help="frames per kernel")
  parser.add_argument("--adamw-lr", type=float, default=1e-2, help="AdamW rate (decay 0)")
  parser.add_argument(
    "--naive-lr", type=float, default=0.03, help="elementwise Riemannian Adam rate"
  )
  parser.add_argument("--lr", type=float, default=1.0, help="corrected Riemannian Adam rate")
  parser.add_argument("--sgd-lr", type=float, default=0.02, help="Riemannian SGD rate")


def optimizers(args: argparse.Namespace) -> list[tuple[str, optax.GradientTransformation]]:
  """The rows of Table 9: (name, transform)."""
  from stiefax.experiments import optim  # JAX: here, not by `stiefax equivariance --help`

  return [
    ("AdamW (decay 0)", optim.make_optimizer(ARMS["A2"], optim.Hyper(adamw_lr=args.adamw_lr))),
    (
      "Riemannian Adam, elementwise v",
      optim.frame_rule(ARMS["elementwise"], optim.Hyper(frame_lr=args.naive_lr)),
    ),
    ("Riemannian Adam, scalar v (B2)", optim.frame_rule(ARMS["B2"], optim.Hyper(frame_lr=args.lr))),
    ("Riemannian SGD (PA16)", optim.frame_rule(ARMS["B2-SGD"], optim.Hyper(frame_lr=args.sgd_lr))),
  ]


def run(args: argparse.Namespace) -> int:
  check_seeds([args.seed], "--seed")
  if min(args.steps, args.rotations, args.heads, args.r) < 1:
    raise CommandError("--steps, --rotations, --heads and --r must all be >= 1")
  if args.r > args.d:
    raise CommandError(f"--r {args.r} exceeds --d {args.d}; a frame needs r <= d")
  import jax  # here, not by `stiefax equivariance --help`

  from stiefax.diagnostics import equivariance_violation

  key = jax.random.key(args.seed)
  print(
    f"Table 9: max|W_T^(Q) - Q^T W_T|, worst of {args.rotations} rotations,"
    f" f(W) = -tr(W^T A W), d={args.d}, r={args.r}, H={args.heads},"
    f" T={args.steps}, float64"
  )
  header = f"{'optimizer':34s} {'violation':>10s}  equivariant"
  print(header)
  print("-" * len(header))
  with jax.enable_x64(True):
    for name, tx in optimizers(args):
      v = float(
        equivariance_violation(
          tx,
          key=key,
          d=args.d,
          r=args.r,
          heads=args.heads,
          steps=args.steps,
          rotations=args.rotations,
        )
      )
      print(f"{name:34s} {v:10.2e}  {'yes' if v < EQUIVARIANT_BELOW else 'no'}")
  return 0
