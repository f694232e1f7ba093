"""Covariance of optimizers under parameter symmetries (the paper's Table 9 generalized).

For each optimizer and each action phi (left O(d) and right O(r) rotation of every
frame, positive rescaling of the parameters, rescaling of the loss) the table gives

    max_t max |phi(theta_t) - theta'_t|,

where theta_t trains the loss l from theta_0 and theta'_t trains l' = l o phi^{-1}
from phi(theta_0) with the same optimizer: zero (float64 rounding) when the optimizer
is covariant. Two problems on H frames of St(d, r): "brockett",
f(W) = -sum_h tr(W_h^T A W_h N) with A symmetric and N = diag(r, ..., 1) / r, and
"qk-norm", the same function of the normalized frames sqrt(r) W_h / ||W_h||_F, which
every positive rescaling of a frame leaves invariant. Runs in float64.

With --elr-steps N it also trains a toy linen attention model for N minibatch steps
with B2 (stiefax.stiefel_adamw), with B2 at lr_R = 10 and with AdamW, and prints the
effective learning rate ||Delta - radial w|| / ||w|| of the query/key frames and of
the other parameters (docs/covariance.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import time
from typing import TYPE_CHECKING
from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence
from typing import cast

import numpy as np

from stiefax.experiments import store
from stiefax.experiments.arms import ARMS
from stiefax.experiments.flags import CommandError
from stiefax.experiments.flags import check_seeds

if TYPE_CHECKING:
  import jax
  import optax

  from stiefax import covariance as cov

# JAX, Flax, Optax and the library are imported by the functions that compute, not by
# `stiefax covariance --help`.


def _optimizer(name: str) -> optax.GradientTransformation:
  """The transform of :data:`OPTIMIZERS` ``name``."""
  import optax

  import stiefax
  from stiefax.experiments import optim

  if name == "adamw":
    return optim.make_optimizer(
      ARMS["A2"], optim.Hyper(adamw_lr=1e-2, weight_decay=0.1, adamw_eps=0.0)
    )
  if name == "adam":
    return optax.adam(1e-2, eps=0.0)
  if name == "sgd":
    return optax.sgd(1e-2)
  if name == "radam":
    return optim.frame_rule(ARMS["B2"], optim.Hyper(frame_lr=1.0, eps=0.0))
  if name == "radam-elementwise":
    return optim.frame_rule(ARMS["elementwise"], optim.Hyper(frame_lr=0.03, eps=0.0))
  if name == "rsgd":
    return optim.frame_rule(ARMS["B2-SGD"], optim.Hyper(frame_lr=0.02))
  # The published Hyperball, one sphere per head frame (stiefax.hyperball).
  if name == "adamh":
    return stiefax.hyperball(optax.scale_by_adam(eps=0.0), 1e-2, frames=stiefax.layouts.qk_frames())
  if name == "muonh":
    return stiefax.hyperball(
      optax.contrib.scale_by_muon(
        eps=0.0,
        weight_dimension_numbers=stiefax.layouts.muon_dimension_numbers(
          stiefax.layouts.qk_frames()
        ),
      ),
      1e-2,
      frames=stiefax.layouts.qk_frames(),
    )
  return stiefax.sphere.sphere_adam(1.0, eps=0.0)  # hyperball


#: name -> (label, factory). Adam-type rules use eps = 0 so that loss scaling is exact.
OPTIMIZERS: dict[str, tuple[str, Callable[[], optax.GradientTransformation]]] = {
  name: (label, functools.partial(_optimizer, name))
  for name, label in (
    ("adamw", "optax.adamw(1e-2, wd 0.1)"),
    ("adam", "optax.adam(1e-2)"),
    ("sgd", "optax.sgd(1e-2)"),
    ("radam", "riemannian_adam (B2)"),
    ("radam-elementwise", "riemannian_adam elementwise"),
    ("rsgd", "riemannian_sgd (PA16)"),
    ("hyperball", "sphere_adam"),
    ("adamh", "hyperball over Adam"),
    ("muonh", "hyperball over Muon"),
  )
}

#: Optimizers whose points live on St(d, r).
STIEFEL_OPTIMIZERS = ("radam", "radam-elementwise", "rsgd")

ACTIONS = ("left", "right", "rescale", "loss")
PROBLEMS = ("brockett", "qk-norm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--steps", type=int, default=15, help="training steps T (default 15)")
  parser.add_argument("--heads", type=int, default=3, help="frames H (default 3)")
  parser.add_argument("--d", type=int, default=24, help="rows d of each frame (default 24)")
  parser.add_argument("--r", type=int, default=6, help="columns r of each frame (default 6)")
  parser.add_argument(
    "--trials",
    type=int,
    default=3,
    help="random draws of the action; the worst is reported (default 3)",
  )
  parser.add_argument(
    "--scale", type=float, default=3.0, help="factor c of the parameter rescaling (default 3)"
  )
  parser.add_argument(
    "--loss-scale",
    type=float,
    default=100.0,
    help="factor c of the loss scaling l' = c l (default 100)",
  )
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--optimizers",
    default=",".join(OPTIMIZERS),
    help=f"comma-separated subset of {','.join(OPTIMIZERS)}",
  )
  parser.add_argument(
    "--actions", default=",".join(ACTIONS), help=f"comma-separated subset of {','.join(ACTIONS)}"
  )
  parser.add_argument(
    "--problems", default=",".join(PROBLEMS), help=f"comma-separated subset of {','.join(PROBLEMS)}"
  )
  parser.add_argument(
    "--elr-steps",
    type=int,
    default=0,
    help="also train the toy attention model this many steps and"
    " print the effective learning rates (default 0: skip)",
  )
  parser.add_argument(
    "--json", default=None, metavar="PATH", help="also write the results to this JSON file"
  )


def _subset(value: str, valid: Sequence[str], what: str) -> list[str]:
  names = [v.strip() for v in value.split(",") if v.strip()]
  bad = [n for n in names if n not in valid]
  if bad or not names:
    raise CommandError(
      f"unknown {what} {', '.join(map(repr, bad)) or '(none given)'}; choose from"
      f" {', '.join(valid)}"
    )
  return names


def _random_orthogonal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
  """Haar-random orthonormal columns, ``shape = (..., n, k)``."""
  q, rr = np.linalg.qr(rng.standard_normal(shape))
  return q * np.sign(np.diagonal(rr, axis1=-2, axis2=-1))[..., None, :]


def make_problem(
  name: str, heads: int, d: int, r: int, rng: np.random.Generator
) -> tuple[Callable[[jax.Array], jax.Array], jax.Array]:
  """``(loss_fn, theta_0)`` for a problem on a ``(d, heads, r)`` kernel of frames."""
  import jax.numpy as jnp

  g = rng.standard_normal((d, d))
  a = jnp.asarray((g + g.T) / 2)
  n = jnp.asarray(np.arange(r, 0, -1, dtype=np.float64) / r)
  w0 = jnp.asarray(np.transpose(_random_orthogonal(rng, (heads, d, r)), (1, 0, 2)))

  def brockett(w: jax.Array) -> jax.Array:
    return -jnp.einsum("dhr,de,ehr,r->", w, a, w, n)

  if name == "brockett":
    return brockett, w0

  def qk_norm(w: jax.Array) -> jax.Array:
    norms = jnp.sqrt(jnp.sum(w * w, axis=(0, 2), keepdims=True))
    return brockett(math.sqrt(r) * w / norms)

  return qk_norm, w0


def _action(name: str, args: argparse.Namespace, rng: np.random.Generator) -> cov.Action:
  import jax.numpy as jnp

  from stiefax import covariance as cov

  if name == "left":
    return cov.left_rotation(jnp.asarray(_random_orthogonal(rng, (args.d, args.d))))
  if name == "right":
    return cov.right_rotation(jnp.asarray(_random_orthogonal(rng, (args.r, args.r))))
  if name == "rescale":
    return cov.rescale(args.scale)
  return cov.gradient_scale(args.loss_scale)


def _header(name: str, args: argparse.Namespace) -> str:
  return {
    "left": "left O(d)",
    "right": "right O(r)",
    "rescale": f"rescale x{args.scale:g}",
    "loss": f"loss x{args.loss_scale:g}",
  }[name]


def covariance_table(
  args: argparse.Namespace,
  optimizers: Sequence[str],
  actions: Sequence[str],
  problems: Sequence[str],
) -> dict[str, Any]:
  """``{problem: {optimizer: {action: violation or None}}}`` in float64."""
  import jax

  from stiefax import covariance as cov

  results: dict[str, Any] = {}
  with jax.enable_x64(True):
    for p_index, problem in enumerate(problems):
      rng = np.random.default_rng([args.seed, p_index])
      loss_fn, w0 = make_problem(problem, args.heads, args.d, args.r, rng)
      # One set of draws per problem, shared by every optimizer.
      draws = {
        a: [_action(a, args, rng) for _ in range(args.trials if a in ("left", "right") else 1)]
        for a in actions
      }
      table = {}
      for opt in optimizers:
        row: dict[str, Optional[float]] = {}
        for a in actions:
          if a == "rescale" and opt in STIEFEL_OPTIMIZERS:
            row[a] = None  # c W leaves St(d, r): no rescaled counterpart.
            continue
          worst = 0.0
          for act in draws[a]:
            v = float(cov.covariance_violation(OPTIMIZERS[opt][1](), loss_fn, w0, act, args.steps))
            worst = max(worst, v) if math.isfinite(v) else math.inf
          row[a] = worst
        table[opt] = row
      results[problem] = table
  return results


def _fmt(v: Optional[float]) -> str:
  if v is None:
    return "n/a"
  if not math.isfinite(v):
    return "diverged"
  return f"{v:.1e}"


def print_table(
  results: dict[str, Any],
  args: argparse.Namespace,
  optimizers: Sequence[str],
  actions: Sequence[str],
) -> None:
  desc = {
    "brockett": "f(W) = -sum_h tr(W_h^T A W_h N)",
    "qk-norm": "f(sqrt(r) W_h / ||W_h||_F): invariant under rescaling each frame",
  }
  width = max(len(OPTIMIZERS[o][0]) for o in optimizers) + 2
  for problem, table in results.items():
    print(f"problem {problem}: {desc[problem]}")
    print(
      f"  H={args.heads} frames in St({args.d}, {args.r}), T={args.steps} steps,"
      f" float64, max_t max|phi(theta_t) - theta'_t|"
      f" (rotations: worst of {args.trials} draws)"
    )
    print("  " + "optimizer".ljust(width) + "".join(_header(a, args).rjust(14) for a in actions))
    for opt in optimizers:
      cells = "".join(_fmt(table[opt][a]).rjust(14) for a in actions)
      print("  " + OPTIMIZERS[opt][0].ljust(width) + cells)
    print()
  print(
    "eps = 0 for every Adam-type rule. n/a: c W leaves St(d, r), so the"
    " Stiefel optimizers have no rescaled counterpart."
  )


# ----------------------------------------------------------------------------
# Effective learning rate on a toy attention model.
# ----------------------------------------------------------------------------


def elr_trace(
  steps: int, seed: int = 0, n: int = 1024, batch: int = 64, noise: float = 0.5
) -> dict[str, Any]:
  """Trains a toy attention regression with B2 and with AdamW, recording ELRs.

  The student is ``Dense(MultiHeadDotProductAttention(x) + x)`` with d_model 16,
  2 heads of head_dim 8 (frames in St(16, 8), so tau sqrt(r) = 0.28); the target is
  the output of a random teacher of the same architecture on ``n`` sequences of 8
  tokens plus Gaussian noise of standard deviation ``noise`` (so the loss does not go
  to zero and the gradients stay stochastic), trained on minibatches of ``batch``
  with mean squared error. Every arm starts from the same point with orthonormal
  query/key frames and uses AdamW (lr 1e-2, weight decay 0.05 on rank >= 2 tensors)
  for the other parameters; the frames get ``riemannian_adam(1.0)`` (B2: lr_R 1.0,
  tau 0.1, eps 1e-8), ``riemannian_adam(10.0)`` or the same AdamW.

  Returns:
    ``{"steps": [...], "tau": 0.1, "arms": {arm: {stat: [...]}}}``.
  """
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import optax

  import stiefax
  from stiefax import elr
  from stiefax.experiments import optim

  class Toy(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
      h = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=16)(x)
      return nn.Dense(x.shape[-1])(h + x)

  model = Toy()
  kx, kt, ks, kn = jax.random.split(jax.random.key(seed), 4)
  x = jax.random.normal(kx, (n, 8, 16))
  clean: Any = model.apply(model.init(kt, x[:1]), x)
  y = clean + noise * jax.random.normal(kn, x.shape)
  params0 = stiefax.flax.project_params(model.init(ks, x[:1]), stiefax.layouts.qk_labels)
  labels = stiefax.layouts.qk_labels(params0)
  frames = stiefax.FrameSpec()
  tau = 0.1

  def loss_fn(p: optax.Params, xb: jax.Array, yb: jax.Array) -> jax.Array:
    pred = cast(jax.Array, model.apply(p, xb))  # no mutable collections: the output alone
    return jnp.mean(jnp.square(pred - yb))

  def frame_norm(p: optax.Params) -> jax.Array:
    """Mean ||W_h||_F / sqrt(r) over the query/key frames (1 on St(d, r))."""
    ws = [
      frames.to_frames(w)
      for w, lab in zip(jax.tree.leaves(p), jax.tree.leaves(labels))
      if lab == "stiefel"
    ]
    return jnp.mean(
      jnp.stack([jnp.mean(jnp.sqrt(jnp.sum(w * w, axis=(-2, -1)) / w.shape[-1])) for w in ws])
    )

  hyper = optim.Hyper(adamw_lr=1e-2, frame_lr=1.0, weight_decay=0.05, max_norm=tau)
  arms = {
    "B2": optim.make_optimizer(ARMS["B2"], hyper),
    "B2 lr_R=10": optim.make_optimizer(ARMS["B2"], dataclasses.replace(hyper, frame_lr=10.0)),
    "AdamW": optim.make_optimizer(ARMS["A2"], hyper),
  }
  out: dict[str, Any] = {"steps": list(range(1, steps + 1)), "tau": tau, "arms": {}}
  for arm, tx in arms.items():

    @jax.jit
    def step(
      params: optax.Params,
      state: optax.OptState,
      xb: jax.Array,
      yb: jax.Array,
      tx: optax.GradientTransformation = tx,
    ) -> tuple[optax.Params, optax.OptState, dict[str, jax.Array]]:
      loss, g = jax.value_and_grad(loss_fn)(params, xb, yb)
      u, state = tx.update(g, state, params)
      new = optax.apply_updates(params, u)
      stats = elr.update_summary(params, new, labels, frames)
      stats["loss"] = loss
      stats["frames/norm"] = frame_norm(new)
      stats["isometry"] = stiefax.diagnostics.isometry_error(new, labels)
      return new, state, stats

    rng = np.random.default_rng(seed)
    params, state = params0, tx.init(params0)
    trace: dict[str, list] = {}
    for _ in range(steps):
      idx = rng.choice(n, size=min(batch, n), replace=False)
      params, state, stats = step(params, state, x[idx], y[idx])
      for k, v in stats.items():
        trace.setdefault(k, []).append(float(v))
    out["arms"][arm] = trace
  return out


def print_elr(trace: dict[str, Any]) -> None:
  steps = trace["steps"]
  tau = trace["tau"]
  shown = [s for s in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if s <= len(steps)]
  if steps and steps[-1] not in shown:
    shown.append(steps[-1])
  print(
    "effective learning rate ||Delta - radial w|| / ||w|| on the toy attention model"
    f" (mean over frames / leaves; tau = {tau}):"
  )
  cols = [
    ("frames/elr", "q/k ELR"),
    ("frames/norm", "q/k |W|/vr"),
    ("matrices/elr", "other ELR"),
    ("loss", "loss"),
  ]
  print("  " + "arm".ljust(12) + "step".rjust(6) + "".join(c[1].rjust(12) for c in cols))
  for arm, t in trace["arms"].items():
    for s in shown:
      cells = "".join(f"{t[k][s - 1]:.4g}".rjust(12) for k, _ in cols)
      print("  " + arm.ljust(12) + str(s).rjust(6) + cells)
  print()
  for arm, t in trace["arms"].items():
    elr = np.asarray(t["frames/elr"])
    other = np.asarray(t["matrices/elr"])
    norm = np.asarray(t["frames/norm"])
    bind = np.mean(elr >= 0.97 * tau)
    print(
      f"  {arm}: q/k ELR in [{elr.min():.3g}, {elr.max():.3g}], median {np.median(elr):.3g},"
      f" >= 0.97 tau on {100 * bind:.0f}% of steps; |W|/sqrt(r) in"
      f" [{norm.min():.3g}, {norm.max():.3g}]; other matrices' ELR in"
      f" [{other.min():.3g}, {other.max():.3g}]; isometry error <= {max(t['isometry']):.1e}"
    )


def run(args: argparse.Namespace) -> int:
  check_seeds([args.seed], "--seed")
  optimizers = _subset(args.optimizers, tuple(OPTIMIZERS), "optimizer")
  actions = _subset(args.actions, ACTIONS, "action")
  problems = _subset(args.problems, PROBLEMS, "problem")
  for name in ("steps", "heads", "d", "r", "trials"):
    if getattr(args, name) < 1:
      raise CommandError(f"--{name} must be >= 1, got {getattr(args, name)}")
  if args.r > args.d:
    raise CommandError(f"--r {args.r} exceeds --d {args.d}: a Stiefel frame needs r <= d")
  if not (args.scale > 0 and args.loss_scale > 0):
    raise CommandError(
      f"--scale and --loss-scale must be positive, got {args.scale}, {args.loss_scale}"
    )
  if args.elr_steps < 0:
    raise CommandError(f"--elr-steps must be >= 0, got {args.elr_steps}")
  start = time.perf_counter()
  results = covariance_table(args, optimizers, actions, problems)
  print_table(results, args, optimizers, actions)
  out: dict[str, Any] = {"covariance": results, "config": vars(args).copy()}
  if args.elr_steps:
    print()
    trace = elr_trace(args.elr_steps, args.seed)
    print_elr(trace)
    out["elr"] = trace
  print(f"({time.perf_counter() - start:.1f} s)")
  if args.json:
    text = json.dumps(out, indent=1, default=str)
    try:
      store.atomic_write(args.json, lambda f: f.write(text), binary=False)
    except OSError as e:
      raise CommandError(f"cannot write --json {args.json}: {e.strerror}") from e
  return 0
