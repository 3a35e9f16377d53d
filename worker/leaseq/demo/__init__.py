"""``leaseq demo``: a throwaway PostgreSQL, a few workers and a reaper, end to end."""
