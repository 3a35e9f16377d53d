"""The private store: one typed method per named SQL statement. Only leaseq.core imports it."""
