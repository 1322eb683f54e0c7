"""BeeOND: a BeeGFS filesystem built on demand from a cluster's local NVMe, shared over
InfiniBand (NAG's CosmoFlow tutorial). `python -m amlhpc.jobs beeond start|status|stop --stack S --cluster C`."""
