"""The protocols of ``stiefax patches``: run (with ``--select-lr``), sweep-n, sweep-eps.

Each protocol (:data:`PROTOCOL_FNS`) trains the runs it is asked for in a
:class:`Context` that :func:`stiefax.experiments.patches.command.run` builds.

Every run is one JSON file in ``--out`` (:mod:`stiefax.experiments.store`: written
atomically, never overwritten); a run whose file holds the same configuration is not
trained again, and a lock on ``<run>.lock`` lets several processes share one ``--out``.
A command runs its protocol in two passes: the first trains every run no other process
holds and passes over the held ones; the second, only if the first passed over some,
waits for each of those and reads its result (or trains it, if its holder stopped).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import sys
from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import flags
from stiefax.experiments import store
from stiefax.experiments.arms import Arm
from stiefax.experiments.flags import CommandError
from stiefax.experiments.flags import os_error
from stiefax.experiments.patches import data as data_lib
from stiefax.experiments.patches import images as images_lib
from stiefax.experiments.patches import runs
from stiefax.experiments.patches.config import ADAM_ARMS
from stiefax.experiments.patches.config import EXPERIMENT
from stiefax.experiments.patches.config import Setting
from stiefax.experiments.patches.config import arm_by_name
from stiefax.experiments.patches.config import arm_hparams
from stiefax.experiments.patches.training import Trainer
from stiefax.experiments.patches.training import train
from stiefax.experiments.protocol import record_problem

__all__ = ["Context", "PROTOCOL_FNS", "arm_map", "make_setting"]


@dataclasses.dataclass
class Context:
  """What every protocol reads: the arguments, the images and where runs go."""

  args: argparse.Namespace
  images: images_lib.Images
  out: pathlib.Path
  cache: Optional[pathlib.Path]
  progress: bool
  defaults: dict
  # First pass: runs held by another process are passed over (their names go to
  # ``deferred``); second pass: they are waited for. ``done`` holds every run this
  # command has trained or read, by file name, so the second pass never repeats one.
  defer_held: bool = False
  deferred: list = dataclasses.field(default_factory=list)
  done: dict = dataclasses.field(default_factory=dict)


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


def make_setting(
  args: argparse.Namespace, dflt: dict, n_train: int, epochs: int, eps: Optional[float] = None
) -> Setting:
  """The :class:`Setting` of ``args`` at ``n_train``, ``epochs`` (and ``eps``)."""
  s = Setting(
    n_train=n_train,
    epochs=epochs,
    batch_size=args.batch_size,
    warmup_epochs=args.warmup_epochs,
    depth=args.depth,
    d=dflt["d"],
    heads=dflt["heads"],
    head_dim=dflt["head_dim"],
    mlp_ratio=args.mlp_ratio,
    adamw_lr=args.adamw_lr,
    weight_decay=args.weight_decay,
    eps=args.eps if eps is None else eps,
    max_norm=args.max_norm,
    penalty=args.penalty,
    polar=args.polar,
  )
  if s.heads * s.head_dim > s.d:
    raise CommandError(
      f"--heads {s.heads} x --head-dim {s.head_dim} = {s.heads * s.head_dim} exceeds"
      f" --d {s.d}: each head's W_Q, W_K frame lies in St(d, r) and the paper's heads"
      f" need H*r <= d; lower --heads or --head-dim"
    )
  return s


def _data(ctx: Context, n_train: int, n_val: int) -> data_lib.PatchData:
  a, dflt = ctx.args, ctx.defaults
  return data_lib.prepare(
    ctx.images,
    n_train=n_train,
    n_val=n_val,
    patch=dflt["patch"],
    d=dflt["d"],
    whiten_eps=a.whiten_eps,
    pca_samples=a.pca_samples,
    cache_dir=ctx.cache,
    order_seed=a.order_seed,
  )


def _config(
  ctx: Context,
  protocol: str,
  arm: Arm,
  setting: Setting,
  hp: dict,
  data: data_lib.PatchData,
  split: str,
) -> dict:
  a = ctx.args
  return runs.run_config(
    protocol,
    arm,
    setting,
    hp,
    runs.DataFacts.of(ctx.images, data),
    data=a.data,
    patch=ctx.defaults["patch"],
    whiten_eps=a.whiten_eps,
    pca_samples=a.pca_samples,
    order_seed=a.order_seed,
    eval_split=split,
  )


def _finished(ctx: Context, path: pathlib.Path, cfg: dict) -> Optional[dict]:
  """The run at ``path`` if it is this configuration (and ``--force`` is not given)."""
  if ctx.args.force:
    return None
  ident = runs.run_identity(cfg)
  same = lambda old: runs.run_identity(old["config"]) == ident
  done, _ = store.finished_run(path, same, lambda r: record_problem(r, EXPERIMENT))
  return done


def _execute(
  ctx: Context,
  protocol: str,
  arm: Arm,
  setting: Setting,
  knob: Optional[float],
  data: data_lib.PatchData,
  seeds: Sequence[int],
  eval_split: str = "test",
) -> list[dict]:
  """Runs ``arm`` over ``seeds`` (skipping finished runs), writing one JSON per run."""
  hp = arm_hparams(arm, setting, knob)
  cfg = _config(ctx, protocol, arm, setting, hp, data, eval_split)
  results = []
  trainer: Optional[Trainer] = None
  for seed in seeds:
    path = ctx.out / runs.run_name(protocol, arm.name, cfg, seed)
    done = ctx.done.get(path.name) or _finished(ctx, path, cfg)
    if done is not None:
      ctx.done[path.name] = done
      results.append(done)
      continue
    lock = store.RunLock(path.with_suffix(".lock"))

    def held(then: str, lock: store.RunLock = lock, seed: int = seed) -> None:
      print(f"  {arm.name} seed {seed}: being trained by {lock.held_by()}; {then}", flush=True)

    def waiting(_holder: dict, held: Callable[[str], None] = held) -> None:
      held("waiting for it")

    if ctx.defer_held and not _acquire(lock):
      held("coming back to it after the other runs")
      ctx.deferred.append(path.name)
      continue
    with _claim(lock, waiting):
      done = _finished(ctx, path, cfg)  # finished by another process meanwhile?
      if done is not None:
        ctx.done[path.name] = done
        results.append(done)
        continue
      if trainer is None:
        trainer = Trainer(arm, setting, hp, data.train_x.shape[1], data.num_classes)
      out = train(
        trainer,
        data,
        seed,
        eval_split=eval_split,
        eval_every=ctx.args.eval_every,
        progress=ctx.progress,
        desc=f"{arm.name} n={setting.n_train} seed={seed}",
      )
      rec = {
        "experiment": EXPERIMENT,
        "arm": arm.name,
        "seed": int(seed),
        "config": cfg,
        "command": runs.run_command(protocol, arm.name, cfg, seed, str(ctx.out)),
        "code": store.code_version(),
        **out,
      }
      _write(path, rec)
      ctx.done[path.name] = rec
    m = rec["metrics"]
    acc = m.get(f"{eval_split}_acc")
    print(
      f"  {arm.name:<11} seed {seed:<3} {eval_split} acc {100 * acc:6.2f}%  "
      f"isometry {m['isometry']:.1e}  {m['wall_per_epoch']:.2f} s/epoch",
      flush=True,
    )
    results.append(rec)
  return results


def _acquire(lock: store.RunLock) -> bool:
  try:
    return lock.acquire()
  except OSError as e:
    raise CommandError(f"cannot lock the run: {os_error(e)}.") from None


def _claim(lock: store.RunLock, waiting: Callable[[dict], None]) -> store.RunLock:
  try:
    return store.claim(lock, on_wait=waiting)
  except OSError as e:
    raise CommandError(f"cannot lock the run: {os_error(e)}.") from None


def _write(path: pathlib.Path, rec: dict) -> None:
  """Writes a run; a file already there (``--force``, or damaged) is moved aside first."""
  if os.path.lexists(path):
    aside = store.move_aside(path, "replaced")
    print(f"stiefax patches: moved the earlier {path.name} to {aside.name}", file=sys.stderr)
  try:
    store.write_json(path, rec)
  except OSError as e:
    raise CommandError(f"cannot write {path} ({e.strerror or e}).") from None


def _select(
  ctx: Context, arms: Sequence[Arm], setting: Setting, data: data_lib.PatchData, grids: dict
) -> tuple[dict, list]:
  """``--select-lr``: the knob with the best mean validation accuracy, per arm.

  Returns ``({arm: knob}, selection runs)``. An arm with a selection run passed over
  (held by another process, in the first pass) has no choice yet and is left out.
  """
  seeds = flags.ints(ctx.args.select_seeds, "--select-seeds")
  chosen: dict = {}
  runs_: list = []
  for arm in arms:
    grid = grids.get(arm.name, arm.grid)
    best: Optional[tuple[float, float]] = None
    held = len(ctx.deferred)
    per_knob = []
    for knob in grid:
      res = _execute(ctx, "select-lr", arm, setting, knob, data, seeds, eval_split="val")
      runs_ += res
      per_knob.append((knob, res))
    if len(ctx.deferred) > held:
      print(f"selection for {arm.name}: waits for runs held by other processes", flush=True)
      continue
    for knob, res in per_knob:
      acc = float(np.mean([r["metrics"]["val_acc"] for r in res]))
      if best is None or acc > best[1]:
        best = (knob, acc)
    assert best is not None  # every grid has a value
    chosen[arm.name] = best[0]
    print(
      f"selected {arm.name}: {best[0]:g} (validation accuracy {100 * best[1]:.2f}%)", flush=True
    )
  return chosen, runs_


def _knobs(ctx: Context) -> dict:
  return {k: flags.knob(v, "--lr") for k, v in arm_map(ctx.args.lr, "--lr").items()}


def _protocol_run(ctx: Context, arms: Sequence[Arm], seeds: Sequence[int]) -> list[dict]:
  a, dflt = ctx.args, ctx.defaults
  n_train = dflt["n_train"]
  epochs = a.epochs or (100 if n_train >= 50_000 else 40)
  knobs = _knobs(ctx)
  setting = make_setting(a, dflt, n_train, epochs)
  out: list[dict] = []
  undecided: set = set()
  if a.select_lr:
    pool = ctx.images.train_x.shape[0]
    n_val = a.n_val if a.n_val is not None else min(5000, pool - n_train)
    if n_val < 1:
      raise CommandError(
        f"--select-lr needs validation images after the first {n_train}:"
        f" the pool has {pool}; lower --n-train or set --n-val"
      )
    data = _data(ctx, n_train, n_val)
    grids = {
      k: [flags.knob(x, "--grid") for x in v.split(":")]
      for k, v in arm_map(a.grid, "--grid").items()
    }
    selected = [arm for arm in arms if arm.name != "frozen"]
    chosen, out = _select(ctx, selected, setting, data, grids)
    knobs.update(chosen)
    undecided = {arm.name for arm in selected} - set(chosen)
  # The runs hold no validation slice: the training images and the whitening fit do not
  # depend on it, so a run at a selected rate has the same configuration (and pairs in
  # the report) with a run given that rate by --lr.
  data = _data(ctx, n_train, 0)
  print(
    f"patches: {ctx.images.name}, n_train={n_train}, test={len(data.test_y)},"
    f" {epochs} epochs x {setting.steps_per_epoch} steps, arms"
    f" {','.join(x.name for x in arms)}, seeds {','.join(map(str, seeds))}",
    flush=True,
  )
  for arm in arms:
    if arm.name in undecided:
      continue  # its selection waits for another process: trained in the second pass
    out += _execute(ctx, "run", arm, setting, knobs.get(arm.name), data, seeds)
  return out


def _protocol_sweep_n(ctx: Context, arms: Sequence[Arm], seeds: Sequence[int]) -> list[dict]:
  a = ctx.args
  if a.epochs is not None:
    raise CommandError("sweep-n sets the epochs from --budget (steps per run); drop --epochs")
  ns = flags.ints(a.ns, "--ns") if a.ns else ctx.defaults["ns"]
  knobs = _knobs(ctx)
  out: list[dict] = []
  for n in ns:
    spe = math.ceil(n / a.batch_size)
    epochs = max(1, a.budget // spe)
    setting = make_setting(a, ctx.defaults, n, epochs)
    data = _data(ctx, n, 0)
    print(f"sweep-n: n={n}, {epochs} epochs x {spe} steps = {epochs * spe} steps", flush=True)
    for arm in arms:
      out += _execute(ctx, "sweep-n", arm, setting, knobs.get(arm.name), data, seeds)
  return out


def _protocol_sweep_eps(ctx: Context, arms: Sequence[Arm], seeds: Sequence[int]) -> list[dict]:
  a = ctx.args
  bad = [arm.name for arm in arms if arm.name not in ADAM_ARMS]
  if bad:
    raise CommandError(
      f"sweep-eps varies the Riemannian Adam eps: arms {bad} have none;"
      f" use --arms from {', '.join(ADAM_ARMS)}"
    )
  values = flags.floats(a.eps_values, "--eps-values")
  if not values or any(v < 0 or not math.isfinite(v) for v in values):
    raise CommandError(f"--eps-values: need finite values >= 0, got {a.eps_values!r}")
  n_train = ctx.defaults["n_train"]
  epochs = a.epochs or (100 if n_train >= 50_000 else 40)
  knobs = _knobs(ctx)
  data = _data(ctx, n_train, 0)
  out: list[dict] = []
  for eps in values:
    setting = make_setting(a, ctx.defaults, n_train, epochs, eps=eps)
    print(f"sweep-eps: eps={eps:g}", flush=True)
    for arm in arms:
      out += _execute(ctx, "sweep-eps", arm, setting, knobs.get(arm.name), data, seeds)
  return out


PROTOCOL_FNS: dict[str, Any] = {
  "run": _protocol_run,
  "sweep-n": _protocol_sweep_n,
  "sweep-eps": _protocol_sweep_eps,
}
