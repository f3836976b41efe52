"""The migration rules, one module per rule; the ordered list lives in migrate/registry.py."""
