"""Modular-arithmetic grokking, c = (a + b) mod 97 (paper sections 4.3 and 4.4).

The model and task are the paper's: the sequence (a, b, =) with a one-hot 98 x 128
token embedding plus learned positions, a 2-layer, 4-head, d=128, r=32 pre-LN encoder
(FFN 4x with ReLU, no causal mask, a final LayerNorm), readout
concat(3 x 128) -> 128 -> ReLU -> 97; 40% of the 97^2 pairs (3 764) train as one full
batch, the other 5 645 are held out. AdamW lr 1e-3, weight decay 1.0 on matrices,
b2 0.999, no warm-up; the Riemannian rate is 1.0 (constant), tau 0.1, eps 1e-3.

Arms (they differ only in how W_Q, W_K are treated, except where noted):
  A2       AdamW everywhere, decay on every matrix including W_Q, W_K
  B2       Riemannian Adam on W_Q, W_K (stiefel_adamw + riemannian_adam(1.0, eps=1e-3))
  B2m      tangent projection + elementwise Adam at the AdamW rate, no step cap
  B2m-can  as B2m with the canonical-metric gradient
  B2-frz   W_Q, W_K frozen at their orthonormal initialization
  A2-nwf   A2 without decay on W_Q, W_K (plain Adam there, no constraint)
  B2-hi    B2 with circuit weight decay 2.0
  B2-sn    B2 with every circuit matrix initialized at 0.1x its default scale
  B2-comb  B2-hi and B2-sn together
  B2-mmuon manifold Muon on W_Q, W_K (stiefax.manifold_muon, rate 0.05)
  A2-muon  optax.contrib.muon on W_Q, W_K (rate 0.02, decayed), unconstrained
  B2-qr    B2 with the sign-fixed QR retraction
  B2-cayley B2 with the Cayley retraction
Stiefel arms start from the polar factor of the default W_Q, W_K initialization;
every other parameter, and the train/held-out split, are shared by all arms of a seed.

Presets:
  quick (default)  A2,B2 at seed 0, 200 epochs, evaluation every 20. The paper's
                   model, task and optimizers; only the epoch budget is cut (the
                   paper: 20 000 epochs), which is enough to see memorization
                   (train accuracy >= 0.99 by epoch ~100) and the isometry contrast
                   (A2 far above 1e-2, B2 at float32 rounding), not grokking.
                   Measured: 5 minutes on a 2-core CPU shared with other heavy
                   jobs (about 2.3 CPU-minutes of work).
  paper            the exact configuration: 20 000 epochs, evaluation every 100
                   (about 95 minutes per arm on a 2-core CPU).
--stabilize runs the Power et al. setting (b2 0.98 and a 10-step linear warm-up, for
the AdamW and the Riemannian rate alike).

Each run writes OUT/<arm>[-stab]_seed<seed>.json; `stiefax report OUT` prints the
paper-style tables (memorized / grokked / sustained k/n, tail means, paired
differences against A2) and writes PNG plots.

Examples:
  stiefax grok
  stiefax grok --preset paper --arms A2,B2,B2m,B2m-can,B2-frz --seeds 0
  stiefax grok --preset paper --arms A2,B2,B2-frz --seeds 0,1,2,3,4 --stabilize
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import pathlib
import sys
import time
from typing import Any, Optional, Sequence

import numpy as np

from stiefax.experiments.cli import CommandError, writable_dir

# ----------------------------------------------------------------------------
# Configuration.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GrokConfig:
  """Everything that defines a grokking run except the arm and the seed."""

  modulus: int = 97  # p: c = (a + b) mod p; the vocabulary is p + 1 (the "=" token)
  train_fraction: float = 0.4  # share of the p^2 pairs used as the full training batch
  d_model: int = 128
  num_heads: int = 4
  head_dim: int = 32  # r: each head's W_Q, W_K is a frame in St(d_model, head_dim)
  num_layers: int = 2
  ffn_mult: int = 4
  readout_hidden: int = 128
  learning_rate: float = 1e-3  # AdamW rate (also B2m's frame rate)
  weight_decay: float = 1.0  # decoupled decay on matrices (rank >= 2)
  b1: float = 0.9
  b2: float = 0.999
  warmup: int = 0  # linear warm-up steps of every rate (0: constant)
  riemannian_lr: float = 1.0  # eta_R of the Riemannian Adam
  tau: float = 0.1  # step cap ||eta||_F <= tau sqrt(r)
  riemannian_eps: float = 1e-3  # eps of the Riemannian Adam
  epochs: int = 20_000  # full-batch steps
  eval_every: int = 100
  memorize_threshold: float = 0.99
  grok_threshold: float = 0.95
  sustain_k: int = 3  # consecutive evaluations >= grok_threshold
  tail_fraction: float = 0.25  # tail mean over the final quarter of the run


PAPER = GrokConfig()
STABILIZED = dict(b2=0.98, warmup=10)  # Power et al. (2022)

PRESETS = {
    "quick": dict(config=dataclasses.replace(PAPER, epochs=200, eval_every=20),
                  arms=("A2", "B2"), seeds=(0,)),
    "paper": dict(config=PAPER, arms=("A2", "B2"), seeds=(0,)),
}


@dataclasses.dataclass(frozen=True)
class Arm:
  """How an arm treats W_Q, W_K (``rule``) and the circuit (decay, init scale)."""

  description: str
  rule: str  # "adamw" | "riemannian" | "elementwise" | "elementwise-canonical" | "frozen" | "adam"
  # | "riemannian-qr" | "riemannian-cayley" | "mmuon" | "muon"
  orthonormal: bool = True  # start W_Q, W_K on the manifold
  weight_decay: Optional[float] = None  # circuit decay (None: the config's)
  circuit_init_scale: float = 1.0  # multiplies every non-frame matrix at init


ARMS = {
    "A2": Arm("AdamW everywhere (decay on W_Q, W_K too)", "adamw", orthonormal=False),
    "B2": Arm("Riemannian Adam on W_Q, W_K", "riemannian"),
    "B2m": Arm("tangent projection + elementwise Adam, no cap", "elementwise"),
    "B2m-can": Arm("B2m with the canonical gradient", "elementwise-canonical"),
    "B2-frz": Arm("W_Q, W_K frozen at orthonormal init", "frozen"),
    "A2-nwf": Arm("A2 without decay on W_Q, W_K", "adam", orthonormal=False),
    "B2-hi": Arm("B2 with circuit decay 2.0", "riemannian", weight_decay=2.0),
    "B2-sn": Arm("B2 with circuit init 0.1x", "riemannian", circuit_init_scale=0.1),
    "B2-comb": Arm("B2-hi + B2-sn", "riemannian", weight_decay=2.0, circuit_init_scale=0.1),
    "B2-mmuon": Arm("manifold Muon on W_Q, W_K (rate 0.05)", "mmuon"),
    "A2-muon": Arm("optax.contrib.muon on W_Q, W_K (rate 0.02), unconstrained", "muon",
                   orthonormal=False),
    "B2-qr": Arm("B2 with the QR retraction", "riemannian-qr"),
    "B2-cayley": Arm("B2 with the Cayley retraction", "riemannian-cayley"),
}
# Frame rates of the optimizer-family arms (grok has no rate selection).
MMUON_LR, MUON_LR = 0.05, 0.02

# ----------------------------------------------------------------------------
# Metrics on an evaluation history (epochs ascending).
# ----------------------------------------------------------------------------


def first_epoch(epochs: Sequence[int], values: Sequence[float], threshold: float) -> Optional[int]:
  """The first evaluated epoch with ``value >= threshold`` (``None`` if never).

  >>> first_epoch([0, 100, 200], [0.1, 0.99, 0.5], 0.99)
  100
  """
  for e, v in zip(epochs, values):
    if v >= threshold:
      return int(e)
  return None


def memorized_epoch(epochs, train_acc, threshold: float = 0.99) -> Optional[int]:
  """First evaluated epoch with training accuracy ``>= threshold``."""
  return first_epoch(epochs, train_acc, threshold)


def grokked_epoch(epochs, test_acc, threshold: float = 0.95) -> Optional[int]:
  """First evaluated epoch with held-out accuracy ``>= threshold`` (single crossing)."""
  return first_epoch(epochs, test_acc, threshold)


def sustained_epoch(epochs, test_acc, threshold: float = 0.95, k: int = 3) -> Optional[int]:
  """First epoch from which held-out accuracy stays ``>= threshold`` for ``k`` evaluations.

  The paper's sustained metric (section 4.4): a single spike does not count.

  >>> sustained_epoch([0, 100, 200, 300, 400], [0.96, 0.1, 0.97, 0.98, 0.99], k=3)
  200
  """
  if k < 1:
    raise ValueError(f"sustained_epoch: k={k} must be >= 1.")
  run = 0
  for i, v in enumerate(test_acc):
    run = run + 1 if v >= threshold else 0
    if run == k:
      return int(epochs[i - k + 1])
  return None


def tail_mean(epochs, values, fraction: float = 0.25) -> float:
  """Mean of ``values`` over the evaluations in the final ``fraction`` of the run.

  Evaluations at epochs ``>= (1 - fraction) * last_epoch`` count: for 20 000 epochs,
  epochs 15 000-20 000 (the paper's tail window).

  >>> tail_mean([0, 100, 200, 300, 400], [0.0, 0.0, 0.0, 0.5, 1.0])
  0.75
  """
  epochs = np.asarray(epochs, np.float64)
  values = np.asarray(values, np.float64)
  if epochs.size == 0:
    return float("nan")
  keep = epochs >= (1.0 - fraction) * epochs[-1]
  return float(np.mean(values[keep]))


def run_metrics(history: dict, config: GrokConfig) -> dict:
  """The per-run metrics of the paper from an evaluation history."""
  ep, tr, te, iso = (history[k] for k in ("epoch", "train_acc", "test_acc", "isometry"))
  return {
      "memorized_epoch": memorized_epoch(ep, tr, config.memorize_threshold),
      "grokked_epoch": grokked_epoch(ep, te, config.grok_threshold),
      "sustained_epoch": sustained_epoch(ep, te, config.grok_threshold, config.sustain_k),
      "end_train_acc": float(tr[-1]),
      "end_test_acc": float(te[-1]),
      "tail_test_acc": tail_mean(ep, te, config.tail_fraction),
      "initial_isometry": float(iso[0]),
      "final_isometry": float(iso[-1]),
      "max_isometry": float(np.max(iso)),
      "max_isometry_after_init": float(np.max(iso[1:])) if len(iso) > 1 else float(iso[0]),
  }


# ----------------------------------------------------------------------------
# Data and model.
# ----------------------------------------------------------------------------


def make_data(config: GrokConfig, seed: int) -> dict:
  """All ``p^2`` sequences ``(a, b, =)`` and labels, split by ``seed``."""
  p = config.modulus
  a, b = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
  a, b = a.ravel(), b.ravel()
  x = np.stack([a, b, np.full_like(a, p)], axis=1).astype(np.int32)
  y = ((a + b) % p).astype(np.int32)
  n_train = int(round(config.train_fraction * p * p))
  if not 0 < n_train < p * p:
    raise CommandError(
        f"train_fraction {config.train_fraction} leaves {n_train} of {p * p} pairs for"
        " training; it must leave at least one pair on each side."
    )
  perm = np.random.default_rng(seed).permutation(p * p)
  tr, te = perm[:n_train], perm[n_train:]
  return {"x_train": x[tr], "y_train": y[tr], "x_test": x[te], "y_test": y[te]}


@functools.lru_cache(maxsize=None)
def _model(config: GrokConfig):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  class Block(nn.Module):
    """Pre-LN encoder block: x + MHA(LN(x)), then x + FFN(LN(x)); no mask."""

    @nn.compact
    def __call__(self, x):
      h = nn.LayerNorm(name="ln_attn")(x)
      h = nn.MultiHeadDotProductAttention(
          num_heads=config.num_heads,
          qkv_features=config.num_heads * config.head_dim,
          out_features=config.d_model,
          name="attn",
      )(h)
      x = x + h
      h = nn.LayerNorm(name="ln_ffn")(x)
      h = nn.Dense(config.ffn_mult * config.d_model, name="ffn_in")(h)
      h = nn.Dense(config.d_model, name="ffn_out")(nn.relu(h))
      return x + h

  class GrokTransformer(nn.Module):
    """(a, b, =) -> logits over c; readout concat(3 x d) -> hidden -> ReLU -> p."""

    @nn.compact
    def __call__(self, tokens):
      x = nn.Embed(config.modulus + 1, config.d_model, name="token_embed")(tokens)
      pos = nn.Embed(tokens.shape[-1], config.d_model, name="pos_embed")(
          jnp.arange(tokens.shape[-1]))
      x = x + pos[None]
      for i in range(config.num_layers):
        x = Block(name=f"block_{i}")(x)
      x = nn.LayerNorm(name="ln_final")(x)
      x = x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))
      x = nn.relu(nn.Dense(config.readout_hidden, name="readout_hidden")(x))
      return nn.Dense(config.modulus, name="readout_out")(x)

  return GrokTransformer()


def _query_labels(params):
  import stiefax  # pylint: disable=g-import-not-at-top

  return stiefax.flax.qk_labels(params, modules=("query",))


def _key_labels(params):
  import stiefax  # pylint: disable=g-import-not-at-top

  return stiefax.flax.qk_labels(params, modules=("key",))


@functools.lru_cache(maxsize=None)
def _jitted_init(config: GrokConfig):
  import jax  # pylint: disable=g-import-not-at-top

  return jax.jit(_model(config).init)


def init_params(config: GrokConfig, arm: Arm, seed: int):
  """The arm's starting point: the seed's default init, frames snapped if Stiefel."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import stiefax  # pylint: disable=g-import-not-at-top

  params = _jitted_init(config)(jax.random.key(seed), jnp.zeros((1, 3), jnp.int32))
  labels = stiefax.flax.qk_labels(params)
  if arm.circuit_init_scale != 1.0:
    s = arm.circuit_init_scale
    params = jax.tree.map(
        lambda lab, w: w * jnp.asarray(s, w.dtype) if lab != "stiefel" and w.ndim >= 2 else w,
        labels, params)
  if arm.orthonormal:
    params = stiefax.flax.project_params(params, labels)
  return params


def make_optimizer(config: GrokConfig, arm: Arm):
  """The arm's optimizer for the whole model (an ``optax.GradientTransformation``)."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import stiefax  # pylint: disable=g-import-not-at-top

  def rate(value):
    if config.warmup > 0 and value > 0:
      return optax.warmup_constant_schedule(0.0, value, config.warmup)
    return value

  lr = rate(config.learning_rate)
  wd = config.weight_decay if arm.weight_decay is None else arm.weight_decay
  b1, b2 = config.b1, config.b2
  if arm.rule == "adamw":
    return optax.adamw(lr, b1=b1, b2=b2, weight_decay=wd,
                       mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
  frames = {
      "riemannian": lambda: stiefax.riemannian_adam(
          rate(config.riemannian_lr), b1, b2, eps=config.riemannian_eps, max_norm=config.tau),
      "elementwise": lambda: stiefax.riemannian_adam(
          lr, b1, b2, moment="elementwise", max_norm=None),
      "elementwise-canonical": lambda: stiefax.riemannian_adam(
          lr, b1, b2, moment="elementwise", max_norm=None, projector="canonical"),
      "frozen": optax.set_to_zero,
      "adam": lambda: optax.adam(lr, b1=b1, b2=b2),
      "riemannian-qr": lambda: stiefax.riemannian_adam(
          rate(config.riemannian_lr), b1, b2, eps=config.riemannian_eps, max_norm=config.tau,
          retraction="qr"),
      "riemannian-cayley": lambda: stiefax.riemannian_adam(
          rate(config.riemannian_lr), b1, b2, eps=config.riemannian_eps, max_norm=config.tau,
          retraction="cayley"),
      "mmuon": lambda: stiefax.manifold_muon(rate(MMUON_LR)),
      # (d, heads, r) kernels: reduce over d, one matrix per head; decayed like A2.
      "muon": lambda: optax.contrib.muon(
          rate(MUON_LR), weight_decay=wd,
          muon_weight_dimension_numbers=lambda p: jax.tree.map(
              lambda _: optax.contrib.MuonDimensionNumbers(0, 2), p)),
  }[arm.rule]()
  return stiefax.stiefel_adamw(lr, wd, b1=b1, b2=b2, stiefel=frames)


# ----------------------------------------------------------------------------
# Training.
# ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _programs(config: GrokConfig, arm: Arm):
  """Jitted ``(init_state, train_chunk, evaluate)``, shared by every seed of an arm.

  ``train_chunk`` is one compiled program: ``jax.lax.scan`` over ``eval_every``
  full-batch steps, followed by the evaluation.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import stiefax  # pylint: disable=g-import-not-at-top

  model = _model(config)
  tx = make_optimizer(config, arm)

  def loss_and_acc(params, x, y):
    logits = model.apply(params, x)
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))
    acc = jnp.mean((jnp.argmax(logits, axis=-1) == y).astype(jnp.float32))
    return loss, acc

  def evaluate(params, data):
    loss, train_acc = loss_and_acc(params, data["x_train"], data["y_train"])
    _, test_acc = loss_and_acc(params, data["x_test"], data["y_test"])
    return {
        "train_loss": loss,
        "train_acc": train_acc,
        "test_acc": test_acc,
        "isometry": stiefax.diagnostics.isometry_error(params, _query_labels),
        "isometry_key": stiefax.diagnostics.isometry_error(params, _key_labels),
    }

  def step(carry, _):
    params, opt_state, data = carry
    loss_fn = lambda p: loss_and_acc(p, data["x_train"], data["y_train"])[0]
    grads = jax.grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    # Effective learning rate per group (W_Q/W_K frames, other matrices, vectors),
    # keeping the parameter/update inner product (stiefax.covariance).
    summary = stiefax.covariance.update_summary(params, new_params, stiefax.flax.qk_labels)
    elr = {f"elr_{k.split('/')[0]}": v for k, v in summary.items() if k.endswith("/elr")}
    return (new_params, opt_state, data), elr

  def train_chunk(params, opt_state, data):
    (params, opt_state, _), elr = jax.lax.scan(
        step, (params, opt_state, data), None, length=config.eval_every)
    ev = evaluate(params, data)
    ev.update({k: jnp.mean(v) for k, v in elr.items()})  # mean over the chunk's steps
    return params, opt_state, ev

  return (jax.jit(tx.init), jax.jit(train_chunk, donate_argnums=(0, 1)),
          jax.jit(evaluate))


