"""leaseq's Kubernetes operator (`leaseq operator`) and the reaper it shares with `leaseq reaper`.

Installed with the package; what only the operator needs (kopf, the Kubernetes client) comes
with the ``operator`` extra: ``pip install 'leaseq[operator]'``. ``leaseq reaper`` needs
neither. This package may import the queue core (``leaseq``); the core never imports it.
"""
