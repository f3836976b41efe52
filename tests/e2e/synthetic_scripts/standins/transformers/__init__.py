"""Stand-in for transformers (tests only): from_pretrained needs the hub."""
from .modeling_utils import PreTrainedModel, TinyConfig, TinyModel  # noqa: F401
