"""Helpers shared by leaseq's test layers (on sys.path through pytest's `pythonpath`)."""
