"""The runtime's base layer: the environment contract, errors, exit codes, ranks, job and launch
identity, fault points, bandwidth throttle, training progress and a process's /proc fields. Imports
nothing else of the runtime.
"""
