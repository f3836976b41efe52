"""accel-migrate: rewrite single-device PyTorch training scripts for distributed training."""

__version__ = "0.1.0"
