"""Modular-arithmetic grokking, c = (a + b) mod 97 (paper sections 4.3 and 4.4).

The model and task are the paper's: the sequence (a, b, =) with a one-hot 98 x 128
token embedding plus learned positions, a 2-layer, 4-head, d=128, r=32 pre-LN encoder
(FFN 4x with ReLU, no causal mask, a final LayerNorm), readout
concat(3 x 128) -> 128 -> ReLU -> 97; 40% of the 97^2 pairs (3 764) train as one full
batch, the other 5 645 are held out. AdamW lr 1e-3, weight decay 1.0 on matrices,
b2 0.999, no warm-up; the Riemannian rate is 1.0 (constant), tau 0.1, eps 1e-3.

Arms (they differ only in how W_Q, W_K are treated, except where noted):
  A2       AdamW everywhere, decay on every matrix including W_Q, W_K
  B2       Riemannian Adam on W_Q, W_K (stiefel_adamw + riemannian_adam(1.0, eps=1e-3))
  B2m      tangent projection + elementwise Adam at the AdamW rate, no step cap
  B2m-can  as B2m with the canonical-metric gradient
  B2-frz   W_Q, W_K frozen at their orthonormal initialization
  A2-nwf   A2 without decay on W_Q, W_K (plain Adam there, no constraint)
  B2-hi    B2 with circuit weight decay 2.0
  B2-sn    B2 with every circuit matrix initialized at 0.1x its default scale
  B2-comb  B2-hi and B2-sn together
  B2-mmuon manifold Muon on W_Q, W_K (stiefax.manifold_muon, rate 0.05)
  A2-muon  optax.contrib.muon on W_Q, W_K (rate 0.02, decayed), unconstrained
  B2-qr    B2 with the sign-fixed QR retraction
  B2-cayley B2 with the Cayley retraction
  A2-qknorm A2 with QK-norm: LayerNorm (no bias, learned scale) on each head's q and k
  A2-sigma A2 with sigmaReparam W_Q, W_K: (gamma / sigma(W)) W, one power step a step
  B2-qknorm B2 with the same QK-norm
Stiefel arms start from the polar factor of the default W_Q, W_K initialization;
every other parameter, and the train/held-out split, are shared by all arms of a seed.
The last three are named explicitly (no preset runs them). Every evaluation also
records the attention probe on the training batch: the largest logit |q.k| / sqrt(r)
(max_logit) and the mean attention entropy (attn_entropy).

Presets:
  quick (default)  A2,B2 at seed 0: the paper's model family (2-layer, 4-head, d=128,
                   r=32 pre-LN encoder, same readout, same optimizers) on a smaller
                   task, c = (a + b) mod 23 with 70% of the 529 pairs training, in the
                   Power et al. setting (b2 0.98, 10-step warm-up) with weight decay
                   5.0, for 800 epochs (evaluation every 50). Over seeds 0-4 at 1
                   and 2 XLA CPU threads, every run memorizes by epoch 50, A2 groks
                   (held-out >= 0.95) in 5/5 seeds, B2 in 2/5 and 0/5, every run has
                   training-loss collapses, and the isometry contrast shows (A2 far
                   above 1e-2, B2 at float32 rounding); one run's digits vary with the
                   seed and the machine (README; benchmarks/grok_quick.py).
  paper            the exact configuration: 20 000 epochs, evaluation every 100
                   (about 2 hours per arm on an idle 2-core CPU).
--stabilize runs the Power et al. setting (b2 0.98 and a 10-step linear warm-up, for
the AdamW and the Riemannian rate alike).

Each run writes OUT/<arm>[-stab]-<preset>-e<epochs>-<hash>-s<seed>.json, where the
hash covers the whole configuration (every hyperparameter, the budget, the arm), so no
two configurations share a file; the file records the command that reruns it and the
code's commit. A finished run is never trained again nor overwritten: the same command
skips it. An unfinished run keeps an Orbax checkpoint (parameters, optimizer state,
history) in <run>.ckpt every --checkpoint-every epochs and on Ctrl-C or SIGTERM (a
second one stops at once); the same command resumes it, to the same result as an
uninterrupted run, and a damaged checkpoint is moved aside and the run restarted. Each run is claimed by
a lock (<run>.lock), so several processes can share one --out: each trains different
runs and waits for the others' runs. --vmap-seeds trains the seeds of an arm as one
program, the seed a batch axis. `stiefax report OUT` prints the paper-style tables
(memorized / grokked / sustained k/n, tail means, paired differences against A2) and
writes PNG plots.

Examples:
  stiefax grok
  stiefax grok --preset paper --arms A2,B2 --seeds 0      # Ctrl-C and rerun: resumes
  stiefax grok --preset paper --arms A2,B2,B2m,B2m-can,B2-frz --seeds 0
  stiefax grok --preset paper --arms A2,B2,B2-frz --seeds 0,1,2,3,4 --stabilize
"""

from stiefax.experiments.grok.command import add_arguments
from stiefax.experiments.grok.command import checkpoint_interval
from stiefax.experiments.grok.command import resolve_config
from stiefax.experiments.grok.command import run
from stiefax.experiments.grok.config import ARMS
from stiefax.experiments.grok.config import MMUON_LR
from stiefax.experiments.grok.config import MUON_LR
from stiefax.experiments.grok.config import PAPER
from stiefax.experiments.grok.config import PRESETS
from stiefax.experiments.grok.config import QUICK
from stiefax.experiments.grok.config import STABILIZED
from stiefax.experiments.grok.config import GrokConfig
from stiefax.experiments.grok.config import arm_definition
from stiefax.experiments.grok.config import first_epoch
from stiefax.experiments.grok.config import grokked_epoch
from stiefax.experiments.grok.config import hyper
from stiefax.experiments.grok.config import memorized_epoch
from stiefax.experiments.grok.config import run_metrics
from stiefax.experiments.grok.config import sustained_epoch
from stiefax.experiments.grok.config import tail_mean
from stiefax.experiments.grok.data import make_data
from stiefax.experiments.grok.model import init_params
from stiefax.experiments.grok.model import make_model
from stiefax.experiments.grok.runs import record_identity
from stiefax.experiments.grok.runs import run_command
from stiefax.experiments.grok.runs import run_file_name
from stiefax.experiments.grok.runs import run_identity
from stiefax.experiments.grok.runs import summary_table
from stiefax.experiments.grok.runs import summary_words
from stiefax.experiments.grok.tables import check_run
from stiefax.experiments.grok.tables import report
from stiefax.experiments.grok.tables import run_key
from stiefax.experiments.grok.training import programs
from stiefax.experiments.grok.training import stack
from stiefax.experiments.grok.training import train
from stiefax.experiments.grok.training import train_seeds
from stiefax.experiments.grok.training import unstack

__all__ = [
  "add_arguments",
  "run",
  "report",
  "check_run",
  "run_key",
  "resolve_config",
  "checkpoint_interval",
  "GrokConfig",
  "PAPER",
  "QUICK",
  "PRESETS",
  "STABILIZED",
  "ARMS",
  "MMUON_LR",
  "MUON_LR",
  "arm_definition",
  "first_epoch",
  "memorized_epoch",
  "grokked_epoch",
  "sustained_epoch",
  "tail_mean",
  "run_metrics",
  "run_identity",
  "record_identity",
  "run_file_name",
  "run_command",
  "summary_table",
  "summary_words",
  "make_data",
  "make_model",
  "init_params",
  "hyper",
  "programs",
  "stack",
  "unstack",
  "train",
  "train_seeds",
]
