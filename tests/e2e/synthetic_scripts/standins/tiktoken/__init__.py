"""Stand-in for tiktoken (tests only): get_encoding downloads the encoding's BPE file on first use."""
from .core import Encoding
from .model import encoding_for_model
from .registry import get_encoding
