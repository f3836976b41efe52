"""Cross-module migration: a script and the run's modules it imports, migrated as one unit.

What it does: when one run is given several files that import each other (`main.py` importing
`train_one_epoch` from `engine.py`, which uses `utils.py`), the files connected by imports form a
unit (`migrate/project.py` builds the index). For each entry point of the unit (a module with an
`if __name__ == "__main__":` guard that imports modules of the run), the analysis facts of the
entry and of every module it reaches are joined into one view (`merge.py`): the functions and
classes it imports by name become callable units of the entry, so the roles (model, optimizer,
loaders, training step, device, distributed boilerplate, optimizer factories, process-group
helpers, a `metric_logger.log_every(loader)` around the loader) are followed across the module
boundary exactly as they are followed into a function of the same file. A module without training
code of its own still informs the view (`loader = get_loader(...)` of `data_loader.py` returning a
`DataLoader` is prepared in the script). The rules then plan their edits on
that view and each file of the unit that holds an edited node is rewritten (`unit.py`).

How the accelerator reaches the other module: as a parameter, as in one file. The Accelerator is
created in the entry (where the device is chosen, or at the top of the function that builds the
optimizer), and every function of another module that needs it (a training step that calls
`accelerator.backward`, an evaluation that gathers) receives it as a new keyword-only parameter
(`*, accelerator`), with every call site in the unit passing `accelerator=accelerator` (a caller
outside the unit, such as a package's wrapper, fails on the missing keyword rather than binding
its own argument to it). A function there that reads only the rank (`dist.get_rank()`) is left as
it is when the script keeps its own process group, or when the reads go with a removed sampler. No global state and no accessor: the function's signature
says what it needs, and a reader of `engine.py` sees where `accelerator` comes from. A trainer
class of another module that the script builds (`TrainLoop(model=model, data=data).run_loop()`,
its constructor building the optimizer) creates it itself, as `self.accelerator` at the top of
that constructor, exactly as a trainer class in one file does: the class owns what is prepared,
and its signature and callers stay as they are (`fixtures/repos/trainloop/`).

All or nothing: the safety checks of `migrate/safety/` run on every rewritten file of the unit and
a second run over the rewritten unit must change nothing; if one fails, no file of the unit gets
the cross-module edits (each file keeps what the single-file engine does to it alone) and the
entry gets a diagnostic naming the check, the file and the line.

Example: `main.py` calls `train_one_epoch(model, criterion, loader, optimizer, device, epoch)`
of `engine.py`; `main.py` gets the Accelerator and `prepare`, `engine.py`'s function gets
`*, accelerator` and its `accelerator.backward(loss)`, and the call passes
`accelerator=accelerator` (`fixtures/repos/train_step/`).

Leaves alone (each with a diagnostic coded AM013 on the entry, naming file:line and what to do):
- a training step reached as a module attribute (`import engine; engine.train_one_epoch(...)`):
  write `from engine import train_one_epoch`, or give the files one at a time;
- two modules of the unit defining a function or class of the same name that the cross-module
  view would confuse; when one is a package's `__init__.py` wrapping the other's function imported
  under another name (`from .build import build_loader as _build_loader`), the diagnostic is on the
  entry's import line and names the import to write (`from data.build import build_loader`);
- an optimizer built inside a class of another module that the script does not build itself
  (another module's `fit()` runs `Trainer(...).run()`), or by a factory whose optimizer is not built over one of its arguments' `.parameters()` (a
  factory returning `torch.optim.X(model.parameters(), ...)` for its `model` argument is followed:
  `optimizer = create_optimizer(args, model)` is prepared in the entry);
- an entry that trains through the unit's modules but whose roles cannot be resolved (no
  optimizer built, a refusal of the rules): the message says what was found where and what could
  not be followed;
- a module of the unit reached from two entry points that would edit it differently.

Fix safety: the cross-module edits are the single-file rules' edits, planned once over the unit;
every rewritten file must compile and pass every safety check, and the unit must be idempotent.
"""

CODE = "AM013"
NAME = "follow-across-modules"
