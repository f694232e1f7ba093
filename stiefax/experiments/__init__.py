"""Reproduction harness and the ``stiefax`` command line.

Unlike the library above it, this package prints, plots and writes files. It uses
stiefax only through its public API.
"""
