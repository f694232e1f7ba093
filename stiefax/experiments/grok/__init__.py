"""``stiefax grok``: modular-arithmetic grokking (paper sections 4.3 and 4.4).

The command and its parts, one module each, as every experiment command has them
(:mod:`stiefax.experiments.protocol`); the experiment itself is described in
:mod:`stiefax.experiments.grok.command` (``stiefax grok --help``).
"""
