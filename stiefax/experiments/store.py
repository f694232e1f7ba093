"""Run files shared by the experiment commands: names, atomic writes, claims.

A run is identified by its whole configuration: :func:`digest` is 8 hex digits of the
SHA-256 of the configuration as canonical JSON, and goes into the run's file name, so
runs that differ in any setting never share a file. :func:`atomic_write` (the one
writer of every file the commands write: runs, plots, ``--json`` files, caches) and
:func:`write_json` write a whole file or nothing (a temporary file in the same folder,
then a rename, with the mode the umask gives a new file), and
:class:`RunLock` lets one process at a time train a run: it holds an exclusive
``fcntl.flock`` on ``<run>.lock``, which the operating system drops when the process
ends, however it ends, so a killed process never leaves a run locked (:func:`claim`
waits for it). :func:`finished_run` reads a run back when its file holds the same
run, else says why not; :func:`move_aside` renames a file that must make room,
never deleting it. Every experiment command keeps its runs this way.

The store never follows a symbolic link it did not create: a rename replaces a link
itself, locks open with ``O_NOFOLLOW``, a run file that is a link is not read, and
:func:`remove_folder` deletes only a real folder (:func:`not_a_folder` says why not).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from typing import Any
from typing import Callable
from typing import Optional

import stiefax

__all__ = [
  "canonical",
  "digest",
  "run_file_name",
  "code_version",
  "atomic_write",
  "write_json",
  "MAX_JSON_DEPTH",
  "MAX_JSON_BYTES",
  "read_json",
  "finished_run",
  "move_aside",
  "not_a_folder",
  "remove_folder",
  "claim",
  "release_all",
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


def _umask() -> int:
  """The process's umask (read by setting it and setting it back)."""
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def atomic_write(
  path: pathlib.Path, write: Callable[[Any], None], *, overwrite: bool = True, binary: bool = True
) -> None:
  """Writes a file atomically: readers see the whole file or none, never half of one.

  ``write(f)`` writes the content to an open file ``f`` (bytes with ``binary``, else
  text). It goes to a uniquely named temporary file in the same folder, is flushed to
  disk, gets the mode of a newly created file (``0o666`` less the umask; temporary files
  are created ``0o600``) and is then renamed over ``path`` (``overwrite=True``) or
  linked to it (``overwrite=False``: ``FileExistsError`` if ``path`` exists, so a result
  is never replaced). A rename replaces a symbolic link at ``path`` itself, never the
  file it points to. On any error (a full disk, an unwritable folder) the temporary
  file is removed and the error raised: nothing half-written is left.
  """
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb" if binary else "w") as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o666 & ~_umask())
    if overwrite:
      os.replace(tmp, path)
      return
    try:
      os.link(tmp, path)  # atomic, and refuses an existing path (a link there too)
    except FileExistsError:
      raise
    except OSError as e:  # a file system without hard links
      if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        raise
      if os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, "file exists", str(path)) from None
      os.replace(tmp, path)
  finally:
    if os.path.lexists(tmp):
      os.unlink(tmp)


def write_json(path: pathlib.Path, obj: Any, *, overwrite: bool = False) -> None:
  """Writes ``obj`` as JSON to ``path`` with :func:`atomic_write`.

  ``overwrite=False`` (the default) fails with ``FileExistsError`` if ``path`` exists.
  """
  text = json.dumps(obj, indent=1, allow_nan=True)
  atomic_write(path, lambda f: f.write(text), overwrite=overwrite, binary=False)


#: How deeply a JSON file the commands read may nest its arrays and objects (a run file
#: nests 4 deep); anything deeper is refused, never a ``RecursionError``.
MAX_JSON_DEPTH = 64

#: The largest JSON file the commands read (a run file is well under 1 MB).
MAX_JSON_BYTES = 256 * 2**20


def _depth_problem(obj: Any) -> Optional[str]:
  """Why ``obj`` nests deeper than :data:`MAX_JSON_DEPTH` (None if it does not)."""
  stack = [(obj, 1)]
  while stack:
    value, depth = stack.pop()
    if isinstance(value, (list, dict)):
      if depth > MAX_JSON_DEPTH:
        return f"nested deeper than {MAX_JSON_DEPTH} levels"
      items = value.values() if isinstance(value, dict) else value
      stack.extend((v, depth + 1) for v in items if isinstance(v, (list, dict)))
  return None


def read_json(path: pathlib.Path) -> tuple[Optional[Any], Optional[str]]:
  """``(obj, None)`` for a readable JSON file, else ``(None, one-line reason)``.

  Only a regular file is read: a FIFO, a device or a folder is a reason, never waited
  on (the file is opened without blocking and checked before it is read). JSON nested
  deeper than :data:`MAX_JSON_DEPTH`, or a file larger than :data:`MAX_JSON_BYTES`, is
  not readable JSON either.
  """
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
      st = os.fstat(f.fileno())
      if not stat.S_ISREG(st.st_mode):
        return None, "not a regular file"
      if st.st_size > MAX_JSON_BYTES:
        return None, f"larger than {MAX_JSON_BYTES >> 20} MiB"
      data = f.read()
    obj = json.loads(data.decode())
  except RecursionError:
    return None, f"nested deeper than {MAX_JSON_DEPTH} levels"
  except (OSError, UnicodeDecodeError, ValueError) as e:
    text = " ".join(str(e).split())
    return None, text[:117] + "..." if len(text) > 120 else text
  problem = _depth_problem(obj)
  return (None, problem) if problem else (obj, None)


