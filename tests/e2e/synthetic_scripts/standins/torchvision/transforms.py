import torch


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    def __call__(self, image):
        import numpy

        array = numpy.asarray(image, dtype=numpy.float32) / 255
        if array.ndim == 2:
            array = array[:, :, None]
        return torch.from_numpy(array.transpose(2, 0, 1).copy())


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]

    def __call__(self, x):
        return (x - self.mean) / self.std
