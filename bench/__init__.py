"""Benchmarks of the data path against a local Azurite (`python -m bench.staging`, `make bench`).

Results, with the command and the machine they came from, go to bench/RESULTS.md.
"""
