"""Image sources of ``stiefax patches`` and the on-disk cache they share.

Sources (``--data``):

* the CIFAR-10 python release: ``cifar-10-python.tar.gz`` or its extracted folder
  ``cifar-10-batches-py`` (``data_batch_1..5``, ``test_batch``; pickled dicts with
  ``b"data"`` uint8 ``(N, 3072)`` and ``b"labels"``). The training pool is the
  official order of ``data_batch_1..5``. The batches are unpickled by a restricted
  unpickler that loads only dicts, lists, bytes, ints and numpy arrays: a batch that
  names anything else is refused with a one-line error naming it, never run.
* an image-folder copy, ``train/<class>/<image>`` and ``test/<class>/<image>``, as a
  folder or a ``.tar.gz`` of one. Decoded once with Pillow (RGB) and cached. Classes
  are numbered in sorted name order. Such copies lose the official order, so the
  training pool is put in the *seeded class-interleaved order* of
  :func:`interleaved_order`: within each class the files, sorted by name, are shuffled
  by ``numpy.random.default_rng(order_seed)`` (one generator, classes in label
  order), then the classes are dealt round-robin (class 0's first image, class 1's
  first, ..., class 0's second, ...). "The first ``n`` training images" are then
  class-balanced for any ``n``.
* ``None``: scikit-learn's ``digits`` (1 797 real ``8 x 8`` grey images shipped
  inside the package; no download), split by a fixed seeded permutation into a
  1 297-image training pool and a 500-image test split.
* ``"random"``: uniform noise with CIFAR-10's shapes (50 000 + 10 000 images), for
  timing only.

Cache files are ``.npz`` archives keyed by :func:`cache_digest` of their inputs,
written atomically (:func:`save_npz`); a damaged one is rebuilt with a notice
(:func:`load_npz`), all in :mod:`stiefax.experiments.patches.cache`.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pathlib
import pickle
import sys
import tarfile
from typing import Any
from typing import Iterable
from typing import Iterator
from typing import Optional
from typing import Sequence

import numpy as np
from PIL import Image
import sklearn
from sklearn.datasets import load_digits
from tqdm import tqdm

from stiefax.experiments.flags import CommandError
from stiefax.experiments.patches.cache import CACHE_VERSION
from stiefax.experiments.patches.cache import cache_digest
from stiefax.experiments.patches.cache import file_id as _file_id
from stiefax.experiments.patches.cache import folder_id as _folder_id
from stiefax.experiments.patches.cache import load_npz
from stiefax.experiments.patches.cache import save_npz
from stiefax.experiments.patches.cache import short_error

__all__ = ["Images", "CIFAR_FILES", "load_images", "interleaved_order", "default_cache_dir"]

_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".webp")

_EXPECTED = (
  "expected the CIFAR-10 python archive cifar-10-python.tar.gz, its extracted folder"
  " cifar-10-batches-py (data_batch_1..5, test_batch), or an image-folder copy"
  " (train/<class>/*.jpg and test/<class>/*.jpg) as a folder or .tar.gz"
)


@dataclasses.dataclass(frozen=True)
class Images:
  """Raw images of one source, uint8 ``(N, H, W, C)``, labels int32 ``(N,)``."""

  name: str  # "cifar10-python", "image-folder", "digits" or "random"
  source_id: str  # identifies the source bytes (part of cache keys)
  train_x: np.ndarray  # the training pool, in its defined order
  train_y: np.ndarray
  test_x: np.ndarray
  test_y: np.ndarray
  classes: tuple[str, ...]
  pixel_max: float  # pixel values lie in [0, pixel_max]


def default_cache_dir() -> pathlib.Path:
  """``$STIEFAX_CACHE`` if set, else ``$XDG_CACHE_HOME/stiefax`` or ``~/.cache/stiefax``."""
  if os.environ.get("STIEFAX_CACHE"):
    return pathlib.Path(os.environ["STIEFAX_CACHE"]).expanduser()
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
  return pathlib.Path(base).expanduser() / "stiefax"


# ----------------------------------------------------------------------------- readers


# What a CIFAR-10 python batch may name in its pickle: the numpy array and scalar
# reconstructors (both numpy module layouts, the protocol-5 buffer form) and the codec
# Python 3 uses for bytes in protocol-2 pickles. Dicts, lists, str, bytes and ints need
# no names. Anything else (os.system, builtins.eval, ...) is refused, never called.
_CIFAR_PICKLE_NAMES = frozenset(
  (module, name)
  for prefix in ("numpy.core", "numpy._core")
  for module, name in (
    (f"{prefix}.multiarray", "_reconstruct"),
    (f"{prefix}.multiarray", "scalar"),
    (f"{prefix}.numeric", "_frombuffer"),
  )
) | {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


class _CifarUnpickler(pickle.Unpickler):
  """A ``pickle.Unpickler`` that loads only what a CIFAR-10 python batch holds."""

  def find_class(self, module: str, name: str) -> Any:
    if (module, name) not in _CIFAR_PICKLE_NAMES:
      raise pickle.UnpicklingError(
        f"refused to load {module}.{name}: a CIFAR-10 batch holds only a dict of numpy"
        " arrays, lists, bytes and ints"
      )
    return super().find_class(module, name)


def load_cifar_pickle(raw: bytes) -> Any:
  """Unpickles a CIFAR-10 python batch with the restricted :class:`_CifarUnpickler`.

  Only the numpy array reconstructors are looked up by name; a pickle that names any
  other callable raises ``pickle.UnpicklingError`` before anything is called.
  """
  return _CifarUnpickler(io.BytesIO(raw), encoding="bytes").load()


def _cifar_batch(raw: bytes, name: str, where: str) -> tuple[np.ndarray, np.ndarray]:
  try:
    batch = load_cifar_pickle(raw)
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
  except Exception as e:  # pickle errors come in many types
    raise CommandError(
      f"--data {where}: {name} is not a CIFAR-10 python batch (a pickled dict with"
      f" b'data' uint8 (N, 3072) and b'labels'): {short_error(e)}"
    ) from None
  if data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (data.shape[0],):
    raise CommandError(
      f"--data {where}: {name} holds data {data.shape} and labels {labels.shape};"
      " a CIFAR-10 python batch has data (N, 3072) and N labels"
    )
  images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return np.ascontiguousarray(images), labels.astype(np.int32)


_CIFAR_CLASSES = (
  "airplane",
  "automobile",
  "bird",
  "cat",
  "deer",
  "dog",
  "frog",
  "horse",
  "ship",
  "truck",
)
CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)


def _cifar_from_blobs(blobs: dict, where: str, source_id: str) -> Images:
  missing = [f for f in CIFAR_FILES if f not in blobs]
  if missing:
    raise CommandError(f"--data {where}: missing {', '.join(missing)}; {_EXPECTED}")
  parts = [_cifar_batch(blobs[f], f, where) for f in CIFAR_FILES]
  train_x = np.concatenate([p[0] for p in parts[:5]])
  train_y = np.concatenate([p[1] for p in parts[:5]])
  return Images(
    "cifar10-python", source_id, train_x, train_y, parts[5][0], parts[5][1], _CIFAR_CLASSES, 255.0
  )


def _read_cifar_folder(path: pathlib.Path) -> Images:
  blobs = {f: (path / f).read_bytes() for f in CIFAR_FILES if (path / f).is_file()}
  return _cifar_from_blobs(blobs, str(path), cache_digest(_folder_id(path)))


def _read_cifar_tar(tar: tarfile.TarFile, path: pathlib.Path) -> Images:
  blobs = {}
  for m in tar.getmembers():
    base = m.name.rsplit("/", 1)[-1]
    member = tar.extractfile(m) if m.isfile() and base in CIFAR_FILES else None
    if member is not None:
      blobs[base] = member.read()
  return _cifar_from_blobs(blobs, str(path), cache_digest(_file_id(path)))


def interleaved_order(labels: np.ndarray, seed: int = 0) -> np.ndarray:
  """The seeded class-interleaved order of an image-folder split.

  ``labels[i]`` is the class of the ``i``-th file in (class, file name) sorted order.
  Within each class (in label order) the files are shuffled by one
  ``numpy.random.default_rng(seed)``; then the classes are dealt round-robin, so
  the first ``k * C`` positions hold ``k`` images of each of the ``C`` classes
  (classes that run out are skipped).

  Args:
    labels: int labels of the sorted files, ``(N,)``.
    seed: the order seed (``--order-seed``).

  Returns:
    A permutation ``order`` of ``range(N)``: position ``j`` of the training pool is
    sorted file ``order[j]``.
  """
  labels = np.asarray(labels)
  rng = np.random.default_rng(seed)
  per_class = []
  for c in np.unique(labels):
    idx = np.flatnonzero(labels == c)
    per_class.append(idx[rng.permutation(idx.size)])
  longest = max((p.size for p in per_class), default=0)
  order = [p[k] for k in range(longest) for p in per_class if k < p.size]
  return np.asarray(order, dtype=np.int64)


def _split_of(parts: Sequence[str]) -> Optional[tuple[str, str]]:
  """``(split, class)`` when a path ends in ``<train|test>/<class>/<image>``."""
  if len(parts) < 3 or not parts[-1].lower().endswith(_IMAGE_SUFFIXES):
    return None
  if parts[-3] not in ("train", "test") or parts[-1].startswith("."):
    return None
  return parts[-3], parts[-2]


def _decode(raw: bytes, name: str, where: str) -> np.ndarray:
  try:
    with Image.open(io.BytesIO(raw)) as im:
      return np.asarray(im.convert("RGB"), dtype=np.uint8)
  except Exception as e:  # Pillow raises several types
    raise CommandError(f"--data {where}: cannot decode image {name}: {short_error(e)}") from None


def _image_folder(
  files: Iterable[tuple[str, str, str, bytes]],
  where: str,
  source_id: str,
  order_seed: int,
  progress: bool,
) -> Images:
  """``files`` yields ``(split, class, name, bytes)``."""
  found: dict[str, list] = {"train": [], "test": []}
  for split, cls, name, raw in tqdm(
    files, desc="decoding images", unit="img", disable=not progress, leave=False
  ):
    found[split].append((cls, name, _decode(raw, name, where)))
  if not found["train"] or not found["test"]:
    raise CommandError(
      f"--data {where}: found {len(found['train'])} training and"
      f" {len(found['test'])} test images; {_EXPECTED}"
    )
  classes = tuple(sorted({c for c, _, _ in found["train"]}))
  unknown = sorted({c for c, _, _ in found["test"]} - set(classes))
  if unknown:
    raise CommandError(f"--data {where}: test classes {unknown} have no training images")
  shapes = {im.shape for s in found.values() for _, _, im in s}
  if len(shapes) != 1:
    raise CommandError(
      f"--data {where}: images differ in size {sorted(shapes)[:4]}; all images must have one size"
    )
  index = {c: i for i, c in enumerate(classes)}
  out = []
  for split in ("train", "test"):
    items = sorted(found[split], key=lambda t: (index[t[0]], t[1]))
    y = np.asarray([index[c] for c, _, _ in items], dtype=np.int32)
    x = np.stack([im for _, _, im in items])
    order = interleaved_order(y, order_seed)
    out += [x[order], y[order]]
  return Images("image-folder", source_id, out[0], out[1], out[2], out[3], classes, 255.0)


def _read_image_folder(path: pathlib.Path, order_seed: int, progress: bool) -> Images:
  def files() -> Iterator[tuple[str, str, str, bytes]]:
    for root, _, names in os.walk(path):
      for n in names:
        full = pathlib.Path(root) / n
        rel = full.relative_to(path).parts
        hit = _split_of(rel)
        if hit:
          yield hit[0], hit[1], n, full.read_bytes()

  return _image_folder(files(), str(path), cache_digest(_folder_id(path)), order_seed, progress)


def _read_image_tar(
  tar: tarfile.TarFile, path: pathlib.Path, order_seed: int, progress: bool
) -> Images:
  def files() -> Iterator[tuple[str, str, str, bytes]]:
    for m in tar:
      if not m.isfile():
        continue
      hit = _split_of(m.name.split("/"))
      data = tar.extractfile(m) if hit else None  # never None for a regular file
      if hit and data is not None:
        yield hit[0], hit[1], m.name.rsplit("/", 1)[-1], data.read()

  return _image_folder(files(), str(path), cache_digest(_file_id(path)), order_seed, progress)


def _folder_kind(path: pathlib.Path) -> tuple[str, pathlib.Path]:
  if (path / "data_batch_1").is_file() or (path / "test_batch").is_file():
    return "cifar", path
  if (path / "cifar-10-batches-py").is_dir():
    return "cifar", path / "cifar-10-batches-py"
  if (path / "train").is_dir() and (path / "test").is_dir():
    return "folder", path
  subdirs = [p for p in path.iterdir() if p.is_dir()]
  if len(subdirs) == 1 and (subdirs[0] / "train").is_dir():
    return "folder", subdirs[0]
  raise CommandError(
    f"--data {path}: folder has neither data_batch_1 nor train/ and test/; {_EXPECTED}"
  )


def _read_path(path: pathlib.Path, order_seed: int, progress: bool) -> Images:
  if not path.exists():
    raise CommandError(f"--data {path}: no such file or folder; {_EXPECTED}")
  if path.is_dir():
    kind, root = _folder_kind(path)
    if kind == "cifar":
      return _read_cifar_folder(root)
    return _read_image_folder(root, order_seed, progress)
  try:
    tar = tarfile.open(path, "r:*")  # noqa: SIM115 (closed by the `with tar:` below)
  except (tarfile.TarError, OSError) as e:
    raise CommandError(
      f"--data {path}: not a readable tar archive ({short_error(e)}); {_EXPECTED}"
    ) from None
  with tar:
    try:
      names = tar.getnames()
    except (tarfile.TarError, OSError, EOFError) as e:
      raise CommandError(
        f"--data {path}: damaged archive ({short_error(e)}); {_EXPECTED}"
      ) from None
    if any(n.rsplit("/", 1)[-1] == "data_batch_1" for n in names):
      return _read_cifar_tar(tar, path)
    if any(_split_of(n.split("/")) for n in names):
      return _read_image_tar(tar, path, order_seed, progress)
  raise CommandError(
    f"--data {path}: the archive holds neither data_batch_1 nor train/<class>/<image>; {_EXPECTED}"
  )


def _digits() -> Images:
  bunch = load_digits()
  x = np.asarray(bunch.images, np.float64).round().astype(np.uint8)[..., None]
  y = np.asarray(bunch.target, np.int32)
  perm = np.random.default_rng(0).permutation(len(y))
  x, y = x[perm], y[perm]
  n_test = 500
  return Images(
    "digits",
    f"sklearn-digits-{sklearn.__version__}",
    x[:-n_test],
    y[:-n_test],
    x[-n_test:],
    y[-n_test:],
    tuple(str(i) for i in range(10)),
    16.0,
  )


def _random(seed: int = 0) -> Images:
  rng = np.random.default_rng(seed)
  return Images(
    "random",
    f"random-{seed}",
    rng.integers(0, 256, (50_000, 32, 32, 3), dtype=np.uint8),
    rng.integers(0, 10, 50_000).astype(np.int32),
    rng.integers(0, 256, (10_000, 32, 32, 3), dtype=np.uint8),
    rng.integers(0, 10, 10_000).astype(np.int32),
    tuple(str(i) for i in range(10)),
    255.0,
  )


def load_images(
  data: Optional[str],
  *,
  order_seed: int = 0,
  cache_dir: Optional[pathlib.Path] = None,
  progress: bool = False,
) -> Images:
  """Reads a source named by ``--data`` (see the module docstring).

  Image-folder sources are decoded once and cached in ``cache_dir`` (keyed by the
  file's path, size and modification time and by ``order_seed``).

  Raises:
    CommandError: one line naming the path and what was expected.
  """
  if data is None:
    return _digits()
  if data == "random" and not os.path.exists(data):
    return _random()
  path = pathlib.Path(data).expanduser()
  if not path.exists():
    raise CommandError(f"--data {path}: no such file or folder; {_EXPECTED}")
  is_cifar = path.is_dir() and _folder_kind(path)[0] == "cifar"
  is_cifar = is_cifar or path.name.startswith("cifar-10-python")
  if cache_dir is None or is_cifar:
    return _read_path(path, order_seed, progress)
  ident = _file_id(path) if path.is_file() else _folder_id(path)
  key = cache_digest({"source": ident, "order_seed": order_seed, "version": CACHE_VERSION})
  cfile = pathlib.Path(cache_dir) / f"images-{key}.npz"
  cached = load_npz(cfile, ("train_x", "train_y", "test_x", "test_y", "meta"))
  meta = None
  if cached is not None:
    try:
      meta = json.loads(str(cached["meta"]))
      meta = {k: meta[k] for k in ("name", "source_id", "classes", "pixel_max")}
    except (ValueError, KeyError, TypeError) as e:
      print(
        f"stiefax: cache file {cfile} is damaged ({short_error(e)}); rebuilding it",
        file=sys.stderr,
        flush=True,
      )
      meta = None
  if meta is not None and cached is not None:
    return Images(
      meta["name"],
      meta["source_id"],
      cached["train_x"],
      cached["train_y"],
      cached["test_x"],
      cached["test_y"],
      tuple(meta["classes"]),
      meta["pixel_max"],
    )
  images = _read_path(path, order_seed, progress)
  if images.name == "image-folder":
    meta = {
      "name": images.name,
      "source_id": images.source_id,
      "classes": list(images.classes),
      "pixel_max": images.pixel_max,
    }
    save_npz(
      cfile,
      train_x=images.train_x,
      train_y=images.train_y,
      test_x=images.test_x,
      test_y=images.test_y,
      meta=np.asarray(json.dumps(meta)),
    )
  return images
