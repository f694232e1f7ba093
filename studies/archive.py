"""What comes back from a device lease, and putting it in place here.

A lease gives back at most 8 files of at most 16 MiB each. :class:`Packer` packs the
lease's work folder (the benchmark, the finished run JSONs, the checkpoints of the
unfinished runs and the lease's own account, ``lease.json``) into one tar archive in
parts of at most 15 MiB, ``lease-g<generation>-p<part>of<parts>.tar``, only when the
folder held still while it was read, and replaces the previous archive only once the
new one is whole. :func:`unpack` puts the newest whole archive where the repository keeps
it: runs in ``results/grok``, the benchmark in ``results/gpu`` (never overwriting a
result), unfinished checkpoints in ``studies/carry/grok`` (a newer one replacing an
older one; removed once their run is finished).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from typing import Callable
from typing import Optional

from stiefax.experiments import protocol
from stiefax.experiments import store

#: The repository.
ROOT = pathlib.Path(__file__).resolve().parent.parent

#: The largest part of the archive (the lease gives back files of at most 16 MiB).
PART_BYTES = 15 * 2**20
#: The largest archive packed whole (beyond it, the checkpoints stay behind): three
#: parts. Five seeds' checkpoints are about 30 MB, so an archive and the previous one,
#: both there for the moment the new one replaces it, stay within the 8 files and 64 MiB
#: that come back.
PACK_LIMIT = 3 * PART_BYTES
#: The archive's part names: ``lease-g<generation>-p<part>of<parts>.tar``.
PART_GLOB = "lease-g*-p*of*.tar"


def checkpoint_epoch(path: pathlib.Path) -> Optional[int]:
  """The epoch of the checkpoint kept in ``path`` (its step folder), without Orbax.

  Args:
    path: a run's ``<run>.ckpt`` folder.

  Returns:
    The largest step folder's number, or None when there is none.
  """
  if not path.is_dir() or path.is_symlink():
    return None
  steps = [int(p.name) for p in path.iterdir() if p.name.isdigit() and p.is_dir()]
  return max(steps) if steps else None


def _listing(work: pathlib.Path) -> tuple:
  """What the packer sees of ``work``: the run files and the benchmark (names, sizes,
  times) and each checkpoint folder's entries (a save renames a new step folder in
  and then deletes the old one, so any save changes them)."""
  seen: list = []
  for p in sorted(work.iterdir()) if work.is_dir() else []:
    if p.suffix == ".ckpt" and p.is_dir():
      seen.append((p.name, tuple((c.name, c.lstat().st_ino) for c in sorted(p.iterdir()))))
    elif p.suffix == ".json" or p.name == "gpu":
      st = p.lstat()
      inner = (
        [(c.name, c.lstat().st_size, c.lstat().st_mtime_ns) for c in sorted(p.iterdir())]
        if p.is_dir()
        else []
      )
      seen.append((p.name, st.st_size, st.st_mtime_ns, tuple(inner)))
  return tuple(seen)


def _skip_partial(info: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
  """Leaves out Orbax's temporary folder of a save in progress."""
  return None if "orbax-checkpoint-tmp" in info.name else info


