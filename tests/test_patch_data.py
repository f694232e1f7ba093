"""Image data of the patch benchmark: readers, order, whitening and the cache."""

import io
import pathlib
import pickle
import re
import tarfile

import numpy as np
import pytest

from stiefax.experiments import flags
from stiefax.experiments.patches import data as patch_data
from stiefax.experiments.patches import images as patch_images


def test_cifar_python_folder_and_archive_read_identically(cifar):
  a = patch_images.load_images(str(cifar["folder"]))
  b = patch_images.load_images(str(cifar["archive"]))
  c = patch_images.load_images(str(cifar["folder"].parent))  # the folder above also works
  assert a.name == b.name == "cifar10-python" and a.train_x.shape == (600, 32, 32, 3)
  np.testing.assert_array_equal(a.train_x, cifar["train_x"])  # official order, HWC
  np.testing.assert_array_equal(a.train_y, cifar["train_y"])
  for other in (b, c):
    np.testing.assert_array_equal(other.train_x, a.train_x)
    np.testing.assert_array_equal(other.test_y, a.test_y)


def test_extract_patches_raster_order():
  img = np.arange(2 * 4 * 4 * 1).reshape(2, 4, 4, 1)
  p = patch_data.extract_patches(img, 2)
  assert p.shape == (2, 4, 4)
  np.testing.assert_array_equal(p[0, 0], [0, 1, 4, 5])
  np.testing.assert_array_equal(p[0, 1], [2, 3, 6, 7])  # second patch of the first row
  np.testing.assert_array_equal(p[1, 3], [26, 27, 30, 31])
  with pytest.raises(flags.CommandError, match="--patch 3"):
    patch_data.extract_patches(img, 3)


def test_whitening_gives_lambda_over_lambda_plus_eps(cifar, tmp_path):
  images = patch_images.load_images(str(cifar["folder"]))
  kw = dict(n_train=512, patch=8, d=48, cache_dir=tmp_path)
  data = patch_data.prepare(images, whiten_eps=0.1, **kw)
  w = data.whitening
  assert data.train_x.shape == (512, 16, 48) and data.test_x.shape == (100, 16, 48)
  assert w.n_fit == 512 * 16  # fewer than 100k patches: the fit uses all of them
  z = data.train_x.reshape(-1, 48).astype(np.float64)
  cov = np.cov(z, rowvar=False, bias=True)
  target = w.eigvals / (w.eigvals + 0.1)
  np.testing.assert_allclose(np.diag(cov), target, atol=2e-5)
  off = cov - np.diag(np.diag(cov))
  assert np.max(np.abs(off)) < 2e-5
  # Controls: the raw patches are strongly correlated, and eps visibly damps.
  raw = patch_data.contrast_normalize(
    patch_data.extract_patches(images.train_x[:512], 8) / np.float32(255)
  )
  raw_cov = np.cov(raw.reshape(-1, 192), rowvar=False)
  assert np.max(np.abs(raw_cov - np.diag(np.diag(raw_cov)))) > 0.1
  assert target.min() < 0.9 * target.max()
  # Contrast normalization: mean 0, variance v / (v + CONTRAST_EPS) (~1 unless flat).
  v = (patch_data.extract_patches(images.train_x[:512], 8) / 255.0).var(-1)
  np.testing.assert_allclose(raw.mean(-1), 0, atol=1e-5)
  np.testing.assert_allclose(raw.var(-1), v / (v + patch_data.CONTRAST_EPS), rtol=1e-4)
  assert np.median(raw.var(-1)) > 0.95
  # Only training images enter the fit; the test split is whitened with it.
  direct = patch_data.apply_whitening(
    w, patch_data.contrast_normalize(patch_data.extract_patches(images.test_x, 8) / np.float32(255))
  )
  np.testing.assert_allclose(data.test_x, direct, atol=1e-4)
  # Cached by configuration: the same key loads the file, another eps makes another.
  again = patch_data.prepare(images, whiten_eps=0.1, **kw)
  assert again.cache_file == data.cache_file and pathlib.Path(data.cache_file).is_file()
  np.testing.assert_array_equal(again.train_x, data.train_x)
  other = patch_data.prepare(images, whiten_eps=1.0, **kw)
  assert other.cache_file != data.cache_file
  np.testing.assert_allclose(
    np.diag(np.cov(other.train_x.reshape(-1, 48), rowvar=False, bias=True)),
    other.whitening.eigvals / (other.whitening.eigvals + 1.0),
    atol=2e-5,
  )


