import json
import os
import sys
from types import SimpleNamespace

import torch
from torch.utils.data import TensorDataset

from minilm.model import TinyLM
from minilm.trainer import Trainer


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.randint(0, 11, (48, 6)), torch.randint(0, 11, (48, 6)))
    model = TinyLM(11, 16)
    config = SimpleNamespace(weight_decay=0.1, learning_rate=1e-2, batch_size=8, epochs=2, grad_norm_clip=1.0)
    trainer = Trainer(config, model, data)
    trainer.run()
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"losses": trainer.losses, "weights": [p.detach().flatten().tolist() for p in model.parameters()]}, f)


if __name__ == "__main__":
    main()
