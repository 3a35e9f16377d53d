"""SQL shipped with leaseq: migrations/NNNN_name.sql and named statements in queries/."""
