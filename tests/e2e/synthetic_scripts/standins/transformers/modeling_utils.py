from torch import nn


class TinyConfig:
    def __init__(self, vocab_size=64, hidden=16):
        self.vocab_size, self.hidden = vocab_size, hidden


class PreTrainedModel(nn.Module):
    config_class = None

    @classmethod
    def from_pretrained(cls, name, local_files_only=False, **kwargs):
        raise OSError(f"{name} is not cached and the hub cannot be reached")


class TinyModel(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.head = nn.Linear(config.hidden, config.vocab_size)

    def forward(self, ids):
        return self.head(self.embed(ids))
