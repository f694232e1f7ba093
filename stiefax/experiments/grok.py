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
  quick (default)  A2,B2 at seed 0: the paper's model family (2-layer, 4-head, d=128,
                   r=32 pre-LN encoder, same readout, same optimizers) on a smaller
                   task, c = (a + b) mod 23 with 70% of the 529 pairs training, in the
                   Power et al. setting (b2 0.98, 10-step warm-up) with weight decay
                   5.0, for 800 epochs (evaluation every 50). Both arms memorize
                   within 50 epochs, A2 groks (held-out >= 0.95) within the budget,
                   and the isometry contrast shows (A2 far above 1e-2, B2 at float32
                   rounding). Measured time: see the README.
  paper            the exact configuration: 20 000 epochs, evaluation every 100
                   (about 95 minutes per arm on a 2-core CPU).
--stabilize runs the Power et al. setting (b2 0.98 and a 10-step linear warm-up, for
the AdamW and the Riemannian rate alike).

Each run writes OUT/<arm>[-stab]-<preset>-e<epochs>-<hash>-s<seed>.json, where the
hash covers the whole configuration (every hyperparameter, the budget, the arm), so no
two configurations share a file; the file records the command that reruns it and the
code's commit. A finished run is never trained again nor overwritten: the same command
skips it. An unfinished run keeps an Orbax checkpoint (parameters, optimizer state,
history) in <run>.ckpt every --checkpoint-every epochs and on Ctrl-C; the same
command resumes it, to the same result as an uninterrupted run. Each run is claimed by
a lock (<run>.lock), so several processes can share one --out: each trains different
runs and waits for the others' runs. --vmap-seeds trains the seeds of an arm as one
program, the seed a batch axis. `stiefax report OUT` prints the paper-style tables
(memorized / grokked / sustained k/n, tail means, paired differences against A2) and
writes PNG plots.

Examples:
  stiefax grok
  stiefax grok --preset paper --arms A2,B2 --seeds 0      # Ctrl-C and rerun: resumes
  stiefax grok --preset paper --arms A2,B2,B2m,B2m-can,B2-frz --seeds 0
  stiefax grok --preset paper --arms A2,B2,B2-frz --seeds 0,1,2,3,4 --stabilize
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import pathlib
import sys
import time
from typing import Any
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments.cli import CommandError
from stiefax.experiments.cli import writable_dir

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

QUICK = dataclasses.replace(
  PAPER, modulus=23, train_fraction=0.7, weight_decay=5.0, **STABILIZED, epochs=800, eval_every=50
)

PRESETS = {
  "quick": dict(config=QUICK, arms=("A2", "B2"), seeds=(0,)),
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
  "A2-muon": Arm(
    "optax.contrib.muon on W_Q, W_K (rate 0.02), unconstrained", "muon", orthonormal=False
  ),
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
  n_train = round(config.train_fraction * p * p)
  if not 0 < n_train < p * p:
    raise CommandError(
      f"train_fraction {config.train_fraction} leaves {n_train} of {p * p} pairs for"
      " training; it must leave at least one pair on each side."
    )
  perm = np.random.default_rng(seed).permutation(p * p)
  tr, te = perm[:n_train], perm[n_train:]
  return {"x_train": x[tr], "y_train": y[tr], "x_test": x[te], "y_test": y[te]}


@functools.cache
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
        jnp.arange(tokens.shape[-1])
      )
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


@functools.cache
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
      labels,
      params,
    )
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
    return optax.adamw(
      lr, b1=b1, b2=b2, weight_decay=wd, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)
    )
  frames = {
    "riemannian": lambda: stiefax.riemannian_adam(
      rate(config.riemannian_lr), b1, b2, eps=config.riemannian_eps, max_norm=config.tau
    ),
    "elementwise": lambda: stiefax.riemannian_adam(lr, b1, b2, moment="elementwise", max_norm=None),
    "elementwise-canonical": lambda: stiefax.riemannian_adam(
      lr, b1, b2, moment="elementwise", max_norm=None, projector="canonical"
    ),
    "frozen": optax.set_to_zero,
    "adam": lambda: optax.adam(lr, b1=b1, b2=b2),
    "riemannian-qr": lambda: stiefax.riemannian_adam(
      rate(config.riemannian_lr),
      b1,
      b2,
      eps=config.riemannian_eps,
      max_norm=config.tau,
      retraction="qr",
    ),
    "riemannian-cayley": lambda: stiefax.riemannian_adam(
      rate(config.riemannian_lr),
      b1,
      b2,
      eps=config.riemannian_eps,
      max_norm=config.tau,
      retraction="cayley",
    ),
    "mmuon": lambda: stiefax.manifold_muon(rate(MMUON_LR)),
    # (d, heads, r) kernels: reduce over d, one matrix per head; decayed like A2.
    "muon": lambda: optax.contrib.muon(
      rate(MUON_LR),
      weight_decay=wd,
      muon_weight_dimension_numbers=lambda p: jax.tree.map(
        lambda _: optax.contrib.MuonDimensionNumbers(0, 2), p
      ),
    ),
  }[arm.rule]()
  return stiefax.stiefel_adamw(lr, wd, b1=b1, b2=b2, stiefel=frames)


