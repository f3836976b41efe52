"""A library trainer class whose `run()` steps `self.optimizer = model.configure_optimizers(config)`
(minGPT's shape): the model's class lives in minilm/model.py, which the migration is not given."""

import torch
from torch.utils.data import DataLoader


class Trainer:
    def __init__(self, config, model, train_dataset):
        self.config = config
        self.model = model
        self.optimizer = None
        self.train_dataset = train_dataset
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = self.model.to(self.device)
        self.losses = []

    def run(self):
        model, config = self.model, self.config
        self.optimizer = model.configure_optimizers(config)
        train_loader = DataLoader(self.train_dataset, batch_size=config.batch_size, shuffle=False)
        model.train()
        for epoch in range(config.epochs):
            for batch in train_loader:
                batch = [t.to(self.device) for t in batch]
                x, y = batch
                logits, self.loss = model(x, y)
                model.zero_grad(set_to_none=True)
                self.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_norm_clip)
                self.optimizer.step()
                self.losses.append(self.loss.item())
