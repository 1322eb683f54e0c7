"""The runtime's node layer: what this host is and does (GPU topology and pinning, NVML, RDMA
ports, GPU clocks, NCCL environment and transport, scratch disks, SKU facts, telemetry).
Imports only the base layer.
"""
