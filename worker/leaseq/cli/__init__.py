"""The ``leaseq`` command line (nothing imports this room)."""
