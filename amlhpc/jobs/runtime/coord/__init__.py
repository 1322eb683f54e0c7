"""The runtime's coordination layer: what the processes and nodes of a job tell each other
(node-local barriers, node records). Imports the base, Blob and node layers.
"""
