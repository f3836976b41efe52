"""Bundled distributed runtime with the Accelerate API."""