def test_whitening_subsample(cifar):
  images = patch_images.load_images(str(cifar["folder"]))
  raw = patch_data.contrast_normalize(
    patch_data.extract_patches(images.train_x[:512], 8) / np.float32(255)
  ).reshape(-1, 192)
  sub = patch_data.fit_whitening(raw, 32, 0.1, n_samples=2000, seed=0)
  full = patch_data.fit_whitening(raw, 32, 0.1, n_samples=10**6)
  assert sub.n_fit == 2000 and full.n_fit == raw.shape[0]
  assert not np.allclose(sub.eigvals, full.eigvals)
  np.testing.assert_allclose(sub.eigvals[:2], full.eigvals[:2], rtol=0.05)


def _write_jpeg(path, value):
  from PIL import Image

  path.parent.mkdir(parents=True, exist_ok=True)
  Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(path, quality=95)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
  """train/<class>/*.jpg with 4, 3, 2 images; each image's grey level codes its file."""
  root = tmp_path_factory.mktemp("imgfolder") / "cifar10"
  counts = {"cat": 4, "dog": 3, "frog": 2}
  codes = {}
  for split, scale in (("train", 1), ("test", 0)):
    for c, (cls, n) in enumerate(counts.items()):
      for k in range(n if scale else 1):
        value = 16 + 60 * c + 12 * k + 4 * (1 - scale)
        _write_jpeg(root / split / cls / f"img_{k}.jpg", value)
        codes[(split, cls, k)] = value
  archive = root.parent / "cifar10-jpeg.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:
    tar.add(root, arcname="cifar10")
  return {"root": root, "archive": archive, "counts": counts, "codes": codes}


def _expected_order(counts, seed):
  """The documented rule, written out: shuffle each class, then deal round-robin."""
  rng = np.random.default_rng(seed)
  per_class = [(c, list(rng.permutation(n))) for c, n in enumerate(counts.values())]
  order = []
  for k in range(max(counts.values())):
    order += [(c, int(p[k])) for c, p in per_class if k < len(p)]
  return order


@pytest.mark.parametrize("seed", [0, 3])
def test_image_folder_interleaved_order(image_folder, tmp_path, seed):
  folder = patch_images.load_images(str(image_folder["root"]), order_seed=seed)
  archive = patch_images.load_images(
    str(image_folder["archive"]), order_seed=seed, cache_dir=tmp_path
  )
  cached = patch_images.load_images(
    str(image_folder["archive"]), order_seed=seed, cache_dir=tmp_path
  )
  assert folder.name == "image-folder" and folder.classes == ("cat", "dog", "frog")
  assert list(tmp_path.glob("images-*.npz"))  # decoded once, then read from the cache
  expected = _expected_order(image_folder["counts"], seed)
  names = list(image_folder["counts"])
  values = [image_folder["codes"][("train", names[c], k)] for c, k in expected]
  assert [c for c, _ in expected] == list(folder.train_y)
  np.testing.assert_allclose(folder.train_x[:, 0, 0, 0], values, atol=3)
  assert list(folder.train_y[:6]) == [0, 1, 2, 0, 1, 2]  # balanced prefix
  for other in (archive, cached):
    np.testing.assert_array_equal(other.train_x, folder.train_x)
    np.testing.assert_array_equal(other.train_y, folder.train_y)
  assert sorted(folder.test_y) == [0, 1, 2]


