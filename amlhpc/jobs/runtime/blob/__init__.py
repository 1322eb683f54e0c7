"""The runtime's Blob layer: clients for a container, listing, ranged reads and verified downloads.
Imports only the base layer.
"""
