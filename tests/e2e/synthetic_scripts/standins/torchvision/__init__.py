"""Stand-in for torchvision (tests only): datasets that need files, a model builder with weights."""
from . import datasets, models, transforms  # noqa: F401