def test_interleaved_order_depends_on_seed():
  labels = np.repeat(np.arange(3), 20)
  a, b = patch_images.interleaved_order(labels, 0), patch_images.interleaved_order(labels, 1)
  assert sorted(a) == list(range(60)) and not np.array_equal(a, b)
  np.testing.assert_array_equal(labels[a][:9], [0, 1, 2] * 3)


def _bad_tar(path, members):
  with tarfile.open(path, "w:gz") as tar:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return path


def test_missing_and_malformed_data_are_one_line_errors(tmp_path, cifar):
  cases = {
    "missing": (tmp_path / "nope.tar.gz", "no such file"),
    "not a tar": (tmp_path / "junk.tar.gz", "not a readable tar"),
    "empty folder": (tmp_path / "empty", "neither data_batch_1 nor train/"),
    "unrelated tar": (
      _bad_tar(tmp_path / "other.tar.gz", {"a/readme.txt": b"hi"}),
      "neither data_batch_1",
    ),
    "bad batch": (tmp_path / "badbatch", "is not a CIFAR-10 python batch"),
    "bad shape": (tmp_path / "badshape", "data (4, 10)"),
    "no test": (tmp_path / "notest", "missing test_batch"),
  }
  (tmp_path / "junk.tar.gz").write_bytes(b"this is not an archive")
  (tmp_path / "empty").mkdir()
  for name, payload in (
    ("badbatch", b"garbage"),
    ("badshape", pickle.dumps({b"data": np.zeros((4, 10), np.uint8), b"labels": [0] * 4})),
  ):
    (tmp_path / name).mkdir()
    for f in patch_images.CIFAR_FILES:
      (tmp_path / name / f).write_bytes(payload)
  (tmp_path / "notest").mkdir()
  for i in range(1, 6):
    src = cifar["folder"] / f"data_batch_{i}"
    (tmp_path / "notest" / src.name).write_bytes(src.read_bytes())
  for name, (path, message) in cases.items():
    with pytest.raises(flags.CommandError, match=re.escape(message)) as err:
      patch_images.load_images(str(path))
    assert "\n" not in str(err.value), name
    assert str(path) in str(err.value), name
  # A good path is not an error (control).
  assert patch_images.load_images(str(cifar["archive"])).train_x.shape[0] == 600


@pytest.mark.parametrize("damage", ["truncate", "garbage", "missing-array"])
def test_damaged_cache_files_are_rebuilt_with_a_notice(
  cifar, image_folder, tmp_path, capsys, damage
):
  images = patch_images.load_images(str(cifar["folder"]))
  kw = dict(n_train=64, patch=8, d=16, cache_dir=tmp_path, whiten_eps=0.1)
  data = patch_data.prepare(images, **kw)
  folder = patch_images.load_images(str(image_folder["archive"]), cache_dir=tmp_path)
  files = sorted(tmp_path.glob("*.npz"))
  assert [f.name.split("-")[0] for f in files] == ["images", "patches"]
  for f in files:
    raw = f.read_bytes()
    if damage == "truncate":
      f.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
      f.write_bytes(b"not a zip file at all" * 10)
    else:
      with np.load(f) as z:
        arrays = {k: z[k] for k in z.files if k not in ("meta", "w_proj")}
      with open(f, "wb") as fh:
        np.savez(fh, **arrays)
  capsys.readouterr()
  again = patch_data.prepare(images, **kw)
  folder_again = patch_images.load_images(str(image_folder["archive"]), cache_dir=tmp_path)
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 2 and all("is damaged" in ln and "rebuilding it" in ln for ln in err)
  assert {pathlib.Path(ln.split("cache file ")[1].split(" is damaged")[0]) for ln in err} == set(
    files
  )
  np.testing.assert_array_equal(again.train_x, data.train_x)
  np.testing.assert_array_equal(folder_again.train_x, folder.train_x)
  patch_data.prepare(images, **kw)  # the rebuilt files read back silently
  patch_images.load_images(str(image_folder["archive"]), cache_dir=tmp_path)
  assert capsys.readouterr().err == ""
