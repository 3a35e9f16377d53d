"""The worker process: claiming, running, renewing and settling attempts, and its probes."""
