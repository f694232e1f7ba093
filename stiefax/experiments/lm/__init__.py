"""A decoder-only language model on real text: does the constraint help an LM?

``stiefax lm [--preset quick|sweep] [--arms ...] [--lr RATES|best] [--seeds ...]``

The text is the Python standard library's own ``*.py`` sources, read as bytes from the
running interpreter (nothing is downloaded): about 4.7 MB, split by file into
training, a fixed validation split and a fixed test split (about 5% each held out;
:mod:`stiefax.experiments.lm.data`). Losses are in bits per byte.

The model (:mod:`stiefax.experiments.lm.model`) is a small modern decoder: tied byte
embeddings, pre-norm RMSNorm blocks, rotary positions, Gemma's gated-GELU MLP, causal
grouped-query attention with Gemma's parameter layout (``q_einsum/w (H, d, r)``,
``kv_einsum/w (2, K, d, r)``), so every query head and every key head is a frame that
stiefax finds by name.

Arms (the one registry; every other parameter trains with AdamW, weight decay 0.1 on
matrices, b1 0.9, b2 0.95, linear warm-up over the first 10% of steps, then cosine to
0, the same schedule on the Riemannian rate):

  A2         AdamW on W_Q, W_K too (fan-in normal init)
  A2-qknorm  A2 with QK-norm: LayerNorm (no bias, learned scale) on each head's q, k
  A2-sigma   A2 with sigmaReparam W_Q, W_K: (gamma / sigma(W)) W, one power step a step
  frozen     W_Q, W_K orthonormal (polar factor of the init) and never trained
  B2         riemannian_adam(1.0, max_norm=0.1) on W_Q, W_K (the paper's corrected rule)
  B2-qr      B2 with the QR retraction
  B2-qknorm  B2 with the QK-norm of A2-qknorm

Presets:
  quick (default)  d=64, 2 layers, 4 query / 2 key-value heads of r=16, 600 steps of
                   16 x 128 bytes at AdamW rate 3e-3, arms A2, A2-qknorm, B2, seed 0:
                   a few minutes on a 2-core CPU; prints a summary (loss per arm, the
                   largest attention logit, isometry error) and plain words.
  sweep            the study of docs/lm.md: d=128, 2 layers, 8 / 4 heads of r=16,
                   1 000 steps; ``studies/lm.sh`` runs the learning-rate sweep and the
                   best-rate comparison (``--lr best``).

Each run is one JSON in --out, named by its arm, rate and a hash of its whole
configuration; finished runs are skipped, unfinished ones resume from their
checkpoint, and several processes can share one --out. ``stiefax report OUT`` prints
the learning-rate sensitivity table, the largest logits, the best-rate comparison with
paired intervals, and writes the figures.

Examples:
  stiefax lm
  stiefax lm --arms A2,B2 --steps 50
  stiefax lm --preset sweep --arms A2,B2 --lr 1e-3,3e-3,1e-2 --seeds 0,1 --out results/lm
  stiefax lm --preset sweep --arms A2,B2 --lr best --seeds 0,1,2,3,4,5 --out results/lm
"""

from stiefax.experiments.lm.command import add_arguments
from stiefax.experiments.lm.command import run
from stiefax.experiments.lm.config import ARMS
from stiefax.experiments.lm.config import EXPERIMENT
from stiefax.experiments.lm.config import PRESETS
from stiefax.experiments.lm.config import SWEEP_RATES
from stiefax.experiments.lm.config import LMConfig
from stiefax.experiments.lm.runs import check_run
from stiefax.experiments.lm.runs import run_key
from stiefax.experiments.lm.tables import report

__all__ = [
  "add_arguments",
  "run",
  "report",
  "run_key",
  "check_run",
  "EXPERIMENT",
  "ARMS",
  "PRESETS",
  "SWEEP_RATES",
  "LMConfig",
]