# ----------------------------------------------------------------------------
# Training.
# ----------------------------------------------------------------------------


@functools.cache
def _programs(config: GrokConfig, arm: Arm, vmapped: bool = False, donate: bool = True):
  """Jitted ``(init_state, train_chunk, evaluate)``, shared by every seed of an arm.

  ``train_chunk`` is one compiled program: ``jax.lax.scan`` over ``eval_every``
  full-batch steps, followed by the evaluation. ``vmapped``: ``train_chunk`` and
  ``evaluate`` take every argument with a leading seed axis (``jax.vmap``), so all the
  seeds of an arm train as one program (``init_state`` stays per seed). ``donate``:
  ``train_chunk`` reuses the buffers of its parameter and state arguments.
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
      step, (params, opt_state, data), None, length=config.eval_every
    )
    ev = evaluate(params, data)
    ev.update({k: jnp.mean(v) for k, v in elr.items()})  # mean over the chunk's steps
    return params, opt_state, ev

  batch = jax.vmap if vmapped else (lambda f: f)
  return (
    jax.jit(tx.init),
    jax.jit(batch(train_chunk), donate_argnums=(0, 1) if donate else ()),
    jax.jit(batch(evaluate)),
  )


class Checkpoints:
  """A run's training state on disk (Orbax), for resuming an interrupted run.

  One checkpoint (the latest) is kept in ``directory``: the parameters and optimizer
  state (``state``, an Orbax ``StandardSave`` of the arrays), and as JSON (``meta``) the
  epoch reached, the evaluation history so far, the wall time spent and the seed. The
  training loop draws no random numbers after initialization (full batch, no dropout),
  so the seed is all the random state there is. Orbax writes each checkpoint to a
  temporary folder and renames it when complete: a process killed while saving leaves
  the previous checkpoint.
  """

  def __init__(self, directory: pathlib.Path):
    self.directory = pathlib.Path(directory).resolve()
    self._manager = None

  def _open(self):
    if self._manager is None:
      import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

      options = ocp.CheckpointManagerOptions(
        max_to_keep=1, create=True, enable_async_checkpointing=False
      )
      self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "meta")
      )
    return self._manager

  def latest_epoch(self) -> Optional[int]:
    if not self.directory.is_dir():
      return None
    return self._open().latest_step()

  def save(self, epoch: int, params, opt_state, meta: dict) -> None:
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    self._open().save(
      epoch,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
        meta=ocp.args.JsonSave(meta),
      ),
      force=True,
    )

  def restore(self, epoch: int, params, opt_state) -> tuple[Any, Any, dict]:
    """``(params, opt_state, meta)`` saved at ``epoch``; ``params``, ``opt_state``
    give the tree structure, shapes and dtypes."""
    import jax  # pylint: disable=g-import-not-at-top
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    target = {"params": params, "opt_state": opt_state}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    got = self._open().restore(
      epoch,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
      ),
    )
    # Orbax returns optax's named tuples as plain tuples: rebuild the original tree.
    state = jax.tree.unflatten(jax.tree.structure(target), jax.tree.leaves(got["state"]))
    return state["params"], state["opt_state"], dict(got["meta"])

  def close(self) -> None:
    if self._manager is not None:
      self._manager.close()
      self._manager = None

  def remove(self) -> None:
    import shutil  # pylint: disable=g-import-not-at-top

    self.close()
    shutil.rmtree(self.directory, ignore_errors=True)


class _StopRequest:
  """While active, SIGINT asks the training loop to stop at the next evaluation.

  A second SIGINT stops at once (``KeyboardInterrupt``). Outside the main thread, where
  signal handlers cannot be set, SIGINT keeps its default behaviour.
  """

  def __init__(self):
    self.requested = False
    self._previous = None

  def _handler(self, signum, frame):
    del frame
    if self.requested:
      raise KeyboardInterrupt
    self.requested = True
    print(
      "\nstiefax grok: stopping at the next evaluation and saving a checkpoint"
      " (Ctrl-C again to stop now)",
      file=sys.stderr,
      flush=True,
    )

  def __enter__(self):
    import signal  # pylint: disable=g-import-not-at-top
    import threading  # pylint: disable=g-import-not-at-top

    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGINT, self._handler)
    return self

  def __exit__(self, *exc):
    import signal  # pylint: disable=g-import-not-at-top

    if self._previous is not None:
      signal.signal(signal.SIGINT, self._previous)
      self._previous = None


def train(
  config: GrokConfig,
  arm_name: str,
  seed: int,
  *,
  progress: bool = True,
  checkpoints: Optional[Checkpoints] = None,
  checkpoint_every: int = 0,
) -> dict:
  """Trains one arm from one seed; returns the run record (the JSON schema).

  With ``checkpoints``, a run starts from the latest checkpoint there if there is one,
  saves one every ``checkpoint_every`` epochs (0: never) and, on SIGINT, saves one at
  the next evaluation and raises ``KeyboardInterrupt``. The arithmetic of a resumed run
  is that of the uninterrupted run: the same compiled programs on the same arrays.
  """
  return train_seeds(
    config,
    arm_name,
    [seed],
    progress=progress,
    checkpoints=None if checkpoints is None else [checkpoints],
    checkpoint_every=checkpoint_every,
    vmap=False,
  )[0]


def _stack(trees):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _unstack(tree, n: int) -> list:
  import jax  # pylint: disable=g-import-not-at-top

  return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(n)]


def train_seeds(
  config: GrokConfig,
  arm_name: str,
  seeds: Sequence[int],
  *,
  progress: bool = True,
  checkpoints: Optional[Sequence[Checkpoints]] = None,
  checkpoint_every: int = 0,
  vmap: bool = True,
) -> list[dict]:
  """Trains one arm from several seeds in step; returns one run record per seed.

  ``vmap``: the seeds are a batch axis of one compiled program (``jax.vmap`` of the
  per-seed program: the same arithmetic, batched), else there must be one seed. Every
  seed's checkpoints (see :func:`train`) are its own, so a run started with or without
  ``vmap`` resumes either way; the seeds must have been checkpointed at the same epoch.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top

  seeds = [int(s) for s in seeds]
  if not vmap and len(seeds) != 1:
    raise ValueError(f"train_seeds: {len(seeds)} seeds need vmap=True.")
  n = len(seeds)
  arm = ARMS[arm_name]
  start = time.perf_counter()
  datas = [{k: jnp.asarray(v) for k, v in make_data(config, s).items()} for s in seeds]
  params = [init_params(config, arm, s) for s in seeds]
  opt_init, train_chunk, evaluate = _programs(config, arm, vmap)
  opt_state = [opt_init(p) for p in params]
  histories = [
    {k: [] for k in ("epoch", "train_acc", "test_acc", "train_loss", "isometry", "isometry_key")}
    for _ in seeds
  ]

  def record(epoch, ev):
    ev = jax.device_get(ev)
    for i, history in enumerate(histories):
      history["epoch"].append(int(epoch))
      for k, v in ev.items():
        # ELR histories start at the first chunk (no update before epoch 0).
        history.setdefault(k, []).append(float(v[i] if vmap else v))
    return {k: v[0] if vmap else v for k, v in ev.items()}

  epoch, earlier_wall, resumed_from = 0, [0.0] * n, None
  latest = {checkpoints[i].latest_epoch() for i in range(n)} if checkpoints else {None}
  if len(latest) > 1:
    raise CommandError(
      f"{arm_name} seeds {seeds}: checkpoints at different epochs"
      f" {sorted(latest, key=str)}; train them in separate commands."
    )
  latest = latest.pop()
  if latest is not None:
    for i, s in enumerate(seeds):
      params[i], opt_state[i], meta = checkpoints[i].restore(latest, params[i], opt_state[i])
      if meta.get("seed") != s or meta.get("epoch") != latest:
        raise CommandError(
          f"checkpoint {checkpoints[i].directory} holds seed {meta.get('seed')} at epoch"
          f" {meta.get('epoch')}, not seed {s} at {latest}; move it away to train this"
          " run afresh."
        )
      histories[i], earlier_wall[i] = meta["history"], float(meta["wall_time"])
    epoch = resumed_from = latest
    print(
      f"  {arm_name} seed{'s' * (n > 1)} {','.join(map(str, seeds))}: resuming from the"
      f" checkpoint at epoch {latest}",
      flush=True,
    )
  if vmap:
    params, opt_state = _stack(params), _stack(opt_state)
    data = _stack(datas)
  else:
    params, opt_state, data = params[0], opt_state[0], datas[0]
  if latest is None:
    record(0, evaluate(params, data))

  def save():
    per_seed = zip(_unstack(params, n), _unstack(opt_state, n)) if vmap else [(params, opt_state)]
    for i, (p, o) in enumerate(per_seed):
      checkpoints[i].save(
        epoch,
        p,
        o,
        {
          "epoch": epoch,
          "seed": seeds[i],
          "arm": arm_name,
          "history": histories[i],
          "wall_time": earlier_wall[i] + time.perf_counter() - start,
        },
      )

  desc = f"{arm_name} seed{'s' * (n > 1)} {','.join(map(str, seeds))}"
  bar = tqdm(
    total=config.epochs,
    initial=epoch,
    desc=desc,
    unit="epoch",
    disable=not progress,
    leave=True,
    file=sys.stderr,
  )
  with _StopRequest() as stop:
    while epoch < config.epochs:
      params, opt_state, ev = train_chunk(params, opt_state, data)
      epoch += config.eval_every
      ev = record(epoch, ev)
      bar.set_postfix(
        train=f"{ev['train_acc']:.3f}",
        test=f"{ev['test_acc']:.3f}",
        iso=f"{ev['isometry']:.1e}",
        refresh=False,
      )
      bar.update(config.eval_every)
      if (
        checkpoints
        and epoch < config.epochs
        and (stop.requested or (checkpoint_every and epoch % checkpoint_every == 0))
      ):
        save()
      if stop.requested and epoch < config.epochs:
        bar.close()
        where = f"; checkpoint at epoch {epoch}" if checkpoints else ""
        print(
          f"stiefax grok: stopped {desc} at epoch {epoch}{where}; the same command resumes it",
          file=sys.stderr,
          flush=True,
        )
        raise KeyboardInterrupt
  bar.close()
  for c in checkpoints or ():
    c.close()
  wall = time.perf_counter() - start
  per_seed = _unstack(params, n) if vmap else [params]
  records = []
  for i, s in enumerate(seeds):
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(per_seed[i]))
    records.append(
      {
        "experiment": "grok",
        "arm": arm_name,
        "seed": s,
        "config": {
          **dataclasses.asdict(config),
          "arm": dataclasses.asdict(arm),
          "n_train": int(datas[i]["y_train"].shape[0]),
          "n_test": int(datas[i]["y_test"].shape[0]),
          "n_params": n_params,
          "jax_version": jax.__version__,
          "backend": jax.default_backend(),
        },
        "metrics": run_metrics(histories[i], config),
        "history": histories[i],
        "wall_time": earlier_wall[i] + wall,  # with vmap: the batch's time, shared
        "vmapped_seeds": seeds if vmap else None,
        "resumed_from": resumed_from,
      }
    )
  return records


