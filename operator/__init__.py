"""leaseq.operator: the kopf operator that scales WorkerPools and runs the reaper."""
