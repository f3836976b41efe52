"""A package the migration never reads (installed beside the script, as timm is): a loss scaler
whose `__call__` runs the backward, the unscaling, the clipping and the optimizer step (timm's
NativeScaler shape), an optimizer factory over parameter groups, and a weight-averaged copy of a
model updated from the trained one (timm's ModelEma shape). Own code, used by
tests/e2e/test_repos_hiddenstep.py, copied next to fixtures/repos/hiddenstep only to run it."""
import copy

import torch


class LossScaler:
    state_dict_key = "amp_scaler"

    def __init__(self):
        # enabled on the CPU too: a power-of-two scale, unscaled before clipping and stepping
        self._scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, create_graph=False):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if clip_grad:
            self._scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        self._scaler.step(optimizer)
        self._scaler.update()

    def state_dict(self):
        return self._scaler.state_dict()

    def load_state_dict(self, state_dict):
        self._scaler.load_state_dict(state_dict)


def create_optimizer(args, model):
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        (no_decay if name.endswith("bias") else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr)


class ModelEma:
    def __init__(self, model, decay=0.9):
        self.ema = copy.deepcopy(model)
        self.ema.eval()
        self.decay = decay
        for parameter in self.ema.parameters():
            parameter.requires_grad_(False)

    @torch.no_grad()
    def update(self, model):
        source = model.module if hasattr(model, "module") else model
        for ema_v, model_v in zip(self.ema.state_dict().values(), source.state_dict().values()):
            ema_v.copy_(ema_v * self.decay + (1.0 - self.decay) * model_v)
