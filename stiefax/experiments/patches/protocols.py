"""The protocols of ``stiefax patches``: run (with ``--select-lr``), sweep-n, sweep-eps.

Each protocol (:data:`PROTOCOL_FNS`) gives the runs it is asked for, in a
:class:`Context` that :func:`stiefax.experiments.patches.command.run` builds, as
:class:`Job` s for the run loop (:func:`stiefax.experiments.jobs.run_jobs`), which
:func:`trainer` trains: one JSON file per run in ``--out``, a finished run read back,
locks, ``--no-wait``, ``--force``, as in every command. ``run --select-lr`` gives a plan
(a function of the runs so far): an arm's final runs join it once its selection runs
are in, so a selection held by another process holds back only its own arm.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
from typing import Any
from typing import Optional
from typing import Sequence

import numpy as np

from stiefax.experiments import flags
from stiefax.experiments import jobs
from stiefax.experiments import store
from stiefax.experiments.arms import Arm
from stiefax.experiments.flags import CommandError
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

__all__ = ["Context", "Job", "PROTOCOL_FNS", "arm_map", "make_setting", "trainer"]


@dataclasses.dataclass
class Context:
  """What every protocol reads: the arguments, the images and where runs go."""

  args: argparse.Namespace
  images: images_lib.Images
  out: pathlib.Path
  cache: Optional[pathlib.Path]
  progress: bool
  defaults: dict


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


@dataclasses.dataclass(eq=False)
class Spec:
  """What the seeds of one (protocol, arm, setting, knob) share: one trainer, one data."""

  protocol: str
  arm: Arm
  setting: Setting
  hp: dict
  cfg: dict
  data: data_lib.PatchData
  eval_split: str


@dataclasses.dataclass
class Job(jobs.Job):
  """One run of ``stiefax patches`` (a protocol, an arm, a setting, a seed)."""

  spec: Optional[Spec] = None

  command = "stiefax patches"
  checkpointed = False  # a run is minutes: trained again from the start if stopped

  def same(self, record: dict) -> bool:
    assert self.spec is not None
    return runs.run_identity(record["config"]) == runs.run_identity(self.spec.cfg)


def _jobs(
  ctx: Context,
  protocol: str,
  arm: Arm,
  setting: Setting,
  knob: Optional[float],
  data: data_lib.PatchData,
  seeds: Sequence[int],
  eval_split: str = "test",
) -> list[Job]:
  """The runs of ``arm`` over ``seeds``, one JSON each (one :class:`Spec`)."""
  hp = arm_hparams(arm, setting, knob)
  cfg = _config(ctx, protocol, arm, setting, hp, data, eval_split)
  spec = Spec(protocol, arm, setting, hp, cfg, data, eval_split)
  name = lambda seed: ctx.out / runs.run_name(protocol, arm.name, cfg, seed)
  return [Job(arm.name, int(seed), name(seed), spec=spec) for seed in seeds]


def trainer(ctx: Context) -> jobs.Train:
  """The run loop's ``train`` of ``stiefax patches``: one run at a time, the jitted
  trainer of a :class:`Spec` built once and shared by its seeds."""
  last: dict = {}

  def train_one(batch: list, checkpoints: list) -> list:
    del checkpoints  # a patches run keeps none
    (job,) = batch
    s = job.spec
    if last.get("spec") is not s:
      last.clear()  # one trainer held at a time: the jobs of a spec come together
      last.update(spec=s, trainer=Trainer(s.arm, s.setting, s.hp, *_shape(s.data)))
    out = train(
      last["trainer"],
      s.data,
      job.seed,
      eval_split=s.eval_split,
      eval_every=ctx.args.eval_every,
      progress=ctx.progress,
      desc=f"{job.arm} n={s.setting.n_train} seed={job.seed}",
    )
    rec = {
      "experiment": EXPERIMENT,
      "arm": job.arm,
      "seed": job.seed,
      "config": s.cfg,
      "command": runs.run_command(s.protocol, job.arm, s.cfg, job.seed, str(ctx.out)),
      "code": store.code_version(),
      **out,
    }
    m = rec["metrics"]
    print(
      f"  {job.arm:<11} seed {job.seed:<3} {s.eval_split} acc"
      f" {100 * m[f'{s.eval_split}_acc']:6.2f}%  isometry {m['isometry']:.1e} "
      f" {m['wall_per_epoch']:.2f} s/epoch",
      flush=True,
    )
    return [rec]

  return train_one


def _shape(data: data_lib.PatchData) -> tuple[int, int]:
  return data.train_x.shape[1], data.num_classes


def _best(per_knob: list, records: dict) -> Optional[tuple[float, float]]:
  """The knob with the best mean validation accuracy over its runs, and that accuracy;
  None while a run of the selection is not in ``records``."""
  best: Optional[tuple[float, float]] = None
  for knob, todo in per_knob:
    if any(job.path not in records for job in todo):
      return None
    acc = float(np.mean([records[job.path]["metrics"]["val_acc"] for job in todo]))
    if best is None or acc > best[1]:
      best = (knob, acc)
  return best


def _knobs(ctx: Context) -> dict:
  return {k: flags.knob(v, "--lr") for k, v in arm_map(ctx.args.lr, "--lr").items()}


def _protocol_run(ctx: Context, arms: Sequence[Arm], seeds: Sequence[int]) -> jobs.Plan:
  a, dflt = ctx.args, ctx.defaults
  n_train = dflt["n_train"]
  epochs = a.epochs or (100 if n_train >= 50_000 else 40)
  knobs = _knobs(ctx)
  setting = make_setting(a, dflt, n_train, epochs)
  selections: dict = {}  # --select-lr: arm -> [(knob, its selection runs)]
  if a.select_lr:
    pool = ctx.images.train_x.shape[0]
    n_val = a.n_val if a.n_val is not None else min(5000, pool - n_train)
    if n_val < 1:
      raise CommandError(
        f"--select-lr needs validation images after the first {n_train}:"
        f" the pool has {pool}; lower --n-train or set --n-val"
      )
    val_data = _data(ctx, n_train, n_val)
    grids = {
      k: [flags.knob(x, "--grid") for x in v.split(":")]
      for k, v in arm_map(a.grid, "--grid").items()
    }
    seeds_ = flags.ints(a.select_seeds, "--select-seeds")
    for arm in arms:
      if arm.name != "frozen":
        selections[arm.name] = [
          (k, _jobs(ctx, "select-lr", arm, setting, k, val_data, seeds_, eval_split="val"))
          for k in grids.get(arm.name, arm.grid)
        ]
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
  final = {
    arm.name: _jobs(ctx, "run", arm, setting, knobs.get(arm.name), data, seeds)
    for arm in arms
    if arm.name not in selections
  }
  if not selections:
    return [job for arm in arms for job in final[arm.name]]

  def plan(records: dict) -> list:
    """The selection runs, then each arm's runs once its rate is chosen."""
    todo = [job for per_knob in selections.values() for _, some in per_knob for job in some]
    for arm in arms:
      if arm.name not in final:
        best = _best(selections[arm.name], records)
        if best is None:
          continue  # its selection runs are not all in yet
        print(
          f"selected {arm.name}: {best[0]:g} (validation accuracy {100 * best[1]:.2f}%)",
          flush=True,
        )
        final[arm.name] = _jobs(ctx, "run", arm, setting, best[0], data, seeds)
      todo += final[arm.name]
    return todo

  return plan


