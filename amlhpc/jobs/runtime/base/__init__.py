"""The runtime's base layer: the environment contract, errors, exit codes, ranks, job and launch
identity, fault points, bandwidth throttle and training progress. Imports nothing else of the runtime.
"""