def train(config: GrokConfig, arm_name: str, seed: int, *, progress: bool = True) -> dict:
  """Trains one arm from one seed; returns the run record (the JSON schema)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top

  arm = ARMS[arm_name]
  start = time.perf_counter()
  data = {k: jnp.asarray(v) for k, v in make_data(config, seed).items()}
  params = init_params(config, arm, seed)
  opt_init, train_chunk, evaluate = _programs(config, arm)
  opt_state = opt_init(params)
  history = {k: [] for k in ("epoch", "train_acc", "test_acc", "train_loss",
                             "isometry", "isometry_key")}

  def record(epoch, ev):
    ev = jax.device_get(ev)
    history["epoch"].append(int(epoch))
    for k, v in ev.items():
      # ELR histories start at the first chunk (no update before epoch 0).
      history.setdefault(k, []).append(float(v))
    return ev

  record(0, evaluate(params, data))
  bar = tqdm(total=config.epochs, desc=f"{arm_name} seed {seed}", unit="epoch",
             disable=not progress, leave=True, file=sys.stderr)
  epoch = 0
  while epoch < config.epochs:
    params, opt_state, ev = train_chunk(params, opt_state, data)
    epoch += config.eval_every
    ev = record(epoch, ev)
    bar.set_postfix(train=f"{ev['train_acc']:.3f}", test=f"{ev['test_acc']:.3f}",
                    iso=f"{ev['isometry']:.1e}", refresh=False)
    bar.update(config.eval_every)
  bar.close()
  wall = time.perf_counter() - start
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  return {
      "experiment": "grok",
      "arm": arm_name,
      "seed": int(seed),
      "config": {
          **dataclasses.asdict(config),
          "arm": dataclasses.asdict(arm),
          "n_train": int(data["y_train"].shape[0]),
          "n_test": int(data["y_test"].shape[0]),
          "n_params": n_params,
          "jax_version": jax.__version__,
          "backend": jax.default_backend(),
      },
      "metrics": run_metrics(history, config),
      "history": history,
      "wall_time": wall,
  }


# ----------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.description = __doc__
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  parser.add_argument("--preset", choices=sorted(PRESETS), default="quick",
                      help="configuration preset (default: quick)")
  parser.add_argument("--arms", default=None,
                      help=f"comma-separated arms from {','.join(ARMS)} (default: A2,B2)")
  parser.add_argument("--seeds", default=None,
                      help="comma-separated non-negative integer seeds (default: 0)")
  parser.add_argument("--epochs", type=int, default=None,
                      help="full-batch epochs (quick: 200, paper: 20000)")
  parser.add_argument("--eval-every", type=int, default=None,
                      help="epochs between evaluations (quick: 20, paper: 100)")
  parser.add_argument("--out", default="runs/grok",
                      help="directory for one JSON file per run (default: runs/grok)")
  parser.add_argument("--stabilize", action="store_true",
                      help="Power et al. setting: b2 0.98 and a 10-step linear warm-up")


def _parse_arms(text: Optional[str], default: Sequence[str]) -> list[str]:
  if text is None:
    return list(default)
  arms = [a.strip() for a in text.split(",") if a.strip()]
  if not arms:
    raise CommandError(f"--arms {text!r} names no arm; choose from {','.join(ARMS)}.")
  unknown = [a for a in arms if a not in ARMS]
  if unknown:
    raise CommandError(
        f"unknown arm(s) {','.join(unknown)} in --arms; choose from {','.join(ARMS)}.")
  return list(dict.fromkeys(arms))


def _parse_seeds(text: Optional[str], default: Sequence[int]) -> list[int]:
  if text is None:
    return list(default)
  parts = [s.strip() for s in text.split(",") if s.strip()]
  if not parts:
    raise CommandError(f"--seeds {text!r} is empty; give e.g. --seeds 0,1,2.")
  try:
    seeds = [int(s) for s in parts]
  except ValueError:
    raise CommandError(
        f"--seeds {text!r} must be comma-separated integers, e.g. --seeds 0,1,2.") from None
  if any(s < 0 for s in seeds):
    raise CommandError(f"--seeds {text!r}: seeds must be non-negative integers.")
  return list(dict.fromkeys(seeds))


def resolve_config(args: argparse.Namespace) -> tuple[GrokConfig, list[str], list[int]]:
  """The configuration, arms and seeds that ``args`` ask for (``CommandError`` if bad)."""
  preset = PRESETS[args.preset]
  config = preset["config"]
  changes = {}
  if args.epochs is not None:
    changes["epochs"] = args.epochs
  if args.eval_every is not None:
    changes["eval_every"] = args.eval_every
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
        " every evaluation window must have the same length (one compiled program).")
  return config, _parse_arms(args.arms, preset["arms"]), _parse_seeds(args.seeds, preset["seeds"])


def run_file_name(arm: str, seed: int, stabilize: bool) -> str:
  return f"{arm}{'-stab' if stabilize else ''}_seed{seed}.json"


def _fmt_epoch(e) -> str:
  return "-" if e is None else str(e)


def summary_table(records: Sequence[dict]) -> str:
  """One line per run: the metrics and wall time."""
  head = (f"{'arm':<8} {'seed':>4} {'memorized':>9} {'grokked':>8} {'sustained':>9}"
          f" {'end acc':>8} {'tail':>6} {'iso init':>9} {'iso final':>9} {'iso max':>9}"
          f" {'wall s':>7}")
  lines = [head, "-" * len(head)]
  for r in records:
    m = r["metrics"]
    lines.append(
        f"{r['arm']:<8} {r['seed']:>4} {_fmt_epoch(m['memorized_epoch']):>9}"
        f" {_fmt_epoch(m['grokked_epoch']):>8} {_fmt_epoch(m['sustained_epoch']):>9}"
        f" {m['end_test_acc']:>8.4f} {m['tail_test_acc']:>6.3f}"
        f" {m['initial_isometry']:>9.2e} {m['final_isometry']:>9.2e}"
        f" {m['max_isometry']:>9.2e} {r['wall_time']:>7.1f}")
  return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
  config, arms, seeds = resolve_config(args)
  out = writable_dir(args.out, "--out")
  setting = (f"preset={args.preset} epochs={config.epochs} eval_every={config.eval_every}"
             f"{' stabilize' if args.stabilize else ''}")
  print(f"stiefax grok: {setting}; arms {','.join(arms)}; seeds "
        f"{','.join(map(str, seeds))} -> {out}", flush=True)
  records = []
  for seed in seeds:
    for arm in arms:
      record = train(config, arm, seed)
      record["config"].update(preset=args.preset, stabilize=bool(args.stabilize),
                              setting=setting)
      path = out / run_file_name(arm, seed, args.stabilize)
      try:
        path.write_text(json.dumps(record, indent=1, allow_nan=True))
      except OSError as e:
        raise CommandError(f"cannot write {path} ({e.strerror or e}).") from None
      records.append(record)
  print(summary_table(records))
  print(f"wrote {len(records)} run(s) to {out}; tables and plots: stiefax report {out}")
  return 0


# ----------------------------------------------------------------------------
# Report (called by `stiefax report`).
# ----------------------------------------------------------------------------


def _median(xs) -> str:
  xs = [x for x in xs if x is not None]
  return "-" if not xs else f"{float(np.median(xs)):.0f}"


def _settings(runs: Sequence[dict]) -> dict:
  groups: dict = {}
  for r in runs:
    c = r.get("config", {})
    key = c.get("setting") or (
        f"epochs={c.get('epochs')} eval_every={c.get('eval_every')}"
        f"{' stabilize' if c.get('stabilize') else ''}")
    groups.setdefault(key, []).append(r)
  return groups


def _arm_order(names) -> list[str]:
  known = [a for a in ARMS if a in names]
  return known + sorted(n for n in names if n not in ARMS)


def _table(runs: Sequence[dict]) -> str:
  from stiefax.experiments import stats  # pylint: disable=g-import-not-at-top

  by_arm: dict = {}
  for r in runs:
    by_arm.setdefault(r["arm"], []).append(r)
  head = (f"{'arm':<8} {'n':>3} {'memorized':>9} {'grokked':>8} {'sustained':>9}"
          f" {'med grok':>8} {'med sust':>8} {'end acc':>13} {'tail mean':>13}"
          f" {'final iso':>9}")
  lines = [head, "-" * len(head)]
  for arm in _arm_order(by_arm):
    rs = sorted(by_arm[arm], key=lambda r: r["seed"])
    ms = [r["metrics"] for r in rs]
    n = len(rs)
    count = lambda key: f"{sum(m[key] is not None for m in ms)}/{n}"
    end_m, end_s = stats.summarize([m["end_test_acc"] for m in ms])
    tail_m, tail_s = stats.summarize([m["tail_test_acc"] for m in ms])
    iso = max(m["final_isometry"] for m in ms)
    lines.append(
        f"{arm:<8} {n:>3} {count('memorized_epoch'):>9} {count('grokked_epoch'):>8}"
        f" {count('sustained_epoch'):>9} {_median(m['grokked_epoch'] for m in ms):>8}"
        f" {_median(m['sustained_epoch'] for m in ms):>8}"
        f" {end_m:>6.3f}±{end_s:<6.3f} {tail_m:>6.3f}±{tail_s:<6.3f} {iso:>9.2e}")
  lines.append("(k/n: runs that reached the threshold; ± is the sample std across seeds;"
               " final iso: max over runs of max|W_Q^T W_Q - I| at the last evaluation)")

  if "A2" in by_arm:
    base = {r["seed"]: r["metrics"]["tail_test_acc"] for r in by_arm["A2"]}
    rows = []
    for arm in _arm_order(by_arm):
      if arm == "A2":
        continue
      other = {r["seed"]: r["metrics"]["tail_test_acc"] for r in by_arm[arm]}
      shared = sorted(set(base) & set(other))
      if len(shared) < 2:
        rows.append(f"{arm:<8} {len(shared):>3}  (needs >= 2 seeds shared with A2)")
        continue
      pr = stats.paired([base[s] for s in shared], [other[s] for s in shared])
      rows.append(
          f"{arm:<8} {pr.n:>3} {pr.mean:>+9.4f} {pr.t:>7.2f} {pr.p:>7.3f}"
          f" {pr.wins:>3}/{pr.n:<3} [{pr.ci_low:+.4f}, {pr.ci_high:+.4f}]")
    if rows:
      head2 = (f"{'arm':<8} {'n':>3} {'diff':>9} {'t':>7} {'p':>7} {'wins':>7}"
               f"  95% bootstrap CI")
      lines += ["", "Paired difference of the tail mean vs A2 (arm - A2, per seed):",
                head2, "-" * len(head2)] + rows
  return "\n".join(lines)


def _slug(text: str) -> str:
  return "".join(ch if ch.isalnum() else "_" for ch in text).strip("_")


def _plots(runs: Sequence[dict], out_dir: pathlib.Path, suffix: str) -> list[pathlib.Path]:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  by_arm: dict = {}
  for r in runs:
    by_arm.setdefault(r["arm"], []).append(r)
  arms = _arm_order(by_arm)
  colors = {a: plt.get_cmap("tab10")(i % 10) for i, a in enumerate(arms)}
  written = []

  cols = min(3, len(arms))
  rows = math.ceil(len(arms) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False,
                           sharey=True)
  for ax in axes.ravel()[len(arms):]:
    ax.set_visible(False)
  for ax, arm in zip(axes.ravel(), arms):
    for i, r in enumerate(sorted(by_arm[arm], key=lambda r: r["seed"])):
      h = r["history"]
      ax.plot(h["epoch"], h["train_acc"], color="tab:blue", alpha=0.8, lw=1,
              label="train" if i == 0 else None)
      ax.plot(h["epoch"], h["test_acc"], color="tab:red", alpha=0.8, lw=1,
              label="held-out" if i == 0 else None)
    ax.set_title(f"{arm} ({len(by_arm[arm])} run{'s' if len(by_arm[arm]) > 1 else ''})")
    ax.set_xlabel("epoch")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
  axes[0, 0].set_ylabel("accuracy")
  axes[0, 0].legend(loc="lower right")
  fig.tight_layout()
  path = out_dir / f"grok_accuracy{suffix}.png"
  fig.savefig(path, dpi=110)
  plt.close(fig)
  written.append(path)

  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  for arm in arms:
    for i, r in enumerate(by_arm[arm]):
      h = r["history"]
      iso = np.maximum(np.asarray(h["isometry"], np.float64), 1e-12)
      ax.semilogy(h["epoch"], iso, color=colors[arm], alpha=0.8, lw=1,
                  label=arm if i == 0 else None)
  ax.set_xlabel("epoch")
  ax.set_ylabel(r"isometry error $\max|W_Q^\top W_Q - I|$")
  ax.grid(alpha=0.3, which="both")
  ax.legend()
  fig.tight_layout()
  path = out_dir / f"grok_isometry{suffix}.png"
  fig.savefig(path, dpi=110)
  plt.close(fig)
  written.append(path)

  # Effective learning rate (tangential part of the update, per group).
  if any("elr_frames" in r["history"] for rs in by_arm.values() for r in rs):
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for arm in arms:
      for i, r in enumerate(by_arm[arm]):
        h = r["history"]
        for key, style in (("elr_frames", "-"), ("elr_matrices", ":")):
          if key in h:
            epochs = h["epoch"][len(h["epoch"]) - len(h[key]):]
            ax.semilogy(epochs, np.maximum(np.asarray(h[key], np.float64), 1e-12),
                        style, color=colors[arm], alpha=0.8, lw=1,
                        label=f"{arm} {key[4:]}" if i == 0 else None)
    ax.set_xlabel("epoch")
    ax.set_ylabel(r"effective learning rate $\|\Delta_\perp\| / \|w\|$")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / f"grok_elr{suffix}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
  return written


def report(runs: list, out_dir: pathlib.Path) -> str:
  """Paper-style tables for grokking runs; writes accuracy and isometry PNGs."""
  groups = _settings(runs)
  parts = []
  for i, (setting, rs) in enumerate(sorted(groups.items())):
    suffix = "" if len(groups) == 1 else f"_{_slug(setting)}"
    written = _plots(rs, pathlib.Path(out_dir), suffix)
    parts.append(f"Grokking, c = (a + b) mod {rs[0]['config'].get('modulus', 97)}"
                 f" [{setting}]: {len(rs)} run(s)\n" + _table(rs) +
                 "\nplots: " + ", ".join(str(p) for p in written))
  return "\n\n".join(parts)
