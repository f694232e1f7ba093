"""Training one (arm, seed) of ``stiefax lm``: jitted chunks, evaluation, resume.

Every ``eval_every`` steps is one compiled program (``jax.lax.scan`` over the steps,
batches gathered on the device from the seed's window positions), followed by the
evaluation: the validation loss in bits per byte, the attention probe (largest logit
and mean entropy over the first ``probe_windows`` validation windows) and the
isometry error of the query/key frames. The test loss is measured once, at the end.
A run whose training loss turns non-finite stops there and is recorded as diverged.

With a :class:`~stiefax.experiments.checkpoints.Checkpoints`, the run resumes
from its latest checkpoint, saves one every ``checkpoint_every`` steps and on
SIGINT/SIGTERM (:class:`~stiefax.experiments.stopping.StopRequest`); the batches
depend on the step only, so a resumed run is the uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from typing import Any
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

import stiefax
from stiefax.experiments import attention
from stiefax.experiments import optim
from stiefax.experiments.arms import Arm
from stiefax.experiments.lm import data as data_lib
from stiefax.experiments.lm.config import LMConfig
from stiefax.experiments.lm.config import frame_rate
from stiefax.experiments.lm.config import hyper
from stiefax.experiments.lm.config import schedule
from stiefax.experiments.lm.model import DecoderLM
from stiefax.experiments.progress import progress_bar
from stiefax.experiments.stopping import Stopped
from stiefax.experiments.stopping import StopRequest

__all__ = ["Programs", "programs", "init_params", "train", "BITS"]

#: Nats per bit: a loss in nats per byte divided by this is bits per byte.
BITS = math.log(2.0)

_EVAL_CHUNK = 64  # validation/test windows per forward pass


@dataclasses.dataclass(frozen=True)
class Programs:
  """The jitted programs of one (arm, config), shared by its seeds."""

  model: Any
  tx: Any
  init: Any  # key -> variables
  opt_init: Any  # variables -> opt_state
  chunk: Any  # (variables, opt_state, train, positions) -> (variables, opt_state, losses)
  loss: Any  # (variables, windows) -> summed loss in nats over the windows' targets
  probe: Any  # (variables, windows) -> {"max_logit", "entropy"}
  isometry: Any  # variables -> max |W^T W - I| over the query/key frames


@functools.lru_cache(maxsize=16)
def programs(arm: Arm, config: LMConfig) -> Programs:
  """The model, optimizer and jitted programs of ``arm`` at ``config``."""
  model = DecoderLM(config.model, arm.attention)
  tx = optim.make_optimizer(arm, hyper(arm, config))
  seq = config.seq

  def loss_fn(variables, windows):
    logits, state = attention.apply_train(model, variables, windows[:, :-1])
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:])
    return jnp.mean(ce), state

  def step(carry, starts):
    variables, opt_state, train = carry
    idx = starts[:, None] + jnp.arange(seq + 1)[None, :]
    windows = train[idx].astype(jnp.int32)
    (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(variables, windows)
    updates, opt_state = tx.update(grads, opt_state, variables)
    variables = attention.with_state(optax.apply_updates(variables, updates), state)
    return (variables, opt_state, train), loss

  def chunk(variables, opt_state, train, positions):
    (variables, opt_state, _), losses = jax.lax.scan(step, (variables, opt_state, train), positions)
    return variables, opt_state, losses

  def summed_loss(variables, windows):
    logits = model.apply(variables, windows[:, :-1])
    return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:]))

  def probe(variables, windows):
    _, inter = model.apply(variables, windows[:, :-1], mutable=["intermediates"])
    maxes = [v for _, v in _sown(inter["intermediates"], "max_logit")]
    ents = [v for _, v in _sown(inter["intermediates"], "entropy")]
    return {"max_logit": jnp.max(jnp.stack(maxes)), "entropy": jnp.mean(jnp.stack(ents))}

  def init(key):
    return model.init(key, jnp.zeros((1, seq), jnp.int32))

  return Programs(
    model=model,
    tx=tx,
    init=jax.jit(init),
    opt_init=jax.jit(tx.init),
    chunk=jax.jit(chunk, donate_argnums=(0, 1)),
    loss=jax.jit(summed_loss),
    probe=jax.jit(probe),
    isometry=jax.jit(
      lambda v: stiefax.diagnostics.isometry_error(v, frames=stiefax.layouts.qk_frames())
    ),
  )


def _sown(tree: Any, name: str, prefix: tuple = ()) -> list:
  """``[(path, value)]`` of every value sown as ``name`` in an intermediates tree."""
  out: list = []
  for k, v in tree.items():
    if k == name:
      out.extend((prefix, x) for x in v)
    elif isinstance(v, dict):
      out.extend(_sown(v, name, (*prefix, k)))
  return out


def _throughput(hist: dict, config: LMConfig) -> Optional[float]:
  """Training tokens per second, from the chunks after the first (which compiles)."""
  steps, times = np.diff(hist["step"]), np.asarray(hist["chunk_time"][1:])
  if len(times) < 2:
    return None
  sec = times[1:].sum()
  return float(steps[1:].sum() * config.batch * config.seq / sec) if sec > 0 else None


def init_params(arm: Arm, config: LMConfig, seed: int) -> Any:
  """The seed's init; the frames snapped onto St(d, r) (polar factor) for Stiefel arms.

  Every non-frame parameter depends on the seed only (shared by every arm and rate).
  """
  variables = programs(arm, config).init(jax.random.key(seed))
  if arm.orthonormal:
    params = stiefax.flax.project_params(
      {"params": variables["params"]}, frames=stiefax.layouts.qk_frames()
    )
    variables = {**variables, **params}
  return variables


def _held_out_bpb(progs: Programs, variables, windows: np.ndarray) -> float:
  total = 0.0
  for s in range(0, len(windows), _EVAL_CHUNK):
    total += float(progs.loss(variables, jnp.asarray(windows[s : s + _EVAL_CHUNK])))
  return total / (windows.shape[0] * (windows.shape[1] - 1)) / BITS


_HISTORY = (
  "step",
  "train_bpb",
  "val_bpb",
  "max_logit",
  "entropy",
  "isometry",
  "lr_adamw",
  "chunk_time",
)


def train(
  arm: Arm,
  config: LMConfig,
  seed: int,
  *,
  progress: bool = True,
  checkpoints: Any = None,
  checkpoint_every: int = 0,
  desc: str = "",
) -> dict:
  """Trains one (arm, seed); returns ``{"metrics", "history", "wall_time", ...}``.

  ``checkpoints``: a :class:`~stiefax.experiments.checkpoints.Checkpoints` to
  resume from and save to (every ``checkpoint_every`` steps, a multiple of
  ``eval_every``; 0: only on a stop request). A stop request raises
  :class:`~stiefax.experiments.stopping.Stopped` after saving; a damaged checkpoint
  raises :class:`~stiefax.experiments.checkpoints.DamagedCheckpoint`.
  """
  start = time.perf_counter()
  corpus = data_lib.load()
  progs = programs(arm, config)
  val = data_lib.windows(corpus.val, config.seq, config.val_windows)
  probe_x = jnp.asarray(val[: config.probe_windows])
  train_data = jnp.asarray(corpus.train)
  positions = data_lib.train_positions(
    corpus.train.size, config.seq, config.steps, config.batch, seed
  )
  variables = init_params(arm, config, seed)
  opt_state = progs.opt_init(variables)
  hist: dict[str, list] = {k: [] for k in _HISTORY}
  lr = schedule(config, config.adamw_lr)

  def evaluate(step: int, train_bpb: float, seconds: float) -> None:
    hist["chunk_time"].append(seconds)
    hist["step"].append(step)
    hist["train_bpb"].append(train_bpb)
    hist["val_bpb"].append(_held_out_bpb(progs, variables, val))
    attn = progs.probe(variables, probe_x)
    hist["max_logit"].append(float(attn["max_logit"]))
    hist["entropy"].append(float(attn["entropy"]))
    hist["isometry"].append(float(progs.isometry(variables)))
    hist["lr_adamw"].append(float(lr(step)))

  step, earlier_wall, resumed_from, diverged = 0, 0.0, None, False
  latest = checkpoints.latest_epoch() if checkpoints is not None else None
  if latest is not None:
    variables, opt_state, meta = checkpoints.restore(latest, variables, opt_state)
    if meta.get("seed") != seed or meta.get("step") != latest:
      raise ValueError(
        f"checkpoint {checkpoints.directory} holds seed {meta.get('seed')} at step"
        f" {meta.get('step')}, not seed {seed} at {latest}"
      )
    hist, earlier_wall, step = meta["history"], float(meta["wall_time"]), latest
    resumed_from = latest
    print(f"  {desc}: resuming from the checkpoint at step {latest}", file=sys.stderr)
  else:
    evaluate(0, float("nan"), 0.0)
  init_bpb = hist["val_bpb"][0]

  def save() -> None:
    meta = {
      "step": step,
      "seed": seed,
      "arm": arm.name,
      "history": hist,
      "wall_time": earlier_wall + time.perf_counter() - start,
    }
    checkpoints.save(step, variables, opt_state, meta)

  bar = progress_bar(config.steps, desc=desc, unit="step", enabled=progress, initial=step)
  with StopRequest("stiefax lm") as stop:
    while step < config.steps:
      n = min(config.eval_every, config.steps - step)
      t0 = time.perf_counter()
      variables, opt_state, losses = progs.chunk(
        variables, opt_state, train_data, jnp.asarray(positions[step : step + n])
      )
      losses = np.asarray(jax.device_get(losses), np.float64)
      seconds = time.perf_counter() - t0
      step += n
      bar.update(n)
      if not np.all(np.isfinite(losses)):
        diverged = True
        hist["step"].append(step)
        hist["train_bpb"].append(float("nan"))
        for k in ("val_bpb", "max_logit", "entropy", "isometry", "lr_adamw"):
          hist[k].append(float("nan"))
        hist["chunk_time"].append(seconds)
        break
      evaluate(step, float(np.mean(losses)) / BITS, seconds)
      bar.set_postfix(val=f"{hist['val_bpb'][-1]:.3f}", logit=f"{hist['max_logit'][-1]:.1f}")
      due = stop.requested or (checkpoint_every and step % checkpoint_every == 0)
      if checkpoints is not None and step < config.steps and due:
        save()
      if stop.requested and step < config.steps:
        bar.close()
        print(
          f"stiefax lm: stopped {desc} at step {step}"
          f"{'; checkpoint saved' if checkpoints is not None else ''}; the same command"
          " resumes it",
          file=sys.stderr,
          flush=True,
        )
        raise Stopped(stop.signum)
  bar.close()
  if checkpoints is not None:
    checkpoints.close()
  test_bpb = float("nan")
  if not diverged:
    test = data_lib.windows(corpus.test, config.seq, config.test_windows)
    test_bpb = _held_out_bpb(progs, variables, test)
  wall = earlier_wall + time.perf_counter() - start
  finite = [v for v in hist["max_logit"] if math.isfinite(v)]
  metrics = {
    "val_bpb": hist["val_bpb"][-1],
    "test_bpb": test_bpb,
    "init_val_bpb": init_bpb,
    "train_bpb": hist["train_bpb"][-1],
    "max_logit": hist["max_logit"][-1],
    "max_logit_max": max(finite) if finite else float("nan"),
    "entropy": hist["entropy"][-1],
    "isometry": hist["isometry"][-1],
    "diverged": diverged,
    "tokens_per_second": _throughput(hist, config),
    "frame_lr": frame_rate(arm, config),
  }
  return {
    "metrics": metrics,
    "history": hist,
    "wall_time": wall,
    "resumed_from": resumed_from,
  }
