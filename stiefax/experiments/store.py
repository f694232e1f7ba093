"""Run files shared by the experiment commands: names, atomic writes, claims.

A run is identified by its whole configuration: :func:`digest` is 8 hex digits of the
SHA-256 of the configuration as canonical JSON, and goes into the run's file name, so
runs that differ in any setting never share a file. :func:`write_json` writes a whole
file or nothing (a temporary file in the same folder, then a rename), and
:class:`RunLock` lets one process at a time train a run: it holds an exclusive
``fcntl.flock`` on ``<run>.lock``, which the operating system drops when the process
ends, however it ends, so a killed process never leaves a run locked (:func:`claim`
waits for it). :func:`finished_run` reads a run back when its file holds the same
run, else says why not; :func:`move_aside` renames a file that must make room,
never deleting it. Every experiment command keeps its runs this way.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pathlib
import socket
import subprocess
import tempfile
import time
from typing import Any
from typing import Callable
from typing import Optional

__all__ = [
  "canonical",
  "digest",
  "run_file_name",
  "code_version",
  "write_json",
  "read_json",
  "finished_run",
  "move_aside",
  "claim",
  "RunLock",
]


def canonical(obj: Any) -> str:
  """``obj`` as canonical JSON: sorted keys, no spaces (tuples become lists)."""
  return json.dumps(json.loads(json.dumps(obj)), sort_keys=True, separators=(",", ":"))


def digest(obj: Any) -> str:
  """8 hex digits of the SHA-256 of :func:`canonical` ``(obj)``."""
  return hashlib.sha256(canonical(obj).encode()).hexdigest()[:8]


def run_file_name(stem: str, identity: Any, seed: int) -> str:
  """``<stem>-<digest(identity)>-s<seed>.json``: the file name of one run."""
  return f"{stem}-{digest(identity)}-s{seed}.json"


def code_version() -> dict:
  """``{"version", "commit", "dirty"}`` of the stiefax source this process runs."""
  import stiefax  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(stiefax.__file__).resolve().parent.parent
  info: dict[str, Any] = {"version": stiefax.__version__, "commit": None, "dirty": None}
  try:
    git = lambda *a: subprocess.run(
      ["git", "-C", str(root), *a], capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()
    info["commit"] = git("rev-parse", "HEAD") or None
    info["dirty"] = bool(git("status", "--porcelain", "--untracked-files=no", "--", "stiefax"))
  except (OSError, subprocess.SubprocessError):
    pass
  return info


def write_json(path: pathlib.Path, obj: Any, *, overwrite: bool = False) -> None:
  """Writes ``obj`` to ``path`` atomically: readers see the whole file or none.

  The text goes to a uniquely named temporary file in the same folder, is flushed to
  disk, and is then linked to ``path`` (``overwrite=False``: fails with
  ``FileExistsError`` if ``path`` exists, so a result is never replaced) or renamed
  over it (``overwrite=True``).
  """
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(json.dumps(obj, indent=1, allow_nan=True))
      f.flush()
      os.fsync(f.fileno())
    if overwrite:
      os.replace(tmp, path)
      return
    try:
      os.link(tmp, path)  # atomic, and refuses an existing path
    except FileExistsError:
      raise
    except OSError as e:  # a file system without hard links
      if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        raise
      if path.exists():
        raise FileExistsError(errno.EEXIST, "file exists", str(path)) from None
      os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


def read_json(path: pathlib.Path) -> tuple[Optional[Any], Optional[str]]:
  """``(obj, None)`` for a readable JSON file, else ``(None, one-line reason)``."""
  try:
    return json.loads(pathlib.Path(path).read_text()), None
  except (OSError, UnicodeDecodeError, ValueError) as e:
    text = " ".join(str(e).split())
    return None, text[:117] + "..." if len(text) > 120 else text


def finished_run(path: pathlib.Path, same: Callable[[Any], bool]) -> tuple[Optional[dict], str]:
  """``(run, "")`` if ``path`` holds a finished run for which ``same(run)`` is true.

  Else ``(None, reason)``: ``""`` when there is no file, otherwise why the file there
  is not this run (unreadable, another configuration, a missing field).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    return None, ""
  run, problem = read_json(path)
  if problem is not None:
    return None, f"not readable JSON ({problem})"
  try:
    if isinstance(run, dict) and same(run):
      return run, ""
    return None, "it holds another configuration"
  except (KeyError, TypeError, AttributeError) as e:
    return None, f"it lacks the field {e}"


def move_aside(path: pathlib.Path, tag: str = "bad") -> pathlib.Path:
  """Renames ``path`` to ``<name>.<tag>-<time>-<pid>`` in its folder (never deletes it)."""
  path = pathlib.Path(path)
  aside = path.with_name(f"{path.name}.{tag}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
  os.replace(path, aside)
  return aside


def claim(lock: RunLock, poll: float = 2.0, on_wait: Optional[Callable[[dict], None]] = None):
  """Blocks until ``lock`` is acquired; ``on_wait(holder)`` once if it must wait."""
  told = False
  while not lock.acquire():
    if not told and on_wait is not None:
      on_wait(lock.holder() or {})
    told = True
    time.sleep(poll)
  return lock


class RunLock:
  """An exclusive claim on one run: ``flock`` on ``<lock path>``, released on exit.

  ``acquire()`` never waits: it returns False while another live process holds the
  run (``holder()`` then says which). The lock file is removed on release; the claim
  is re-checked against the file on disk, so a file removed and re-created by another
  process between ``open`` and ``flock`` is never mistaken for a held claim.

  Example::

    lock = RunLock(out / "A2-e200-1a2b3c4d-s0.lock")
    if lock.acquire():
      try:
        ...  # train, write the result
      finally:
        lock.release()
  """

  def __init__(self, path: pathlib.Path):
    self.path = pathlib.Path(path)
    self._fd: Optional[int] = None

  @property
  def held(self) -> bool:
    return self._fd is not None

  def acquire(self) -> bool:
    import fcntl  # pylint: disable=g-import-not-at-top

    if self._fd is not None:
      return True
    self.path.parent.mkdir(parents=True, exist_ok=True)
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        os.close(fd)
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
          return False
        raise
      try:
        same = os.path.samestat(os.fstat(fd), os.stat(self.path))
      except FileNotFoundError:
        same = False
      if not same:  # released and removed by its holder meanwhile: claim the new file
        os.close(fd)
        continue
      info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
      os.ftruncate(fd, 0)
      os.write(fd, json.dumps(info).encode())
      self._fd = fd
      return True

  def release(self) -> None:
    if self._fd is None:
      return
    with contextlib.suppress(FileNotFoundError):
      os.unlink(self.path)  # while still held: nobody can have claimed this file
    os.close(self._fd)
    self._fd = None

  def holder(self) -> Optional[dict]:
    """``{"pid", "host", "since"}`` written by the current holder (None if unknown)."""
    obj, _ = read_json(self.path)
    return obj if isinstance(obj, dict) else None

  def held_by(self) -> str:
    """``"process <pid> on <host>"`` for messages (``?`` where the holder is unknown)."""
    info = self.holder() or {}
    return f"process {info.get('pid', '?')} on {info.get('host', '?')}"

  def __enter__(self) -> RunLock:
    return self

  def __exit__(self, *exc) -> None:
    self.release()
