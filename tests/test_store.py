"""Run files: digests, atomic writes that never overwrite, locks, finished runs."""

import json
import re

import pytest

from stiefax.experiments import store


def test_run_lock_is_exclusive_and_dies_with_its_process(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  path = tmp_path / "run.lock"
  a, b = store.RunLock(path), store.RunLock(path)
  assert a.acquire() and not b.acquire()
  assert a.holder()["pid"] == __import__("os").getpid()
  a.release()
  assert not path.exists() and b.acquire()
  b.release()
  # A process that holds the lock and is killed leaves it free.
  code = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n"
  )
  proc = subprocess.Popen(
    [sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True
  )
  assert proc.stdout.readline().strip() == "held"
  assert not a.acquire()
  proc.kill()
  proc.wait()
  assert a.acquire()
  a.release()


def test_write_json_is_atomic_and_never_overwrites(tmp_path):
  path = tmp_path / "r.json"
  store.write_json(path, {"a": 1})
  with pytest.raises(FileExistsError):
    store.write_json(path, {"a": 2})
  assert json.loads(path.read_text()) == {"a": 1}
  store.write_json(path, {"a": 3}, overwrite=True)
  assert json.loads(path.read_text()) == {"a": 3}
  assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary files left
  assert store.digest({"b": [1, 2], "a": 0.5}) == store.digest({"a": 0.5, "b": (1, 2)})
  assert store.digest({"a": 1}) != store.digest({"a": 2})


def test_run_file_name_is_a_function_of_the_identity():
  name = store.run_file_name("B2-paper-e20", {"lr": 1.0}, 3)
  assert re.fullmatch(r"B2-paper-e20-[0-9a-f]{8}-s3\.json", name)
  assert name == store.run_file_name("B2-paper-e20", {"lr": 1.0}, 3)
  assert name != store.run_file_name("B2-paper-e20", {"lr": 2.0}, 3)


def test_finished_run_says_why_a_file_is_not_the_run(tmp_path):
  path = tmp_path / "r.json"
  same = lambda run: run["config"] == {"a": 1}
  assert store.finished_run(path, same) == (None, "")  # no file yet
  store.write_json(path, {"config": {"a": 1}})
  assert store.finished_run(path, same) == ({"config": {"a": 1}}, "")
  assert store.finished_run(path, lambda run: False) == (None, "it holds another configuration")
  assert "lacks the field" in store.finished_run(path, lambda run: run["missing"])[1]
  path.write_text("{truncated")
  run, why = store.finished_run(path, same)
  assert run is None and why.startswith("not readable JSON")


def test_move_aside_keeps_the_file(tmp_path):
  path = tmp_path / "r.json"
  path.write_text("old")
  aside = store.move_aside(path, "replaced")
  assert not path.exists() and aside.read_text() == "old"
  assert aside.parent == tmp_path and aside.name.startswith("r.json.replaced-")


def test_claim_waits_for_the_holder(tmp_path):
  import threading  # pylint: disable=g-import-not-at-top

  path = tmp_path / "run.lock"
  holder = store.RunLock(path)
  assert holder.acquire()
  waits = []
  timer = threading.Timer(0.3, holder.release)
  timer.start()
  with store.claim(store.RunLock(path), poll=0.05, on_wait=waits.append) as lock:
    timer.join()
    assert lock.held and not holder.held
  assert len(waits) == 1 and waits[0]["pid"] == __import__("os").getpid()
  assert not path.exists()  # released on leaving the block