# ----------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.description = __doc__
  parser.formatter_class = argparse.RawDescriptionHelpFormatter
  parser.add_argument(
    "--preset",
    choices=sorted(PRESETS),
    default="quick",
    help="configuration preset (default: quick)",
  )
  parser.add_argument(
    "--arms", default=None, help=f"comma-separated arms from {','.join(ARMS)} (default: A2,B2)"
  )
  parser.add_argument(
    "--seeds", default=None, help="comma-separated non-negative integer seeds (default: 0)"
  )
  parser.add_argument(
    "--epochs", type=int, default=None, help="full-batch epochs (quick: 200, paper: 20000)"
  )
  parser.add_argument(
    "--eval-every",
    type=int,
    default=None,
    help="epochs between evaluations (quick: 20, paper: 100)",
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


def _parse_arms(text: Optional[str], default: Sequence[str]) -> list[str]:
  if text is None:
    return list(default)
  arms = [a.strip() for a in text.split(",") if a.strip()]
  if not arms:
    raise CommandError(f"--arms {text!r} names no arm; choose from {','.join(ARMS)}.")
  unknown = [a for a in arms if a not in ARMS]
  if unknown:
    raise CommandError(
      f"unknown arm(s) {','.join(unknown)} in --arms; choose from {','.join(ARMS)}."
    )
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
      f"--seeds {text!r} must be comma-separated integers, e.g. --seeds 0,1,2."
    ) from None
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
      " every evaluation window must have the same length (one compiled program)."
    )
  every = getattr(args, "checkpoint_every", None)
  if every is not None and every < 0:
    raise CommandError(f"--checkpoint-every {every} must be >= 0 (0: only on Ctrl-C).")
  return config, _parse_arms(args.arms, preset["arms"]), _parse_seeds(args.seeds, preset["seeds"])