def finished_run(
  path: pathlib.Path,
  same: Callable[[Any], bool],
  check: Optional[Callable[[Any], Optional[str]]] = None,
) -> tuple[Optional[dict], str]:
  """``(run, "")`` if ``path`` holds a finished run for which ``same(run)`` is true.

  Else ``(None, reason)``: ``""`` when there is no file, otherwise why the file there
  is not this run (a symbolic link, not a regular file, unreadable, invalid by
  ``check(run)`` (a reason or None; e.g.
  :func:`stiefax.experiments.protocol.record_problem`), another configuration, a
  missing field).
  """
  path = pathlib.Path(path)
  if os.path.islink(path):  # never read through a link the store did not create
    return None, "it is a symbolic link"
  if not os.path.lexists(path):
    return None, ""
  run, problem = read_json(path)
  if problem is not None:
    return None, f"not readable JSON ({problem})"
  try:
    invalid = check(run) if check is not None else None
    if invalid:
      return None, f"not a valid run ({invalid})"
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


def not_a_folder(path: pathlib.Path) -> Optional[str]:
  """Why ``path`` cannot be used as a folder of the store (``None``: it is one or absent).

  A symbolic link (to anything) or a file is refused: the store never follows a link
  it did not create, so that nothing outside its folder is ever written or removed.
  """
  try:
    st = os.lstat(path)
  except FileNotFoundError:
    return None
  if stat.S_ISLNK(st.st_mode):
    return "it is a symbolic link"
  if not stat.S_ISDIR(st.st_mode):
    return "it is not a folder"
  return None


def remove_folder(path: pathlib.Path) -> None:
  """Removes the folder ``path`` and its contents; a symbolic link or a file is refused.

  The path is not resolved: a link at ``path`` is an ``OSError`` and its target is
  never touched (nor is any link inside the folder followed). An absent path is fine.

  Raises:
    OSError: ``path`` is a symbolic link or not a folder, or cannot be removed.
  """
  path = pathlib.Path(path)
  problem = not_a_folder(path)
  if problem is not None:
    raise OSError(errno.ENOTDIR, f"not removed: {problem}", str(path))
  if os.path.lexists(path):
    shutil.rmtree(path)  # rmtree never follows the links inside


_HELD: set = set()  # the RunLocks this process holds, for release_all


def _write_all(fd: int, data: bytes) -> None:
  """Writes all of ``data`` to ``fd`` (``os.write`` may write part of it)."""
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view) :]


def claim(
  lock: RunLock, poll: float = 2.0, on_wait: Optional[Callable[[dict], None]] = None
) -> RunLock:
  """Blocks until ``lock`` is acquired; ``on_wait(holder)`` once if it must wait."""
  told = False
  while not lock.acquire():
    if not told and on_wait is not None:
      on_wait(lock.holder() or {})
    told = True
    time.sleep(poll)
  return lock


def release_all() -> None:
  """Releases every :class:`RunLock` this process holds (before an immediate exit)."""
  for lock in list(_HELD):
    with contextlib.suppress(OSError):
      lock.release()


class RunLock:
  """An exclusive claim on one run: ``flock`` on ``<lock path>``, released on exit.

  ``acquire()`` never waits: it returns False while another live process holds the
  run (``holder()`` then says which). It opens the lock file with ``O_NOFOLLOW``: a
  symbolic link at its path is an ``OSError``, never followed. If the holder's details
  cannot be written (a full disk), the file is removed and the ``OSError`` raised. The lock file is removed on release; the claim
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
    if self._fd is not None:
      return True
    self.path.parent.mkdir(parents=True, exist_ok=True)
    while True:
      try:  # O_NOFOLLOW: a symbolic link at the lock's path is refused, never followed
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
      except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(self.path):
          raise OSError(
            errno.ELOOP, "a symbolic link, not a lock file; remove it", str(self.path)
          ) from None
        raise
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
      try:
        os.ftruncate(fd, 0)
        _write_all(fd, json.dumps(info).encode())
      except OSError:  # a full disk: no empty or half-written lock file is left
        with contextlib.suppress(OSError):
          os.unlink(self.path)  # still held: nobody else can have claimed this file
        os.close(fd)
        raise
      self._fd = fd
      _HELD.add(self)
      return True

  def release(self) -> None:
    if self._fd is None:
      return
    with contextlib.suppress(FileNotFoundError):
      os.unlink(self.path)  # while still held: nobody can have claimed this file
    os.close(self._fd)
    self._fd = None
    _HELD.discard(self)

  def holder(self) -> Optional[dict]:
    """``{"pid", "host", "since"}`` written by the current holder (None if unknown)."""
    if os.path.islink(self.path):
      return None
    obj, _ = read_json(self.path)
    return obj if isinstance(obj, dict) else None

  def held_by(self) -> str:
    """``"process <pid> on <host>"`` for messages (``?`` where the holder is unknown)."""
    info = self.holder() or {}
    return f"process {info.get('pid', '?')} on {info.get('host', '?')}"

  def __enter__(self) -> RunLock:
    return self

  def __exit__(self, *exc: object) -> None:
    self.release()