def _protocol_sweep_n(ctx: Context, arms: Sequence[Arm], seeds: Sequence[int]) -> jobs.Plan:
  a = ctx.args
  if a.epochs is not None:
    raise CommandError("sweep-n sets the epochs from --budget (steps per run); drop --epochs")
  ns = flags.ints(a.ns, "--ns") if a.ns else ctx.defaults["ns"]
  knobs = _knobs(ctx)
  todo: list[Job] = []
  for n in ns:
    spe = math.ceil(n / a.batch_size)
    epochs = max(1, a.budget // spe)
    setting = make_setting(a, ctx.defaults, n, epochs)
    data = _data(ctx, n, 0)
    print(f"sweep-n: n={n}, {epochs} epochs x {spe} steps = {epochs * spe} steps", flush=True)
    for arm in arms:
      todo += _jobs(ctx, "sweep-n", arm, setting, knobs.get(arm.name), data, seeds)
  return todo


def _protocol_sweep_eps(ctx: Context, arms: Sequence[Arm], seeds: Sequence[int]) -> jobs.Plan:
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
  todo: list[Job] = []
  for eps in values:
    setting = make_setting(a, ctx.defaults, n_train, epochs, eps=eps)
    for arm in arms:
      todo += _jobs(ctx, "sweep-eps", arm, setting, knobs.get(arm.name), data, seeds)
  return todo


PROTOCOL_FNS: dict[str, Any] = {
  "run": _protocol_run,
  "sweep-n": _protocol_sweep_n,
  "sweep-eps": _protocol_sweep_eps,
}
