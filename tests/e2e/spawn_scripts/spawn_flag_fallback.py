"""A launcher of the ImageNet example's lineage, on CPU with synthetic data.

`main` spawns one worker per GPU with `--multiprocessing-distributed` (after scaling
`args.world_size` by it) or calls the worker directly; the worker joins its group under
`if args.distributed:` (the rank computed into `args`), wraps the model in DDP or DataParallel
along a device chain, splits its batch per GPU, shards its data with a DistributedSampler only
when distributed, and saves a checkpoint on the first process of each node. Each process writes
what it trained on to `<out>/rank<R>.json`.
"""

import argparse
import json
import os
import shutil

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.utils.data
import torch.utils.data.distributed

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("-b", "--batch-size", type=int, default=8)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--world-size", type=int, default=-1)
parser.add_argument("--rank", type=int, default=-1)
parser.add_argument("--dist-url", default="tcp://127.0.0.1:29533")
parser.add_argument("--dist-backend", default="gloo")
parser.add_argument("--gpu", type=int, default=None)
parser.add_argument("--multiprocessing-distributed", action="store_true")

SEEN = []
SAVES = []


def main():
    args = parser.parse_args()
    if args.dist_url == "env://" and args.world_size == -1:
        args.world_size = int(os.environ["WORLD_SIZE"])
    args.distributed = args.world_size > 1 or args.multiprocessing_distributed
    if torch.cuda.is_available():
        ngpus_per_node = torch.cuda.device_count()
    else:
        ngpus_per_node = 1
    if args.multiprocessing_distributed:
        args.world_size = ngpus_per_node * args.world_size
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(args.gpu, ngpus_per_node, args)


def main_worker(gpu, ngpus_per_node, args):
    args.gpu = gpu
    if args.distributed:
        if args.dist_url == "env://" and args.rank == -1:
            args.rank = int(os.environ["RANK"])
        if args.multiprocessing_distributed:
            args.rank = args.rank * ngpus_per_node + gpu
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    if not torch.cuda.is_available():
        print("using CPU")
    elif args.distributed:
        if args.gpu is not None:
            torch.cuda.set_device(args.gpu)
            model.cuda(args.gpu)
            args.batch_size = int(args.batch_size / ngpus_per_node)
            args.workers = int((args.workers + ngpus_per_node - 1) / ngpus_per_node)
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
        else:
            model.cuda()
            model = torch.nn.parallel.DistributedDataParallel(model)
    elif args.gpu is not None:
        torch.cuda.set_device(args.gpu)
        model = model.cuda(args.gpu)
    else:
        model = torch.nn.DataParallel(model).cuda()

    if torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")

    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr)

    g = torch.Generator().manual_seed(1)
    train_dataset = torch.utils.data.TensorDataset(
        torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g), torch.arange(48))
    val_dataset = torch.utils.data.TensorDataset(torch.randn(21, 6, generator=g), torch.randint(0, 3, (21,), generator=g))
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
    else:
        train_sampler = None
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, sampler=train_sampler)
    val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=args.batch_size, shuffle=False,
                                             num_workers=args.workers)

    accuracies = []
    for epoch in range(args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        SEEN.append(train(train_loader, model, criterion, optimizer, device))
        accuracies.append(validate(val_loader, model, device))
        if not args.multiprocessing_distributed or (args.multiprocessing_distributed
                and args.rank % ngpus_per_node == 0):
            save_checkpoint({"epoch": epoch + 1, "state_dict": model.state_dict(),
                             "optimizer": optimizer.state_dict()}, os.path.join(args.out, "checkpoint.pth.tar"))
    report(args.out, model, accuracies)


def train(loader, model, criterion, optimizer, device):
    model.train()
    seen = []
    for x, y, index in loader:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += index.tolist()
    return seen


def validate(loader, model, device):
    model.eval()
    correct = 0
    total = 0
    with torch.no_grad():
        for x, y in loader:
            x = x.to(device)
            y = y.to(device)
            pred = model(x).argmax(1)
            correct += (pred == y).sum().item()
            total += y.size(0)
    return [correct, total]


def save_checkpoint(state, filename):
    SAVES.append(state["epoch"])
    torch.save(state, filename)
    shutil.copyfile(filename, filename + ".best")


def report(out, model, accuracies):
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    with open(os.path.join(out, f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
        json.dump({"seen": SEEN, "saves": SAVES, "weights": weights, "accuracies": accuracies}, f)


if __name__ == "__main__":
    main()
