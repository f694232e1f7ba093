"""Data for ``stiefax patches``: image readers, patches, contrast normalization, whitening.

The paper's input pipeline (section 3.3): each image is cut into non-overlapping
``p x p`` patches (CIFAR-10: 16 patches of ``8 x 8 x 3`` = 192 raw values), each patch
is contrast-normalized (its mean subtracted, divided by its standard deviation) and
then PCA-whitened to ``d`` dimensions by one projection ``V (Lambda + eps)^{-1/2}``
(``eps = 0.1``), fit on a subsample of at most 100 000 patches of the *training*
images only. The whitened tokens are cached on disk, keyed by their configuration.

The images come from :mod:`stiefax.experiments.patches.images` (its names are
re-exported here).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Optional

import numpy as np

from stiefax.experiments.flags import CommandError
from stiefax.experiments.patches.cache import CACHE_VERSION
from stiefax.experiments.patches.cache import cache_digest
from stiefax.experiments.patches.cache import load_npz
from stiefax.experiments.patches.cache import save_npz
from stiefax.experiments.patches.images import Images

__all__ = [
  "Whitening",
  "PatchData",
  "CONTRAST_EPS",
  "extract_patches",
  "contrast_normalize",
  "fit_whitening",
  "apply_whitening",
  "prepare",
]

#: Variance floor of the contrast normalization, in units of the pixel range [0, 1]:
#: ``(x - mean) / sqrt(var + CONTRAST_EPS)`` keeps flat patches finite.
CONTRAST_EPS = 1e-4


# ---------------------------------------------------------------------------- pipeline


def extract_patches(images: np.ndarray, patch: int) -> np.ndarray:
  """Cuts ``(N, H, W, C)`` images into non-overlapping ``patch x patch`` tokens.

  Tokens are in raster order (row of patches by row); each token is its
  ``(patch, patch, C)`` block flattened.

  Returns:
    ``(N, (H // patch) * (W // patch), patch * patch * C)``, the input's dtype.
  """
  n, h, w, c = images.shape
  if h % patch or w % patch:
    raise CommandError(
      f"--patch {patch} does not divide the {h}x{w} images; choose a divisor of both sides"
    )
  gh, gw = h // patch, w // patch
  x = images.reshape(n, gh, patch, gw, patch, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(n, gh * gw, patch * patch * c)


def contrast_normalize(patches: np.ndarray, eps: float = CONTRAST_EPS) -> np.ndarray:
  """Per-patch contrast normalization ``(x - mean(x)) / sqrt(var(x) + eps)``.

  Over the last axis (all pixels and channels of a patch); float32 out.
  """
  x = patches.astype(np.float32)
  x = x - x.mean(axis=-1, keepdims=True)
  return x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + np.float32(eps))


@dataclasses.dataclass(frozen=True)
class Whitening:
  """PCA whitening ``z = (x - mean) V (Lambda + eps)^{-1/2}`` (paper section 3.3)."""

  mean: np.ndarray  # (D,) mean of the fitted patches
  proj: np.ndarray  # (D, d) = V (Lambda + eps)^{-1/2}, float64
  eigvals: np.ndarray  # (d,) Lambda, the top-d covariance eigenvalues (descending)
  eps: float
  n_fit: int  # patches the fit used


def fit_whitening(
  patches: np.ndarray, d: int, eps: float = 0.1, n_samples: int = 100_000, seed: int = 0
) -> Whitening:
  """Fits the whitening projection on at most ``n_samples`` patches (float64).

  The covariance ``C = V Lambda V^T`` of the (sub)sampled patches; the top ``d``
  eigenpairs give ``proj = V_d (Lambda_d + eps)^{-1/2}``, so the whitened fit sample
  has covariance ``diag(Lambda_d / (Lambda_d + eps))``: ~1 along strong directions,
  damped along weak ones.

  Args:
    patches: ``(M, D)`` contrast-normalized patches of training images.
    d: output dimension (``<= D``).
    eps: the eigenvalue regularizer.
    n_samples: size of the uniform subsample without replacement.
    seed: subsample seed.

  Returns:
    A :class:`Whitening`.
  """
  m, dim = patches.shape
  if d > dim:
    raise CommandError(f"--d {d} exceeds the raw patch dimension {dim}; choose d <= {dim}")
  if m < 2:
    raise CommandError(f"whitening needs at least 2 training patches, got {m}")
  if m > n_samples:
    idx = np.sort(np.random.default_rng(seed).choice(m, n_samples, replace=False))
    patches = patches[idx]
  x = patches.astype(np.float64)
  mean = x.mean(axis=0)
  x = x - mean
  cov = x.T @ x / x.shape[0]
  lam, vec = np.linalg.eigh(cov)
  lam, vec = lam[::-1][:d], vec[:, ::-1][:, :d]
  lam = np.maximum(lam, 0.0)
  # Fix each eigenvector's sign (largest entry positive) so fits are reproducible.
  signs = np.sign(vec[np.argmax(np.abs(vec), axis=0), np.arange(d)])
  vec = vec * np.where(signs == 0, 1.0, signs)[None, :]
  return Whitening(mean, vec / np.sqrt(lam + eps)[None, :], lam, float(eps), int(x.shape[0]))


def apply_whitening(w: Whitening, patches: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
  """``(patches - mean) @ proj`` over the last axis, float32, in chunks."""
  lead = patches.shape[:-1]
  flat = patches.reshape(-1, patches.shape[-1])
  out = np.empty((flat.shape[0], w.proj.shape[1]), np.float32)
  mean32, proj32 = w.mean.astype(np.float32), w.proj.astype(np.float32)
  for s in range(0, flat.shape[0], chunk):
    out[s : s + chunk] = (flat[s : s + chunk].astype(np.float32) - mean32[None, :]) @ proj32
  return out.reshape(lead + (w.proj.shape[1],))


@dataclasses.dataclass(frozen=True)
class PatchData:
  """Whitened tokens ``(N, P, d)`` float32 for the training set, validation and test."""

  train_x: np.ndarray
  train_y: np.ndarray
  val_x: np.ndarray  # images [n_train : n_train + n_val] of the training pool
  val_y: np.ndarray
  test_x: np.ndarray
  test_y: np.ndarray
  whitening: Whitening
  config: dict  # the data configuration (the cache key's content)
  cache_file: Optional[str]

  @property
  def num_classes(self) -> int:
    return int(max(self.train_y.max(), self.test_y.max())) + 1


def _tokens(
  images: np.ndarray, patch: int, pixel_max: float, w: Optional[Whitening], chunk: int = 4096
) -> np.ndarray:
  """Contrast-normalized (and whitened, if ``w``) tokens, image chunk by chunk."""
  out = []
  for s in range(0, images.shape[0], chunk):
    p = extract_patches(images[s : s + chunk], patch).astype(np.float32) / np.float32(pixel_max)
    p = contrast_normalize(p)
    out.append(p if w is None else apply_whitening(w, p))
  return np.concatenate(out) if out else np.zeros((0,), np.float32)


def prepare(
  images: Images,
  *,
  n_train: int,
  n_val: int = 0,
  patch: int = 8,
  d: int = 128,
  whiten_eps: float = 0.1,
  pca_samples: int = 100_000,
  pca_seed: int = 0,
  cache_dir: Optional[pathlib.Path] = None,
  order_seed: int = 0,
) -> PatchData:
  """The whitened token arrays of the paper's pipeline, from the cache when present.

  Training set: the first ``n_train`` images of the training pool; validation:
  images ``[n_train : n_train + n_val]`` (never trained on, not used by the
  whitening fit); test: the whole test split.

  Args:
    images: a source from :func:`load_images`.
    n_train: training images.
    n_val: validation images (0 for none).
    patch: patch side.
    d: whitened dimension.
    whiten_eps: the whitening regularizer ``eps``.
    pca_samples: patches in the whitening fit's subsample.
    pca_seed: the subsample's seed.
    cache_dir: where to cache (``None``: no cache).
    order_seed: the training pool's order seed (recorded in the key).

  Returns:
    A :class:`PatchData`.
  """
  pool = images.train_x.shape[0]
  if n_train < 1 or n_val < 0 or n_train + n_val > pool:
    raise CommandError(
      f"--n-train {n_train} plus --n-val {n_val} must lie in [1, {pool}], the"
      f" {images.name} training pool"
    )
  config = {
    "source": images.name,
    "source_id": images.source_id,
    "n_train": int(n_train),
    "n_val": int(n_val),
    "patch": int(patch),
    "d": int(d),
    "whiten_eps": float(whiten_eps),
    "pca_samples": int(pca_samples),
    "pca_seed": int(pca_seed),
    "contrast_eps": CONTRAST_EPS,
    "order_seed": int(order_seed),
    "version": CACHE_VERSION,
  }
  cfile = None
  if cache_dir is not None and images.name != "random":
    cfile = (
      pathlib.Path(cache_dir) / f"patches-{images.name}-n{n_train}-d{d}-{cache_digest(config)}.npz"
    )
    z = load_npz(
      cfile,
      (
        "train_x",
        "train_y",
        "val_x",
        "val_y",
        "test_x",
        "test_y",
        "w_mean",
        "w_proj",
        "w_eigvals",
        "w_eps",
        "w_n_fit",
      ),
    )
    if z is not None:
      w = Whitening(z["w_mean"], z["w_proj"], z["w_eigvals"], float(z["w_eps"]), int(z["w_n_fit"]))
      return PatchData(
        z["train_x"],
        z["train_y"],
        z["val_x"],
        z["val_y"],
        z["test_x"],
        z["test_y"],
        w,
        config,
        str(cfile),
      )
  train_img = images.train_x[:n_train]
  raw = _tokens(train_img, patch, images.pixel_max, None)
  w = fit_whitening(raw.reshape(-1, raw.shape[-1]), d, whiten_eps, pca_samples, pca_seed)
  train_x = apply_whitening(w, raw)
  del raw
  val_img = images.train_x[n_train : n_train + n_val]
  tokens = train_x.shape[1]
  val_x = (
    _tokens(val_img, patch, images.pixel_max, w) if n_val else np.zeros((0, tokens, d), np.float32)
  )
  test_x = _tokens(images.test_x, patch, images.pixel_max, w)
  data = PatchData(
    train_x,
    images.train_y[:n_train].astype(np.int32),
    val_x,
    images.train_y[n_train : n_train + n_val].astype(np.int32),
    test_x,
    images.test_y.astype(np.int32),
    w,
    config,
    None if cfile is None else str(cfile),
  )
  if cfile is not None:
    save_npz(
      cfile,
      train_x=data.train_x,
      train_y=data.train_y,
      val_x=data.val_x,
      val_y=data.val_y,
      test_x=data.test_x,
      test_y=data.test_y,
      w_mean=w.mean,
      w_proj=w.proj,
      w_eigvals=w.eigvals,
      w_eps=np.asarray(w.eps),
      w_n_fit=np.asarray(w.n_fit),
    )
  return data
