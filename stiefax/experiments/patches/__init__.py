"""Image-patch benchmark (paper sections 3.3, 4.1, 4.2, 4.5-4.7).

``stiefax patches [run|sweep-n|sweep-eps] [options]``

Data: CIFAR-10 from the python-format archive or folder, or an image-folder copy
(``--data``; see :mod:`stiefax.experiments.patches.data`), or, with no ``--data``,
scikit-learn's ``digits`` (real 8x8 images shipped with the package: 4x4 patches, 4
tokens of raw dimension 16 whitened to d=16, 4 heads of r=4). Tokens are contrast-
normalized, PCA-whitened patches, cached on disk (``--cache``).

Model (the paper leaves depth, positions and pooling open; chosen here): the
whitened tokens are the embeddings (no extra input projection: the whitening *is*
the embedding), plus a learned positional embedding ``(P, d)`` (normal, std 0.02);
``--depth`` (default 1) pre-LN blocks ``x += MHA(LN(x)); x += MLP(LN(x))`` (Flax
``MultiHeadDotProductAttention`` with H heads of width r, so W_Q, W_K are
``(d, H, r)`` kernels = H frames in St(d, r); MLP d -> 4d -> d with GELU); final
LayerNorm, mean pooling over tokens, classifier ``W_cls``. Xavier-uniform kernels.

Training: batch 256 (the last partial batch of an epoch is kept), AdamW on every
non-frame parameter (rate ``--adamw-lr``, decay 0.05 on rank >= 2 tensors only, not
LayerNorm), 5-epoch linear warm-up then cosine to zero
(``optax.warmup_cosine_decay_schedule``), applied to the Riemannian rate too; plain
cross-entropy; test accuracy at the final epoch. The batch order and the initial
non-frame parameters depend on the seed only (shared across arms); the orthonormal
frames are drawn from the seed too (identical across the arms that use them).

Arms (``--arms``, or ``all`` for the paper's eight above the blank line):

  A2           AdamW + Xavier on everything (rate --adamw-lr, paper's 1e-2)
  A2-orth      AdamW, W_Q and W_K initialized orthonormal
  B2           riemannian_adam(1.0, eps=1e-8, max_norm=0.1) on W_Q, W_K
  B2-SGD       riemannian_sgd(0.02), Grassmann projector (alias PA16)
  frozen       the Riemannian arm at rate 0 (frames stay at their init)
  elementwise  riemannian_adam(0.03, moment="elementwise")
  grassmann    riemannian_adam(1.0, projector="grassmann")
  soft         AdamW + lambda * orthogonality_penalty (lambda = --penalty, 0.1)

  B2-mmuon     manifold_muon(0.05) on W_Q, W_K (spectral-norm steepest descent on St)
  A2-muon      optax.contrib.muon(0.02) on W_Q, W_K (Xavier init, unconstrained)
  B2-qr        B2 with the sign-fixed QR retraction
  B2-cayley    B2 with the Cayley retraction

  A2-qknorm    A2 with QK-norm: LayerNorm (no bias, learned scale) on each head's q, k
  A2-sigma     A2 with sigmaReparam W_Q, W_K: (gamma / sigma(W)) W, one power step a step
  B2-qknorm    B2 with the same QK-norm

Protocols: ``run`` (default; ``--seeds`` paired, ``--select-lr`` first picks each
arm's rate on the validation images [n_train : n_train + n_val]), ``sweep-n``
(``--ns`` at about ``--budget`` 2000 steps per run, paper Table 3), ``sweep-eps``
(``--eps-values`` for B2, Section 4.7). One JSON file per run goes to ``--out``;
``stiefax report DIR`` (or the table printed at the end) gives per-arm mean +- std,
the paired difference to A2 (t, p, wins, paired-t and bootstrap 95% CIs),
isometry error and wall-clock per epoch.
"""

from stiefax.experiments.patches.command import add_arguments
from stiefax.experiments.patches.command import run
from stiefax.experiments.patches.config import ADAM_ARMS
from stiefax.experiments.patches.config import ARMS
from stiefax.experiments.patches.config import EXPERIMENT
from stiefax.experiments.patches.config import LOGIT_ARMS
from stiefax.experiments.patches.config import OPTIMIZER_ARMS
from stiefax.experiments.patches.config import PROTOCOLS
from stiefax.experiments.patches.config import Setting
from stiefax.experiments.patches.config import arm_by_name
from stiefax.experiments.patches.config import arm_hparams
from stiefax.experiments.patches.config import hyper
from stiefax.experiments.patches.model import frame_paths
from stiefax.experiments.patches.model import init_params
from stiefax.experiments.patches.model import make_model
from stiefax.experiments.patches.runs import config_hash
from stiefax.experiments.patches.runs import run_command
from stiefax.experiments.patches.runs import run_identity
from stiefax.experiments.patches.runs import run_key
from stiefax.experiments.patches.runs import run_name
from stiefax.experiments.patches.tables import report
from stiefax.experiments.patches.training import Trainer
from stiefax.experiments.patches.training import train

__all__ = [
  "add_arguments",
  "run",
  "report",
  "run_key",
  "run_identity",
  "config_hash",
  "run_name",
  "run_command",
  "EXPERIMENT",
  "PROTOCOLS",
  "ARMS",
  "ADAM_ARMS",
  "OPTIMIZER_ARMS",
  "LOGIT_ARMS",
  "arm_by_name",
  "arm_hparams",
  "Setting",
  "make_model",
  "hyper",
  "init_params",
  "frame_paths",
  "Trainer",
  "train",
]
