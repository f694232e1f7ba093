"""``stiefax lm``: a decoder-only language model on real text.

The command and its parts, one module each, as every experiment command has them
(:mod:`stiefax.experiments.protocol`); the experiment itself is described in
:mod:`stiefax.experiments.lm.command` (``stiefax lm --help``).
"""
