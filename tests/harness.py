"""Shared helpers of the experiment tests: small data and configurations, error checks."""

import pathlib
import pickle
import tarfile
from typing import Callable

import numpy as np

from stiefax.experiments import cli
from stiefax.experiments.grok import config as grok_config

# A reduced grokking model (p = 23, d = 32, one layer): each run compiles in seconds.
TINY_GROK = grok_config.GrokConfig(
  modulus=23,
  d_model=32,
  num_heads=2,
  head_dim=8,
  num_layers=1,
  readout_hidden=32,
  learning_rate=1e-2,
  epochs=80,
  eval_every=20,
)


def images(rng, n, labels):
  """Smooth, spatially correlated images with a class-dependent colour cast."""
  coarse = rng.normal(0.0, 40.0, (n, 4, 4, 3))
  x = np.kron(coarse, np.ones((1, 8, 8, 1))) + 128.0
  x = x + 6.0 * (labels[:, None, None, None] - 4.5) * np.array([1.0, -1.0, 0.5])
  x = x + rng.normal(0.0, 8.0, x.shape)
  return np.clip(x, 0, 255).astype(np.uint8)


def to_batch(x, y):
  return {
    b"data": x.transpose(0, 3, 1, 2).reshape(len(x), 3072),
    b"labels": list(map(int, y)),
    b"batch_label": b"synthetic",
  }


def write_cifar(root: pathlib.Path) -> dict:
  """A CIFAR-10 python-format copy (5 x 120 training, 100 test images), folder and tar."""
  folder = root / "cifar-10-batches-py"
  folder.mkdir()
  rng = np.random.default_rng(0)
  train_x, train_y = [], []
  for i in range(1, 6):
    y = rng.integers(0, 10, 120)
    x = images(rng, 120, y)
    train_x.append(x)
    train_y.append(y)
    (folder / f"data_batch_{i}").write_bytes(pickle.dumps(to_batch(x, y)))
  ty = rng.integers(0, 10, 100)
  tx = images(rng, 100, ty)
  (folder / "test_batch").write_bytes(pickle.dumps(to_batch(tx, ty)))
  archive = root / "cifar-10-python.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:
    tar.add(folder, arcname="cifar-10-batches-py")
  return {
    "folder": folder,
    "archive": archive,
    "train_x": np.concatenate(train_x),
    "train_y": np.concatenate(train_y),
    "test_x": tx,
    "test_y": ty,
  }


def one_line_error(capsys, argv, match) -> str:
  """Runs ``stiefax argv``: exit status 2 and one line on stderr that contains ``match``."""
  rc = cli.main(argv)
  err = capsys.readouterr().err.strip()
  assert rc == 2, err
  assert len(err.splitlines()) == 1 and "Traceback" not in err
  assert match in err
  return err


def hold_runs(
  monkeypatch, prefix: str, *, until: Callable[[], bool] = lambda: False, max_asks: int = 0
) -> list[str]:
  """Makes every run lock whose file name starts with ``prefix`` look held by another
  process (``RunLock.acquire`` answers False) until ``until()`` is true; other locks are
  taken as usual.

  Returns the list of lock names asked for while held, filled as the command runs; with
  ``max_asks`` > 0, asking more often than that fails the test (the command waited).
  """
  from stiefax.experiments import store  # pylint: disable=g-import-not-at-top

  real_acquire = store.RunLock.acquire
  asked: list[str] = []

  def acquire(lock):
    if lock.path.name.startswith(prefix) and not until():
      asked.append(lock.path.name)
      assert not max_asks or len(asked) <= max_asks, f"waited for the held run {prefix}*"
      return False
    return real_acquire(lock)

  monkeypatch.setattr(store.RunLock, "acquire", acquire)
  return asked


def complete_lm_record(rec: dict) -> dict:
  """``rec``, a ``stiefax lm`` run record, with the fields a finished run has that it
  lacks (the metrics and history the command and report read), as a written run would."""
  m = rec["metrics"]
  for key, value in (("max_logit_max", 10.0), ("entropy", 1.0), ("isometry", 0.5)):
    m.setdefault(key, value)
  m.setdefault("frame_lr", None)
  h = rec.setdefault("history", {})
  n = len(next(iter(h.values()))) if h else 2
  steps = rec["config"].get("steps", 1)
  tail = {"step": steps, "val_bpb": m["val_bpb"], "max_logit": m["max_logit_max"]}
  head = {"step": 0, "val_bpb": m["init_val_bpb"], "max_logit": 1.0}
  for key, last in tail.items():
    h.setdefault(key, [head[key]] * (n - 1) + [last])
  return rec


def grok_record(
  arm: str,
  seed: int,
  *,
  grok_at=None,
  level: float = 0.9,
  stabilize: bool = False,
  config: grok_config.GrokConfig = grok_config.PAPER,
  preset: str = "paper",
) -> dict:
  """A finished ``stiefax grok`` run record, as the command writes it, whose held-out
  accuracy is 0.1 until ``grok_at`` (None: never) and ``level`` from there on (after
  one evaluation at 0.96, so a ``level`` below 0.95 groks without sustaining it);
  memorized at the first evaluation, frames at ``1e-6`` isometry error (B2) or ``0.5``."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  from stiefax.experiments import store  # pylint: disable=g-import-not-at-top
  from stiefax.experiments.grok import runs as grok_runs  # pylint: disable=g-import-not-at-top

  if stabilize:
    config = dataclasses.replace(config, **grok_config.STABILIZED)
  epochs = list(range(0, config.epochs + 1, config.eval_every))
  test = [
    0.1 if grok_at is None or e < grok_at else (0.96 if e == grok_at else level) for e in epochs
  ]
  history = {
    "epoch": epochs,
    "train_acc": [0.0] + [1.0] * (len(epochs) - 1),
    "test_acc": test,
    "train_loss": [4.6] + [0.01] * (len(epochs) - 1),
    "isometry": [1e-6 if arm.startswith("B2") else 0.5] * len(epochs),
    "isometry_key": [1e-6 if arm.startswith("B2") else 0.5] * len(epochs),
  }
  setting = f"preset={preset} epochs={config.epochs} eval_every={config.eval_every}"
  identity = grok_runs.run_identity(config, arm, preset)
  return {
    "experiment": "grok",
    "arm": arm,
    "seed": seed,
    "config": {
      **grok_config.recorded(config),
      "arm": grok_runs.arm_definition(grok_config.ARMS[arm]),
      "n_train": 3764,
      "n_test": 5645,
      "preset": preset,
      "stabilize": stabilize,
      "setting": setting + (" stabilize" if stabilize else ""),
    },
    "metrics": grok_config.run_metrics(history, config),
    "history": history,
    "wall_time": 60.0,
    "vmapped_seeds": None,
    "resumed_from": None,
    "run_id": store.digest(identity),
  }
