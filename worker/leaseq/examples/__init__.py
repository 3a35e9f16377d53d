"""Example apps shipped with leaseq, written against the public API only (``import leaseq``).

Run one with ``leaseq worker --app leaseq.examples.<name>:registry``. Each example's extra
dependencies come with an extra (``pip install 'leaseq[ocr]'`` for :mod:`leaseq.examples.ocr`).
"""