def checkpoint_interval(config: GrokConfig, every: Optional[int]) -> int:
  """``every`` (default 1000) rounded up to a multiple of ``eval_every``; 0 stays 0."""
  every = 1000 if every is None else every
  return -(-every // config.eval_every) * config.eval_every if every else 0


def run_identity(config: GrokConfig, arm: str, preset: str) -> dict:
  """What decides a run's result, except its seed: the preset, every field of
  ``config`` (budget, model, optimizer, thresholds) and the arm's definition."""
  return {
    "experiment": "grok",
    "preset": preset,
    "arm": arm,
    "arm_definition": dataclasses.asdict(ARMS[arm]),
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
  from stiefax.experiments import store  # pylint: disable=g-import-not-at-top

  digest = store.digest(run_identity(config, arm, preset))
  return f"{arm}{'-stab' if stabilize else ''}-{preset}-e{config.epochs}-{digest}-s{seed}.json"


def run_command(config: GrokConfig, arm: str, seed: int, preset: str, stabilize: bool, out) -> str:
  """The ``stiefax grok`` command line that reruns (or resumes) exactly this run."""
  import shlex  # pylint: disable=g-import-not-at-top

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
  """The runs in plain words: when each memorized and grokked, accuracy, isometry."""
  lines = []
  for r in records:
    m, c = r["metrics"], r["config"]
    epochs = r["history"]["epoch"][-1]
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
      peak = max(r["history"]["test_acc"])
      text += f"; did not grok within {epochs} epochs (held-out peak {peak:.3f})"
    text += (
      f"; held-out accuracy {m['end_test_acc']:.3f} at the end,"
      f" {m['tail_test_acc']:.3f} over the last {c['tail_fraction']:.0%} of the run"
    )
    iso = m["max_isometry_after_init"]
    text += (
      f"; W_Q, W_K {'stayed on' if iso < 1e-4 else 'left'} the Stiefel manifold"
      f" (isometry error up to {iso:.1e})."
    )
    lines.append(text)
  return "\n".join(lines)


def _finished(
  path: pathlib.Path, identity: dict, seed: int, repair: bool = False
) -> Optional[dict]:
  """The run written at ``path`` if it is this run (same identity and seed), else None.

  With ``repair`` (only while holding the run's lock), a file there that is damaged or
  holds another run is moved aside (never deleted), so that the run can be written.
  """
  from stiefax.experiments import store  # pylint: disable=g-import-not-at-top

  if not path.is_file():
    return None
  record, problem = store.read_json(path)
  if problem is None:
    try:
      if record_identity(record) == identity and record["seed"] == seed:
        return record
      problem = "it holds another configuration"
    except (KeyError, TypeError, AttributeError) as e:
      problem = f"it lacks the field {e}"
  if not repair:
    return None
  aside = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
  os.replace(path, aside)
  print(
    f"stiefax grok: {path} is unusable ({problem}); moved it to {aside.name}"
    " and training the run again",
    file=sys.stderr,
    flush=True,
  )
  return None


@dataclasses.dataclass
class _Job:
  """One (arm, seed) of the command and where its files live."""

  arm: str
  seed: int
  path: pathlib.Path  # the result JSON
  identity: dict

  @property
  def lock_path(self) -> pathlib.Path:
    return self.path.with_suffix(".lock")


def run(args: argparse.Namespace) -> int:
  from stiefax.experiments import store  # pylint: disable=g-import-not-at-top

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
  jobs = [
    _Job(
      arm,
      seed,
      out / run_file_name(config, arm, seed, args.preset, args.stabilize),
      run_identity(config, arm, args.preset),
    )
    for seed in seeds
    for arm in arms
  ]
  records: dict = {}
  waiting: set = set()
  every = checkpoint_interval(config, args.checkpoint_every)
  vmap = bool(getattr(args, "vmap_seeds", False)) and len(seeds) > 1

  def claim(job, locks) -> bool:
    """True if this process now holds ``job`` (its lock in ``locks``) and must train it."""
    key = (job.arm, job.seed)
    done = _finished(job.path, job.identity, job.seed)
    if done:
      print(f"  {job.arm} seed {job.seed}: finished already ({job.path.name})", flush=True)
      records[key] = done
      return False
    lock = store.RunLock(job.lock_path)
    if not lock.acquire():
      if key not in waiting:
        holder = lock.holder() or {}
        print(
          f"  {job.arm} seed {job.seed}: being trained by process"
          f" {holder.get('pid', '?')} on {holder.get('host', '?')}; waiting for it",
          flush=True,
        )
        waiting.add(key)
      return False
    locks.append(lock)
    done = _finished(job.path, job.identity, job.seed, repair=True)  # finished meanwhile?
    if done:
      if job.path.with_suffix(".ckpt").exists():  # left by a process ended just after
        Checkpoints(job.path.with_suffix(".ckpt")).remove()
      records[key] = done
      return False
    return True

  def train_batch(batch: list) -> None:
    """Trains ``batch`` (jobs of one arm, checkpointed at the same epoch), writes them."""
    checkpoints = [Checkpoints(job.path.with_suffix(".ckpt")) for job in batch]
    results = train_seeds(
      config,
      batch[0].arm,
      [job.seed for job in batch],
      checkpoints=checkpoints,
      checkpoint_every=every,
      vmap=vmap,
    )
    for job, record, ckpt in zip(batch, results, checkpoints):
      record["config"].update(preset=args.preset, stabilize=bool(args.stabilize), setting=setting)
      record["run_id"] = store.digest(job.identity)
      record["command"] = run_command(config, job.arm, job.seed, args.preset, args.stabilize, out)
      record["code"] = store.code_version()
      try:
        store.write_json(job.path, record)
      except OSError as e:
        raise CommandError(f"cannot write {job.path} ({e.strerror or e}).") from None
      ckpt.remove()  # the result is written: the training state is not needed
      records[(job.arm, job.seed)] = record

  while len(records) < len(jobs):
    before = len(records)
    for arm in arms:
      pending = [j for j in jobs if j.arm == arm and (j.arm, j.seed) not in records]
      for candidates in [pending] if vmap else [[j] for j in pending]:
        locks: list = []
        try:
          claimed = [job for job in candidates if claim(job, locks)]
          by_epoch: dict = {}  # seeds checkpointed at the same epoch train together
          for job in claimed:
            probe = Checkpoints(job.path.with_suffix(".ckpt"))
            at = probe.latest_epoch()
            probe.close()
            by_epoch.setdefault(-1 if at is None else at, []).append(job)
          for batch in by_epoch.values():
            train_batch(batch)
        finally:
          for lock in locks:
            lock.release()
    if len(records) < len(jobs) and len(records) == before:
      time.sleep(2.0)  # every remaining run is held by another process
  ordered = [records[(j.arm, j.seed)] for j in jobs]
  print(summary_table(ordered))
  print()
  print(summary_words(ordered))
  print(f"{len(ordered)} run(s) in {out}; tables and plots: stiefax report {out}")
  return 0


# ----------------------------------------------------------------------------
# Report (called by `stiefax report`).
# ----------------------------------------------------------------------------


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
  """What a grokking run lacks for the report (``None`` if nothing); see ``stiefax report``."""
  for key in _METRICS:
    if key not in run["metrics"]:
      return f"lacks the metric {key!r}"
  history = run.get("history")
  if not isinstance(history, dict):
    return "lacks the field 'history'"
  for key in _HISTORY:
    if not isinstance(history.get(key), list) or not history[key]:
      return f"lacks the history {key!r}"
  if len({len(history[k]) for k in _HISTORY}) != 1:
    return "its histories differ in length"
  try:
    record_identity(run)
  except KeyError as e:
    return f"lacks the config field {e}"
  return None


def run_key(run: dict) -> tuple:
  """Two files hold the same run when they share :func:`record_identity` and seed."""
  from stiefax.experiments import store  # pylint: disable=g-import-not-at-top

  return (store.digest(record_identity(run)), run["seed"])


def _median(xs) -> str:
  xs = [x for x in xs if x is not None]
  return "-" if not xs else f"{float(np.median(xs)):.0f}"


def _settings(runs: Sequence[dict]) -> dict:
  groups: dict = {}
  for r in runs:
    c = r.get("config", {})
    key = c.get("setting") or (
      f"epochs={c.get('epochs')} eval_every={c.get('eval_every')}"
      f"{' stabilize' if c.get('stabilize') else ''}"
    )
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
  head = (
    f"{'arm':<8} {'n':>3} {'mem k/n':>7} {'grok k/n':>8} {'sust k/n':>8}"
    f" {'med grok epoch':>14} {'med sust epoch':>14} {'end held-out':>13}"
    f" {'tail held-out':>13} {'final iso':>9}"
  )
  lines = [head, "-" * len(head)]
  for arm in _arm_order(by_arm):
    rs = sorted(by_arm[arm], key=lambda r: r["seed"])
    ms = [r["metrics"] for r in rs]
    n = len(rs)
    count = lambda key, ms=ms, n=n: f"{sum(m[key] is not None for m in ms)}/{n}"
    end_m, end_s = stats.summarize([m["end_test_acc"] for m in ms])
    tail_m, tail_s = stats.summarize([m["tail_test_acc"] for m in ms])
    iso = max(m["final_isometry"] for m in ms)
    lines.append(
      f"{arm:<8} {n:>3} {count('memorized_epoch'):>7} {count('grokked_epoch'):>8}"
      f" {count('sustained_epoch'):>8} {_median(m['grokked_epoch'] for m in ms):>14}"
      f" {_median(m['sustained_epoch'] for m in ms):>14}"
      f" {end_m:>6.3f}±{end_s:<6.3f} {tail_m:>6.3f}±{tail_s:<6.3f} {iso:>9.2e}"
    )
  lines.append(
    "(k/n: runs that reached the threshold; ± is the sample std across seeds;"
    " final iso: max over runs of max|W_Q^T W_Q - I| at the last evaluation)"
  )

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
        f" {pr.wins:>3}/{pr.n:<3} [{pr.ci_low:+.4f}, {pr.ci_high:+.4f}]"
      )
    if rows:
      head2 = f"{'arm':<8} {'n':>3} {'diff':>9} {'t':>7} {'p':>7} {'wins':>7}  95% bootstrap CI"
      lines += [
        "",
        "Paired difference of the tail mean vs A2 (arm - A2, per seed):",
        head2,
        "-" * len(head2),
      ] + rows
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
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharey=True)
  for ax in axes.ravel()[len(arms) :]:
    ax.set_visible(False)
  for ax, arm in zip(axes.ravel(), arms):
    for i, r in enumerate(sorted(by_arm[arm], key=lambda r: r["seed"])):
      h = r["history"]
      ax.plot(
        h["epoch"],
        h["train_acc"],
        color="tab:blue",
        alpha=0.8,
        lw=1,
        label="train" if i == 0 else None,
      )
      ax.plot(
        h["epoch"],
        h["test_acc"],
        color="tab:red",
        alpha=0.8,
        lw=1,
        label="held-out" if i == 0 else None,
      )
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
      ax.semilogy(
        h["epoch"], iso, color=colors[arm], alpha=0.8, lw=1, label=arm if i == 0 else None
      )
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
            epochs = h["epoch"][len(h["epoch"]) - len(h[key]) :]
            ax.semilogy(
              epochs,
              np.maximum(np.asarray(h[key], np.float64), 1e-12),
              style,
              color=colors[arm],
              alpha=0.8,
              lw=1,
              label=f"{arm} {key[4:]}" if i == 0 else None,
            )
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
  for _i, (setting, rs) in enumerate(sorted(groups.items())):
    suffix = "" if len(groups) == 1 else f"_{_slug(setting)}"
    written = _plots(rs, pathlib.Path(out_dir), suffix)
    parts.append(
      f"Grokking, c = (a + b) mod {rs[0]['config'].get('modulus', 97)}"
      f" [{setting}]: {len(rs)} run(s)\n"
      + _table(rs)
      + "\nplots: "
      + ", ".join(str(p) for p in written)
    )
  return "\n\n".join(parts)
