"""Training one (arm, seed) of ``stiefax lm``: jitted chunks, evaluation, resume.

Every ``eval_every`` steps is one compiled program (``jax.lax.scan`` over the steps,
batches gathered on the device from the seed's window positions), followed by the
evaluation: the validation loss in bits per byte, the attention probe (largest logit
and mean entropy over the first ``probe_windows`` validation windows, also per layer
and head) and the isometry error of the query/key frames; then what the arms of study
2 (docs/lm.md) need: each pre-attention norm's largest gain ``max |1 + s|``, the
temperatures, each head's certified logit bound
(:func:`stiefax.experiments.lm.model.logit_bounds`) and, for a capped scalar-moment
Riemannian Adam, the frame step's ``|eta|_F / (tau sqrt(r))`` before the cap over the
chunk's steps and frames (its mean, its largest value and the fraction of frame steps
the cap shortened). The test loss is measured once, at the end.
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
from typing import Callable
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

import stiefax
from stiefax.experiments import attention
from stiefax.experiments import optim
from stiefax.experiments.arms import Arm
from stiefax.experiments.checkpoints import meta_problem
from stiefax.experiments.lm import data as data_lib
from stiefax.experiments.lm.config import LMConfig
from stiefax.experiments.lm.config import frame_rate
from stiefax.experiments.lm.config import hyper
from stiefax.experiments.lm.config import schedule
from stiefax.experiments.lm.model import DecoderLM
from stiefax.experiments.lm.model import logit_bounds
from stiefax.experiments.progress import progress_bar
from stiefax.experiments.stopping import Stopped
from stiefax.experiments.stopping import StopRequest

__all__ = ["Programs", "programs", "init_params", "train", "BITS"]

#: Nats per bit: a loss in nats per byte divided by this is bits per byte.
BITS = math.log(2.0)

_EVAL_CHUNK = 64  # validation/test windows per forward pass

#: A training step's carry: (variables, optimizer state, the training bytes).
_Carry = tuple[optax.Params, optax.OptState, jax.Array]


@dataclasses.dataclass(frozen=True)
class Programs:
  """The jitted programs of one (arm, config), shared by its seeds."""

  model: Any
  tx: Any
  init: Any  # key -> variables
  opt_init: Any  # variables -> opt_state
  chunk: Any  # (variables, opt_state, train, positions) -> (variables, opt_state, per-step)
  loss: Any  # (variables, windows) -> summed loss in nats over the windows' targets
  probe: Any  # (variables, windows) -> {"max_logit", "entropy"}
  isometry: Any  # variables -> max |W^T W - I| over the query/key frames
  capped: bool = False  # whether chunk's per-step output holds the frame-step cap ratios


@functools.lru_cache(maxsize=16)
def programs(config: LMConfig, arm: Arm) -> Programs:
  """The model, optimizer and jitted programs of ``arm`` at ``config``."""
  model = DecoderLM(config.model, arm.attention, arm.temperature, arm.qk_input, arm.frame_gain)
  tx = optim.make_optimizer(arm, hyper(arm, config))
  seq = config.seq
  cap_ratio = _cap_ratio_fn(arm, config)

  def loss_fn(variables: optax.Params, windows: jax.Array) -> tuple[jax.Array, Any]:
    logits, state = attention.apply_train(model, variables, windows[:, :-1])
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:])
    return jnp.mean(ce), state

  def step(carry: _Carry, starts: jax.Array) -> tuple[_Carry, tuple[jax.Array, jax.Array]]:
    variables, opt_state, train = carry
    idx = starts[:, None] + jnp.arange(seq + 1)[None, :]
    windows = train[idx].astype(jnp.int32)
    (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(variables, windows)
    updates, opt_state = tx.update(grads, opt_state, variables)
    variables = attention.with_state(optax.apply_updates(variables, updates), state)
    ratios = cap_ratio(opt_state) if cap_ratio is not None else jnp.zeros((1,), jnp.float32)
    return (variables, opt_state, train), (loss, ratios)

  def chunk(
    variables: optax.Params, opt_state: optax.OptState, train: jax.Array, positions: jax.Array
  ) -> tuple[optax.Params, optax.OptState, tuple[jax.Array, jax.Array]]:
    (variables, opt_state, _), per_step = jax.lax.scan(
      step, (variables, opt_state, train), positions
    )
    return variables, opt_state, per_step

  def summed_loss(variables: optax.Params, windows: jax.Array) -> jax.Array:
    logits = model.apply(variables, windows[:, :-1])
    return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:]))

  def probe(variables: optax.Params, windows: jax.Array) -> dict[str, jax.Array]:
    _, inter = model.apply(variables, windows[:, :-1], mutable=["intermediates"])
    sown = {
      name: jnp.stack([v for _, v in _sown(inter["intermediates"], name)])
      for name in ("max_logit", "entropy", "head_max_logit", "head_entropy")
    }
    return {
      "max_logit": jnp.max(sown["max_logit"]),
      "entropy": jnp.mean(sown["entropy"]),
      "head_max_logit": sown["head_max_logit"],  # (depth, heads)
      "head_entropy": sown["head_entropy"],  # (depth, heads)
    }

  def init(key: jax.Array) -> optax.Params:
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
    capped=cap_ratio is not None,
  )


def _cap_ratio_fn(arm: Arm, config: LMConfig) -> Optional[Callable[[Any], jax.Array]]:
  """``opt_state -> |eta|_F / (tau sqrt(r))`` of every frame at the step just taken, or
  None where the frame rule is not a capped scalar-moment Riemannian Adam, or where the
  arm also has a matrix rule.

  After an update the state holds that step's count ``t``, first moment ``m`` and
  scalar second moment ``v``; the step before the cap is ``eta = lr(t - 1) m_hat /
  (sqrt(v_hat) + eps)`` (:func:`stiefax.geometry.adam_coefficient`), and the cap
  shortens it exactly when the ratio exceeds 1.
  """
  opts = dict(arm.options)
  peak = frame_rate(arm, config)
  max_norm = opts.get("max_norm", config.max_norm)
  if arm.frames != "riemannian_adam" or opts.get("moment", "scalar") != "scalar":
    return None
  if arm.matrices != "adamw":  # B2-H: its frames' moments sit in two parts of the state
    return None
  if not peak or max_norm is None:
    return None
  lr = schedule(config, peak)
  b1, b2, eps = opts.get("b1", config.b1), opts.get("b2", config.b2), opts.get("eps", config.eps)
  frames = stiefax.layouts.qk_frames()
  is_moment = lambda x: isinstance(x, stiefax.ScalarMomentState)

  def ratios(opt_state: optax.OptState) -> jax.Array:
    moments = [s for s in jax.tree.leaves(opt_state, is_leaf=is_moment) if is_moment(s)]
    if len(moments) != 1:
      raise ValueError(f"arm {arm.name}: found {len(moments)} scalar moment states, not one")
    state = moments[0]
    step_lr = lr(state.count - 1)
    out = []
    mus = jax.tree_util.tree_flatten_with_path(state.mu)[0]
    for (path, mu), nu in zip(mus, jax.tree.leaves(state.nu)):
      spec = stiefax.layouts.resolve_frames(frames, path, mu)
      m = spec.to_frames(mu).astype(jnp.float32)
      m_norm = jnp.sqrt(jnp.sum(jnp.square(m), axis=(-2, -1)))
      coef = stiefax.geometry.adam_coefficient(nu, state.count, b1, b2, eps)
      limit = max_norm * math.sqrt(m.shape[-1])
      out.append((jnp.abs(step_lr * coef) * m_norm / limit).reshape(-1))
    return jnp.concatenate(out)

  return ratios


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


def init_params(config: LMConfig, arm: Arm, seed: int) -> Any:
  """The seed's init; the frames snapped onto St(d, r) (polar factor) for Stiefel arms.

  Every non-frame parameter depends on the seed only (shared by every arm and rate).
  """
  variables = programs(config, arm).init(jax.random.key(seed))
  if arm.orthonormal:
    params = stiefax.flax.project_params(
      {"params": variables["params"]}, frames=stiefax.layouts.qk_frames()
    )
    variables = {**variables, **params}
  return variables


def _study2_entries(arm: Arm, config: LMConfig, variables: Any, attn: dict, ratios: Any) -> dict:
  """The history entries of study 2 at one evaluation (module docstring).

  ``logit_bound`` is None where no bound follows from the parameters (QK-norm and
  σReparam arms); ``temperature`` where the arm has none; the cap entries where the
  frame rule has no cap (``ratios`` None, :attr:`Programs.capped`).
  """
  params = variables["params"]
  c = config.model
  layers = [params[f"layer_{i}"] for i in range(c.depth)]
  norm_gain = [
    float(np.max(np.abs(1.0 + np.asarray(lay["pre_attention_norm"]["scale"])))) for lay in layers
  ]
  temps = None
  if arm.temperature:
    temps = [np.asarray(lay["attn"]["temperature"], np.float64).tolist() for lay in layers]
  bound = None
  if arm.attention == "plain":
    bound = logit_bounds(params, c, arm.qk_input).tolist()
  out = {
    "head_max_logit": np.asarray(attn["head_max_logit"], np.float64).tolist(),
    "head_entropy": np.asarray(attn["head_entropy"], np.float64).tolist(),
    "norm_gain": norm_gain,
    "temperature": temps,
    "logit_bound": bound,
    "cap_ratio_mean": None,
    "cap_ratio_max": None,
    "cap_fraction": None,
  }
  if ratios is not None:
    r = np.asarray(jax.device_get(ratios), np.float64)
    out["cap_ratio_mean"] = float(np.mean(r))
    out["cap_ratio_max"] = float(np.max(r))
    out["cap_fraction"] = float(np.mean(r > 1.0))
  return out


def _held_out_bpb(progs: Programs, variables: optax.Params, windows: np.ndarray) -> float:
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
  # Study 2 (docs/lm.md): per layer, or per layer and head; None where not defined.
  "head_max_logit",
  "head_entropy",
  "norm_gain",
  "temperature",
  "logit_bound",
  "cap_ratio_mean",
  "cap_ratio_max",
  "cap_fraction",
)

#: History entries every checkpoint holds (the others are filled in on resuming).
_RESUMED = ("step", "train_bpb", "val_bpb", "max_logit")

#: History entries that a diverged chunk records as NaN (the others as None).
_NUMERIC = ("val_bpb", "max_logit", "entropy", "isometry", "lr_adamw")


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
  progs = programs(config, arm)
  val = data_lib.windows(corpus.val, config.seq, config.val_windows)
  probe_x = jnp.asarray(val[: config.probe_windows])
  train_data = jnp.asarray(corpus.train)
  positions = data_lib.train_positions(
    corpus.train.size, config.seq, config.steps, config.batch, seed
  )
  variables = init_params(config, arm, seed)
  opt_state = progs.opt_init(variables)
  hist: dict[str, list] = {k: [] for k in _HISTORY}
  lr = schedule(config, config.adamw_lr)

  def evaluate(step: int, train_bpb: float, seconds: float, ratios: Any = None) -> None:
    hist["chunk_time"].append(seconds)
    hist["step"].append(step)
    hist["train_bpb"].append(train_bpb)
    hist["val_bpb"].append(_held_out_bpb(progs, variables, val))
    attn = progs.probe(variables, probe_x)
    hist["max_logit"].append(float(attn["max_logit"]))
    hist["entropy"].append(float(attn["entropy"]))
    hist["isometry"].append(float(progs.isometry(variables)))
    hist["lr_adamw"].append(float(lr(step)))
    for k, v in _study2_entries(arm, config, variables, attn, ratios).items():
      hist[k].append(v)

  step, earlier_wall, resumed_from, diverged = 0, 0.0, None, False
  latest = checkpoints.latest_epoch() if checkpoints is not None else None
  if latest is not None:
    fits = functools.partial(
      meta_problem, seed=seed, step=latest, step_key="step", history=_RESUMED
    )
    variables, opt_state, meta = checkpoints.restore(latest, variables, opt_state, fits)
    hist, earlier_wall, step = meta["history"], float(meta["wall_time"]), latest
    for k in _HISTORY:  # a checkpoint written before an entry existed
      hist.setdefault(k, [None] * len(hist["step"]))
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
      variables, opt_state, (losses, ratios) = progs.chunk(
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
        for k in _HISTORY:
          if k in _NUMERIC:
            hist[k].append(float("nan"))
          elif k not in ("step", "train_bpb", "chunk_time"):
            hist[k].append(None)
        hist["chunk_time"].append(seconds)
        break
      evaluate(step, float(np.mean(losses)) / BITS, seconds, ratios if progs.capped else None)
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
    # Still inside the request: a signal during the last chunk or the test pass lets
    # this run finish and be written, and stops the command before its next run.
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
