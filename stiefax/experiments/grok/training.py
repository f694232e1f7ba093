"""Training a grokking run: the jitted programs and the loop.

Every run is full-batch: one compiled program (``jax.lax.scan``) trains ``eval_every``
steps and evaluates. A run checkpoints
(:class:`~stiefax.experiments.checkpoints.Checkpoints`) and resumes to the result of an
uninterrupted run; several seeds of an arm can train as one program (``jax.vmap``).

An arm's attention (``Arm.attention``: plain, QK-norm or σReparam) picks the attention
layer (:func:`stiefax.experiments.attention.attention_module`). σReparam's power-iteration
vectors are a non-trained variable collection inside the parameter tree: each training
step advances them, evaluation reads them, and checkpoints hold them with the
parameters. Every evaluation also records the attention probe (largest logit and mean
entropy on the training batch, :func:`stiefax.experiments.attention.probe`), computed by
a program of its own so that the training and evaluation programs are unchanged.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

import stiefax
from stiefax.experiments import attention as attention_lib
from stiefax.experiments import optim
from stiefax.experiments.arms import Arm
from stiefax.experiments.checkpoints import Checkpoints
from stiefax.experiments.flags import CommandError
from stiefax.experiments.grok.config import ARMS
from stiefax.experiments.grok.config import GrokConfig
from stiefax.experiments.grok.config import hyper
from stiefax.experiments.grok.config import recorded
from stiefax.experiments.grok.config import run_metrics
from stiefax.experiments.grok.data import make_data
from stiefax.experiments.grok.model import make_model
from stiefax.experiments.grok.runs import arm_definition
from stiefax.experiments.progress import progress_bar
from stiefax.experiments.stopping import OutOfTime
from stiefax.experiments.stopping import Stopped
from stiefax.experiments.stopping import StopRequest

__all__ = [
  "programs",
  "init_params",
  "probe_program",
  "stack",
  "unstack",
  "train",
  "train_seeds",
  "device_name",
]


def _query_labels(params: optax.Params) -> Any:
  return stiefax.layouts.qk_labels(params, modules=("query",))


def _key_labels(params: optax.Params) -> Any:
  return stiefax.layouts.qk_labels(params, modules=("key",))


def _trained(variables: optax.Params) -> optax.Params:
  """``variables`` without the non-trained state collection (the same tree if none)."""
  if not attention_lib.has_state(variables):
    return variables
  return {k: v for k, v in variables.items() if k != attention_lib.SIGMA_COLLECTION}


@functools.cache
def programs(
  config: GrokConfig, arm: Arm, vmapped: bool = False, donate: bool = True
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
  """Jitted ``(init_state, train_chunk, evaluate)``, shared by every seed of an arm.

  ``train_chunk`` is one compiled program: ``jax.lax.scan`` over ``eval_every``
  full-batch steps, followed by the evaluation. ``vmapped``: ``train_chunk`` and
  ``evaluate`` take every argument with a leading seed axis (``jax.vmap``), so all the
  seeds of an arm train as one program (``init_state`` stays per seed). ``donate``:
  ``train_chunk`` reuses the buffers of its parameter and state arguments.

  For an arm with state (σReparam), a training step's forward pass advances the state
  (:func:`stiefax.experiments.attention.apply_train`) and the step stores it in the new
  parameters; evaluation reads it. The effective learning rates leave it out.
  """
  model = make_model(config, arm.attention)
  tx = optim.make_optimizer(arm, hyper(arm, config))

  def loss_and_acc(params: optax.Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    logits: jax.Array = model.apply(params, x)  # type: ignore[assignment]  # no mutable collections: an array
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))
    acc = jnp.mean((jnp.argmax(logits, axis=-1) == y).astype(jnp.float32))
    return loss, acc

  def evaluate(params: optax.Params, data: dict[str, jax.Array]) -> dict[str, jax.Array]:
    loss, train_acc = loss_and_acc(params, data["x_train"], data["y_train"])
    _, test_acc = loss_and_acc(params, data["x_test"], data["y_test"])
    return {
      "train_loss": loss,
      "train_acc": train_acc,
      "test_acc": test_acc,
      "isometry": stiefax.diagnostics.isometry_error(params, _query_labels),
      "isometry_key": stiefax.diagnostics.isometry_error(params, _key_labels),
    }

  def stateful_loss(params: optax.Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Any]:
    logits, state = attention_lib.apply_train(model, params, x)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y)), state

  def step(carry: tuple[Any, Any, Any], _: None) -> tuple[tuple[Any, Any, Any], dict]:
    params, opt_state, data = carry
    state = None
    if attention_lib.has_state(params):  # decided when tracing: the arm's attention
      grads, state = jax.grad(stateful_loss, has_aux=True)(params, data["x_train"], data["y_train"])
    else:
      loss_fn = lambda p: loss_and_acc(p, data["x_train"], data["y_train"])[0]
      grads = jax.grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    new_params = attention_lib.with_state(optax.apply_updates(params, updates), state)
    # Effective learning rate per group (W_Q/W_K frames, other matrices, vectors),
    # keeping the parameter/update inner product (stiefax.covariance).
    summary = stiefax.elr.update_summary(
      _trained(params), _trained(new_params), stiefax.layouts.qk_labels
    )
    elr = {f"elr_{k.split('/')[0]}": v for k, v in summary.items() if k.endswith("/elr")}
    return (new_params, opt_state, data), elr

  def train_chunk(
    params: optax.Params, opt_state: optax.OptState, data: dict[str, jax.Array]
  ) -> tuple[optax.Params, optax.OptState, dict[str, jax.Array]]:
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


@functools.cache
def probe_program(config: GrokConfig, arm: Arm, vmapped: bool = False) -> Callable[..., Any]:
  """Jitted ``(params, data) -> {"max_logit", "attn_entropy"}`` on the training batch.

  The attention probe (:func:`stiefax.experiments.attention.probe`): the largest
  ``|q.k| / sqrt(r)`` and the mean attention entropy over layers, training sequences,
  heads and queries. A program of its own, reading the parameters ``train_chunk``
  returns, so that the training and evaluation programs are those of a run without it.
  ``vmapped``: every argument has a leading seed axis.
  """
  model = make_model(config, arm.attention)

  def probe(params: optax.Params, data: dict[str, jax.Array]) -> dict[str, jax.Array]:
    got = attention_lib.probe(model, params, data["x_train"])
    return {"max_logit": got["max_logit"], "attn_entropy": got["entropy"]}

  return jax.jit(jax.vmap(probe) if vmapped else probe)


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
  saves one every ``checkpoint_every`` epochs (0: never) and, on SIGINT or SIGTERM,
  saves one at the next evaluation and raises :class:`Stopped` (a
  ``KeyboardInterrupt``). A damaged checkpoint raises
  :class:`~stiefax.experiments.checkpoints.DamagedCheckpoint`. The arithmetic of a resumed run
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


def stack(trees: Sequence[Any]) -> Any:
  """The trees stacked along a new leading axis (the seed axis of ``vmap``)."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree: Any, n: int) -> list:
  """The ``n`` trees along the leading axis of ``tree``."""
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
  checkpoint_seconds: float = 0.0,
  deadline: Optional[float] = None,
) -> list[dict]:
  """Trains one arm from several seeds in step; returns one run record per seed.

  ``vmap``: the seeds are a batch axis of one compiled program (``jax.vmap`` of the
  per-seed program: the same arithmetic, batched), else there must be one seed. Every
  seed's checkpoints (see :func:`train`) are its own, so a run started with or without
  ``vmap`` resumes either way; the seeds must have been checkpointed at the same epoch.

  Checkpoints are saved every ``checkpoint_every`` epochs and, with
  ``checkpoint_seconds`` > 0, at the first evaluation that many seconds after the last
  save (or the start), so that a run killed at any moment loses at most that much
  training. ``deadline`` (a :func:`time.monotonic` value): when the next evaluation
  window and a save would end past it, the seeds are checkpointed and
  :class:`~stiefax.experiments.stopping.OutOfTime` is raised. Neither changes the
  arithmetic: a resumed run is the uninterrupted run.
  """
  seeds = [int(s) for s in seeds]
  if not vmap and len(seeds) != 1:
    raise ValueError(f"train_seeds: {len(seeds)} seeds need vmap=True.")
  n = len(seeds)
  arm = ARMS[arm_name]
  start = time.perf_counter()
  datas = [{k: jnp.asarray(v) for k, v in make_data(config, s).items()} for s in seeds]
  params = [init_params(config, arm, s) for s in seeds]
  opt_init, train_chunk, evaluate = programs(config, arm, vmap)
  probe = probe_program(config, arm, vmap)
  opt_state = [opt_init(p) for p in params]
  histories: list[dict[str, list]] = [
    {k: [] for k in ("epoch", "train_acc", "test_acc", "train_loss", "isometry", "isometry_key")}
    for _ in seeds
  ]

  def record(epoch: int, ev: dict[str, Any]) -> dict[str, Any]:
    ev = jax.device_get(ev)
    for i, history in enumerate(histories):
      history["epoch"].append(int(epoch))
      for k, v in ev.items():
        # ELR histories start at the first chunk (no update before epoch 0).
        history.setdefault(k, []).append(float(v[i] if vmap else v))
    return {k: v[0] if vmap else v for k, v in ev.items()}

  epoch, earlier_wall, resumed_from, probing = 0, [0.0] * n, None, True
  ckpts: Sequence[Checkpoints] = checkpoints or ()
  reached = {c.latest_epoch() for c in ckpts} or {None}
  if len(reached) > 1:
    raise CommandError(
      f"{arm_name} seeds {seeds}: checkpoints at different epochs"
      f" {sorted(reached, key=str)}; train them in separate commands."
    )
  latest = reached.pop()
  if latest is not None:
    for i, s in enumerate(seeds):
      restored = ckpts[i].restore(latest, params[i], opt_state[i])
      # Placed as fresh arrays are (not committed to a device), so that a run resumed in
      # the process that compiled its programs reuses them.
      params[i], opt_state[i] = jax.tree.map(jnp.asarray, jax.device_get(restored[:2]))
      meta = restored[2]
      if meta.get("seed") != s or meta.get("epoch") != latest:
        raise CommandError(
          f"checkpoint {ckpts[i].directory} holds seed {meta.get('seed')} at epoch"
          f" {meta.get('epoch')}, not seed {s} at {latest}; move it away to train this"
          " run afresh."
        )
      histories[i], earlier_wall[i] = meta["history"], float(meta["wall_time"])
    # A checkpoint from before the attention probe was recorded resumes without it.
    probing = all("max_logit" in h for h in histories)
    epoch = resumed_from = latest
    print(
      f"  {arm_name} seed{'s' * (n > 1)} {','.join(map(str, seeds))}: resuming from the"
      f" checkpoint at epoch {latest}",
      flush=True,
    )
  if vmap:
    params, opt_state = stack(params), stack(opt_state)
    data = stack(datas)
  else:
    params, opt_state, data = params[0], opt_state[0], datas[0]

  def evaluation(ev: dict[str, Any]) -> dict[str, Any]:
    """The evaluation ``ev`` of ``params`` with the attention probe (if recorded)."""
    return {**ev, **probe(params, data)} if probing else ev

  if latest is None:
    record(0, evaluation(evaluate(params, data)))

  def save() -> None:
    per_seed = zip(unstack(params, n), unstack(opt_state, n)) if vmap else [(params, opt_state)]
    for i, (p, o) in enumerate(per_seed):
      ckpts[i].save(
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
  bar = progress_bar(
    config.epochs, desc=desc, unit="epoch", enabled=progress, initial=epoch, leave=True
  )
  last_save = time.monotonic()  # wall-time checkpoints count from here
  save_s = 0.0  # the longest save so far: a stop at the deadline must leave time for one
  window_s, windows = 0.0, 0  # the last window's time; the first one compiles: not counted
  with StopRequest("stiefax grok") as stop:
    while epoch < config.epochs:
      window_start = time.monotonic()
      params, opt_state, ev = train_chunk(params, opt_state, data)
      epoch += config.eval_every
      ev = record(epoch, evaluation(ev))  # reads the arrays back: the window is done
      now = time.monotonic()
      bar.set_postfix(
        train=f"{ev['train_acc']:.3f}",
        test=f"{ev['test_acc']:.3f}",
        iso=f"{ev['isometry']:.1e}",
        refresh=False,
      )
      bar.update(config.eval_every)
      unfinished = epoch < config.epochs
      out_of_time = unfinished and deadline is not None and now + window_s + save_s > deadline
      windows += 1
      window_s = now - window_start if windows > 1 else 0.0
      if (
        ckpts
        and unfinished
        and (
          stop.requested
          or out_of_time
          or (checkpoint_every and epoch % checkpoint_every == 0)
          or (checkpoint_seconds > 0 and now - last_save >= checkpoint_seconds)
        )
      ):
        save()
        last_save = time.monotonic()
        save_s = max(save_s, last_save - now)
      if out_of_time and not stop.requested:
        bar.close()
        where = f"; checkpoint at epoch {epoch}" if ckpts else ""
        print(
          f"stiefax grok: time limit: stopped {desc} at epoch {epoch}{where}; the same"
          " command resumes it",
          file=sys.stderr,
          flush=True,
        )
        raise OutOfTime(epoch)
      if stop.requested and epoch < config.epochs:
        bar.close()
        where = f"; checkpoint at epoch {epoch}" if ckpts else ""
        print(
          f"stiefax grok: stopped {desc} at epoch {epoch}{where}; the same command resumes it",
          file=sys.stderr,
          flush=True,
        )
        raise Stopped(stop.signum)
  bar.close()
  for c in ckpts:
    c.close()
  wall = time.perf_counter() - start
  per_seed = unstack(params, n) if vmap else [params]
  records = []
  for i, s in enumerate(seeds):
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(_trained(per_seed[i])))
    records.append(
      {
        "experiment": "grok",
        "arm": arm_name,
        "seed": s,
        "config": {
          **recorded(config),
          "arm": arm_definition(arm),
          "n_train": int(datas[i]["y_train"].shape[0]),
          "n_test": int(datas[i]["y_test"].shape[0]),
          "n_params": n_params,
          "jax_version": jax.__version__,
          "backend": jax.default_backend(),
          "device": device_name(),
        },
        "metrics": run_metrics(histories[i], config),
        "history": histories[i],
        "wall_time": earlier_wall[i] + wall,  # with vmap: the batch's time, shared
        "vmapped_seeds": seeds if vmap else None,
        "resumed_from": resumed_from,
      }
    )
  return records


def device_name() -> str:
  """The device the runs train on, as the run records give it: its platform and kind
  (``"gpu NVIDIA H100 80GB HBM3"``; ``"cpu cpu"`` on a CPU).

  Returns:
    The first device's platform and ``device_kind``, one space apart.
  """
  device = jax.devices()[0]
  return f"{device.platform} {getattr(device, 'device_kind', '')}".strip()


@functools.cache
def _jitted_init(config: GrokConfig, attention: str = "plain") -> Callable[..., Any]:
  return jax.jit(make_model(config, attention).init)


def init_params(config: GrokConfig, arm: Arm, seed: int) -> optax.Params:
  """The arm's starting point: the seed's default init, frames snapped if Stiefel.

  The variables of the model (``{"params": ...}``, with the ``sigma_reparam`` state
  collection for a σReparam arm).
  """
  params = _jitted_init(config, arm.attention)(jax.random.key(seed), jnp.zeros((1, 3), jnp.int32))
  labels = stiefax.layouts.qk_labels(params)
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
