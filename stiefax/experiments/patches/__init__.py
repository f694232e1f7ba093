"""``stiefax patches``: the image-patch benchmark (paper sections 3.3, 4.1, 4.2, 4.5-4.7).

The command and its parts, one module each, as every experiment command has them
(:mod:`stiefax.experiments.protocol`); the experiment itself is described in
:mod:`stiefax.experiments.patches.command` (``stiefax patches --help``).
"""
