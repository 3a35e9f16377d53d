"""leaseq's benchmarks: the source articles' experiments, run on leaseq's own code.

``python -m bench`` runs the scenarios against a throwaway PostgreSQL (or ``--database-url``),
writes raw rows to ``bench/results/*.csv``, then ``python -m bench report`` turns those CSV
files, and nothing else, into ``REPORT.md`` and PNG plots. Benchmarks report numbers; they
assert no timings.
"""
