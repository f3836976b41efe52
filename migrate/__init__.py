"""accel-migrate: rewrite single-device PyTorch training scripts for distributed training."""
