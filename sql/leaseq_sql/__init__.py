"""SQL shipped with leaseq: ``migrations/NNNN_name.sql`` and named statements in ``queries/``.

Data only: :mod:`leaseq.core.schema` reads the migrations and the core's private store reads
the statements, both through :mod:`importlib.resources`, so they work from a wheel and from an
editable install alike.
"""
