"""Seeds of a grokking arm as one vmapped program against one program call per seed.

``stiefax grok --vmap-seeds`` trains the seeds of an arm with the seed as a batch axis
(``jax.vmap`` of the per-seed training window); without it each seed's window is its own
call of the per-seed program. Same arm, same seeds, same process, the two taking turns
(``time_interleaved``); medians of one evaluation window (``--window`` full-batch steps
and the evaluation) for all ``--seeds`` seeds. Default shapes: the quick preset's model
and task (2 layers, d=128, p=23, 70% training pairs).

    python -m benchmarks.grok_seeds [--arm B2] [--seeds 5] [--window 10] [--reps 5]
"""

import argparse
import dataclasses

import jax

from benchmarks.common import time_interleaved
from stiefax.experiments.grok import config as grok_config
from stiefax.experiments.grok import data as grok_data
from stiefax.experiments.grok import training as grok_training


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--arm", default="B2", choices=sorted(grok_config.ARMS))
  parser.add_argument("--seeds", type=int, default=5)
  parser.add_argument("--window", type=int, default=10, help="steps per program call")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--preset", default="quick", choices=sorted(grok_config.PRESETS))
  args = parser.parse_args()

  config = dataclasses.replace(grok_config.PRESETS[args.preset]["config"], eval_every=args.window)
  arm = grok_config.ARMS[args.arm]
  seeds = list(range(args.seeds))
  datas = [
    {k: jax.numpy.asarray(v) for k, v in grok_data.make_data(config, s).items()} for s in seeds
  ]
  params = [grok_training.init_params(config, arm, s) for s in seeds]
  # Not donated: the same buffers serve every timed call.
  init, chunk, _ = grok_training.programs(config, arm, False, False)
  _, vchunk, _ = grok_training.programs(config, arm, True, False)
  states = [init(p) for p in params]
  stacked = (grok_training.stack(params), grok_training.stack(states), grok_training.stack(datas))

  def separate(ps, ss, ds):
    return [chunk(p, s, d) for p, s, d in zip(ps, ss, ds)]

  ms = time_interleaved(
    {
      "separate": (separate, (params, states, datas)),
      "vmapped": (vchunk, stacked),
    },
    reps=args.reps,
    warmup=1,
    inner=1,
  )
  steps = args.seeds * args.window
  print(
    f"grok {args.preset} {args.arm}: {args.seeds} seeds x {args.window} steps,"
    f" backend {jax.default_backend()}"
  )
  for name, t in ms.items():
    print(f"  {name:<9} {t:9.1f} ms per window  {t / steps:7.2f} ms per seed-step")
  print(f"  vmapped / separate = {ms['vmapped'] / ms['separate']:.2f}")


if __name__ == "__main__":
  main()
