import os

from torch.utils.data import Dataset


class VisionDataset(Dataset):
    def __init__(self, root, transform=None, target_transform=None):
        if not os.path.isdir(os.path.join(str(root), type(self).__name__)):
            raise RuntimeError(f"Dataset not found in {root}. You can use download=True to download it")


class MNIST(VisionDataset):
    def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
        super().__init__(root, transform, target_transform)


class FashionMNIST(MNIST):
    pass


class CIFAR10(VisionDataset):
    def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
        super().__init__(root, transform, target_transform)


class ImageFolder(VisionDataset):
    def __init__(self, root, transform=None, target_transform=None):
        super().__init__(root, transform, target_transform)


class Flowers102(VisionDataset):
    def __init__(self, root, split="train", transform=None, target_transform=None, download=False):
        super().__init__(root, transform, target_transform)