class Packer:
  """Packs ``work`` into ``out``: the benchmark, new runs and unfinished checkpoints.

  Args:
    work: where the runs train (``--work``).
    out: the folder that comes back from the lease (``--out``).
    known: run files already in the repository (not packed again).
    manifest: called at each pack for the archive's ``lease.json`` (what is left).
  """

  def __init__(
    self,
    work: pathlib.Path,
    out: pathlib.Path,
    known: Callable[[str], bool],
    manifest: Callable[[], dict],
  ):
    self.work, self.out, self.known, self.manifest = work, out, known, manifest
    self.generation = 0
    self.packed: Optional[tuple] = None
    self.lock = threading.Lock()
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    # Three folders down: a file there never comes back, half-written or not.
    self.staging = out / ".staging" / "parts" / "new"

  def pack(self, force: bool = False) -> bool:
    """Packs the work if it changed and held still while it was read.

    Args:
      force: pack even if nothing changed (the last pack: the last word on what is left).

    Returns:
      True if it packed (and replaced the previous archive).
    """
    with self.lock:
      try:
        before = _listing(self.work)
        if before == self.packed and not force:
          return False
        data = self._archive()
        if _listing(self.work) != before:
          return False
      except FileNotFoundError:  # a file went while it was read: a save, a finished run
        return False
      self._write(data)
      self.packed = before
      return True

  def _archive(self) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
      manifest = json.dumps(self.manifest(), indent=1).encode()
      info = tarfile.TarInfo("lease.json")
      info.size, info.mtime = len(manifest), int(time.time())
      tar.addfile(info, io.BytesIO(manifest))
      bench = self.work / "gpu"
      for p in sorted(bench.iterdir()) if bench.is_dir() else []:
        if p.is_file() and not p.name.startswith("."):
          tar.add(p, arcname=f"gpu/{p.name}")
      runs = {p.stem for p in self.work.glob("*.json")}
      for p in sorted(self.work.glob("*.json")):
        if not p.name.startswith(".") and not self.known(p.name):
          tar.add(p, arcname=f"grok/{p.name}")
      ckpts = [
        p
        for p in sorted(self.work.glob("*.ckpt"))
        if p.is_dir() and not p.is_symlink() and p.stem not in runs
      ]
      size = sum(f.stat().st_size for c in ckpts for f in c.rglob("*") if f.is_file())
      if buf.tell() + size > PACK_LIMIT:  # cannot come back whole: keep the runs, say so
        print(
          f"lease: the checkpoints are {size / 2**20:.0f} MiB, more than can come back;"
          " packing the runs and the benchmark only",
          flush=True,
        )
        ckpts = []
      for p in ckpts:
        tar.add(p, arcname=f"grok/{p.name}", filter=_skip_partial)
    return buf.getvalue()

  def _write(self, data: bytes) -> None:
    self.generation += 1
    shutil.rmtree(self.out / ".staging", ignore_errors=True)
    self.staging.mkdir(parents=True)
    n = max(1, -(-len(data) // PART_BYTES))
    names = [f"lease-g{self.generation:04d}-p{i + 1}of{n}.tar" for i in range(n)]
    for i, name in enumerate(names):
      (self.staging / name).write_bytes(data[i * PART_BYTES : (i + 1) * PART_BYTES])
    for name in names:
      os.replace(self.staging / name, self.out / name)
    for old in self.out.glob(PART_GLOB):
      if old.name not in names:
        old.unlink()
    shutil.rmtree(self.out / ".staging", ignore_errors=True)

  def start(self, every: float = 1.0) -> None:
    """Packs in a thread while the lease trains (see :meth:`pack`).

    Args:
      every: seconds between two looks at the work folder.
    """

    def loop() -> None:
      while not self._stop.wait(every):
        try:
          self.pack()
        except OSError as e:  # a full disk: say so, and try again at the next change
          print(f"lease: cannot pack ({e})", flush=True)

    self._thread = threading.Thread(target=loop, name="packer", daemon=True)
    self._thread.start()

  def stop(self) -> None:
    """Ends the thread of :meth:`start` (after the pack in progress, if any)."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()


def latest_archive(folder: pathlib.Path) -> list[pathlib.Path]:
  """The parts of the newest whole archive in ``folder``, in order.

  Args:
    folder: what came back from a lease.

  Returns:
    The part files (``[]`` when no archive has all its parts).
  """
  groups: dict = {}
  for p in folder.glob(PART_GLOB):
    gen, part = p.stem.split("-")[1:3]
    i, n = (int(x) for x in part[1:].split("of"))
    groups.setdefault((int(gen[1:]), n), {})[i] = p
  for (_, n), parts in sorted(groups.items(), reverse=True):
    if sorted(parts) == list(range(1, n + 1)):
      return [parts[i] for i in range(1, n + 1)]
  return []


def _same_file(a: pathlib.Path, b: pathlib.Path) -> bool:
  return a.read_bytes() == b.read_bytes()


def unpack(args: argparse.Namespace) -> int:
  """Puts what a lease gave back where the repository keeps it (see the module docstring).

  Args:
    args: ``dir`` (what came back), ``results``, ``carry``.

  Returns:
    0, or 1 when nothing could be read.
  """
  folder = pathlib.Path(args.dir)
  parts = latest_archive(folder)
  if not parts:
    print(f"unpack: no whole lease archive ({PART_GLOB}) in {folder}", file=sys.stderr)
    return 1
  results, carry = pathlib.Path(args.results), pathlib.Path(args.carry)
  with tempfile.TemporaryDirectory() as tmp:
    joined = pathlib.Path(tmp) / "lease.tar"
    with open(joined, "wb") as f:
      for p in parts:
        f.write(p.read_bytes())
    with tarfile.open(joined) as tar:
      tar.extractall(pathlib.Path(tmp) / "x", filter="data")
    got = pathlib.Path(tmp) / "x"
    manifest = json.loads((got / "lease.json").read_text())
    if manifest.get("tiny") and results.resolve() == (ROOT / "results").resolve():
      print(
        "unpack: a --tiny lease's runs are a check, not results; give --results a folder"
        " of their own",
        file=sys.stderr,
      )
      return 1
    print(f"unpack: {parts[0].name} ({len(parts)} part(s)), made {manifest['created']}")
    counts = {"runs": 0, "benchmark": 0, "checkpoints": 0, "removed": 0}
    for src, dest, kind in [(p, results / "gpu", "benchmark") for p in _files(got / "gpu")] + [
      (p, results / "grok", "runs") for p in _files(got / "grok", "*.json")
    ]:
      if kind == "runs":
        run, problem = store.read_json(src)
        problem = problem or (
          protocol.record_problem(run, "grok") if isinstance(run, dict) else "not a run"
        )
        if problem:
          print(f"unpack: warning: {src.name} left out: {problem}")
          continue
      target = dest / src.name
      if target.exists():
        if not _same_file(src, target):
          print(f"unpack: warning: {target} exists and differs; kept it, left {src.name} out")
        continue
      dest.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, target)
      counts[kind] += 1
    for c in sorted((got / "grok").glob("*.ckpt")) if (got / "grok").is_dir() else []:
      if (results / "grok" / f"{c.stem}.json").exists():
        continue
      target = carry / c.name
      had = checkpoint_epoch(target) if target.is_dir() else None
      new = checkpoint_epoch(c)
      if new is None or (had is not None and had >= new):
        continue
      carry.mkdir(parents=True, exist_ok=True)
      tmp_copy = carry / f".{c.name}.tmp"
      shutil.rmtree(tmp_copy, ignore_errors=True)
      shutil.copytree(c, tmp_copy)
      if os.path.lexists(target):
        store.remove_folder(target)  # a real folder only, never a link's target
      os.replace(tmp_copy, target)
      counts["checkpoints"] += 1
      print(f"unpack: carried {c.name} at epoch {new}")
  for c in sorted(carry.glob("*.ckpt")) if carry.is_dir() else []:
    if (results / "grok" / f"{c.stem}.json").exists() and c.is_dir() and not c.is_symlink():
      store.remove_folder(c)
      counts["removed"] += 1
  print(
    f"unpack: {counts['runs']} new run(s) in {results / 'grok'}, {counts['benchmark']}"
    f" benchmark file(s) in {results / 'gpu'}, {counts['checkpoints']} checkpoint(s) carried"
    f" in {carry}, {counts['removed']} carried checkpoint(s) of finished runs removed"
  )
  print(f"unpack: the lease said: benchmark {manifest['benchmark']}")
  for e in manifest["entries"]:
    print(f"  {e['label']}: {e['progress']}")
  print(f"commit: git add {results / 'grok'} {results / 'gpu'} {carry}")
  return 0


def _files(folder: pathlib.Path, pattern: str = "*") -> list[pathlib.Path]:
  return [p for p in sorted(folder.glob(pattern)) if p.is_file()] if folder.is_dir() else []
