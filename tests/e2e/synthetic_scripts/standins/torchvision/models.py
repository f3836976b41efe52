from torch import nn


def small_cnn(*, weights=None, num_classes=10):
    if weights is not None:
        raise RuntimeError(f"downloading weights {weights!r}: no network here")
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, num_classes))
