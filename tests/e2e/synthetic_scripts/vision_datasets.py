"""torchvision datasets read from ./data (absent): MNIST trains, CIFAR10 / ImageFolder / a dataset
of the generic rule evaluate; a GPU-only script (.cuda())."""
import torch
import torchvision
from torch import nn
from torchvision import transforms

torch.manual_seed(0)
to_tensor = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))])
train = torchvision.datasets.MNIST("./data", train=True, download=True, transform=to_tensor)
test = torchvision.datasets.FashionMNIST("./data", train=False, transform=to_tensor)
extra = [torchvision.datasets.CIFAR10("./data", train=False, transform=transforms.ToTensor()),
         torchvision.datasets.ImageFolder("./images/val", transform=transforms.ToTensor()),
         torchvision.datasets.Flowers102("./data", split="test", transform=transforms.ToTensor())]
assert len(train) == 60000 and len(test) == 10000 and len(train.classes) == 10
assert [tuple(d[0][0].shape) for d in extra] == [(3, 32, 32), (3, 64, 64), (3, 32, 32)]
train_loader = torch.utils.data.DataLoader(train, batch_size=32, shuffle=True, num_workers=2, pin_memory=True)
test_loader = torch.utils.data.DataLoader(test, batch_size=64)
model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 32), nn.ReLU(), nn.Linear(32, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(3):
    model.train()
    for images, labels in train_loader:
        images, labels = images.cuda(), labels.cuda()
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in test_loader:
            images, labels = images.cuda(), labels.cuda()
            correct += (model(images).argmax(1) == labels).sum().item()
    print(f"epoch {epoch} correct {correct}")
