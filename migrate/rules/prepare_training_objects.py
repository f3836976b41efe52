"""Pass the model(s), optimizer(s), training loader(s) and scheduler(s) to `accelerator.prepare`.

What it does:
    Inserts one `model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer,
    loader, scheduler)` in the function (or module) that builds the optimizer, right after the last
    of those objects is bound and before the training loop uses them. Models are the owners of the
    parameters given to a `torch.optim` optimizer; loaders are the `DataLoader`s (built here, or
    returned by a helper function of this file) that a training loop (one that calls
    `.backward()`, directly or through a helper of this file) iterates; schedulers
    are prepared only when they are stepped inside that per-batch loop. Attributes are followed
    like names: when a method builds the optimizer from `self.model.parameters()`, the attributes
    of that class (`self.model`, `self.optimizer`, `self.train_loader`) are prepared in that method,
    `self.model, self.optimizer, self.train_loader = self.accelerator.prepare(...)`; objects built
    outside a class and passed to it are prepared where they are built, before the call.
    An optimizer may also be built indirectly: by a `torch.optim.Optimizer` subclass defined in
    this file (`LARS(model.parameters())`), or by a function or method of this file that returns
    one (`optimizer = model.configure_optimizers(...)`: the receiver is the model;
    `optimizer = create_optimizer(args, model)`: the argument whose `.parameters()` it uses), also
    through a function or method that returns what such a factory returns; a trainer class's own
    hook (`self.optimizer = self.build_optimizer(cfg, self.model)`, a method or classmethod of that
    class, the detectron2 `DefaultTrainer` shape) is followed to the attribute it is handed
    (`self.model`), not read as a model's `configure_optimizers`. The
    optimizer is then prepared where that call binds it, never inside the factory. A receiver or
    argument that names the hand-wrapped model's module (`raw_model = model.module if ddp else
    model`, nanoGPT; `model_without_ddp`, DeiT) stands for the model: `model` is prepared, once.
    Parameter groups built by a function of this file (or of another module, when the run migrates
    the modules together, AM013) that takes a model's `.parameters()` / `.named_parameters()` are
    followed to the model passed to it:
    `optimizer = AdamW(param_groups(model, wd))`, or `groups = param_groups(model, wd)` then
    `AdamW(groups)`, prepares `model`; so do groups of comprehensions over a list of its named
    parameters (`named = list(model.named_parameters())`, `[{"params": [p for n, p in named if
    ...]}, ...]`, the BERT fine-tuning idiom).
    Whatever the training step steps after `backward` is the optimizer, however it was built:
    known constructors are evidence, not a requirement. `if/elif/else` alternatives of one
    optimizer (`if args.opt == "adamw": optimizer = AdamW(groups) elif ...: optimizer =
    utils.LARS(groups)`) are one optimizer, prepared once after the whole chain. An optimizer (or
    its parameter groups) from a function the migration cannot read, of a package or of a module
    outside the run (`create_optimizer_v2(model, ...)`, `create_optimizer(args, model)`,
    `utils.get_params_groups(student)`), or from a method no class of the view defines called on
    the model (`self.optimizer = model.configure_optimizers(config)`, the model's class in a module
    not given), whose result is stepped after `backward`
    (`optimizer.step()`, `scaler.step(optimizer)`), optimizes the argument the code uses as a
    model: built as a `torch.nn` module, moved to a device, called by the training step, wrapped by
    hand, or asked for its parameters or mode; `args` or a weight decay beside it is not one.
    When the training step never calls that model itself (timm's `task(input, target)` holds it
    and runs the forward), preparing it would synchronise nothing that trains: the file is
    reported at the optimizer and left as it is.
    A function of this file that builds the model and its optimizer and returns both in a tuple
    (the DDP tutorial's `def load_train_objs(): ... return train_set, model, optimizer`), called
    only where the tuple is unpacked into names (`dataset, model, optimizer = load_train_objs()`),
    is followed into its caller: `model` and `optimizer` are prepared there, after the loaders the
    caller builds (`train_data = prepare_dataloader(dataset, batch_size)`), and the objects it then
    hands to a trainer class of the file (`Trainer(model, train_data, optimizer, gpu_id, ...)`) are
    the prepared ones; the class takes `accelerator` in its constructor (AM001). The builder itself
    is not changed. A builder returning the optimizer without its model, or called without
    unpacking, stays the place of `prepare` as before.
    A loader is found from what the training step uses, wherever it is bound: the name a training
    loop iterates, and also the one handed to `iter(...)` whose iterator a training loop advances
    with `next(...)` (`data_iter = iter(loader)` ... `x, y = next(data_iter)` in `for step in
    range(num_steps)`, re-made on `StopIteration`); a parameter of the function that builds the
    optimizer, iterated as it is and filled by the one call of that function, outside any loop,
    with a name bound to a DataLoader (`def train(model, loader): optimizer = ...` called as
    `train(model, train_loader)` in `main`, `train_loader` built there or unpacked from a helper
    of this file that returns it; also when that function hands it on to the only function whose
    loop trains, `train_epoch(train_dataloader, ...)`): prepared there with the model and the
    optimizer (the caller's name keeps the user's loader); a parameter of a method filled by a call on an
    instance of its class (`trainer = Trainer(...)` then `trainer.train(train_loader)` in `main`:
    `train_loader` of `main` is prepared there, with the model and the optimizer, after a
    scheduler sized by it, so `T_max=len(train_loader)` keeps the unprepared length the original
    computed); and an attribute that the class's constructor stores from its arguments (or builds)
    before it calls the method that builds the optimizer (`Solver(celeba_loader, rafd_loader,
    config)` keeping `self.celeba_loader = celeba_loader`, `build_model` preparing the models, and
    `train` drawing from `data_loader = self.celeba_loader`, or either of two attributes chosen by
    an `if` or a conditional expression): the attributes are prepared in that method with the
    models, so the instance holds the sharded loaders (a `None` handed in for an unused one is
    returned as it is). When a method of that class that does not train iterates such an attribute
    too (`test()` writing one image per batch of `self.celeba_loader`, in a mode where
    `build_model` runs as well), the attribute is not prepared with the models: each method that
    trains from it prepares it on entry, into a local read in place of the attribute there
    (`celeba_loader = self.accelerator.prepare(self.celeba_loader)`, then `data_loader =
    celeba_loader`, `iter(celeba_loader)`), so the instance keeps the user's loader and `test()`
    reads all of it on every process (its guarded writes then write every file, as the original
    did). Not when a method that reads it trains in another way (a loader drawn through an
    expression the migration does not follow), nor when the local's name is taken in a training
    method: the attribute is then prepared with the models, and a file written per batch of it
    outside training is reported (AM009). A loader bound where the function that prepares cannot reach it, handed
    once (one call, outside any loop) to the method of that class that trains on it (`main` builds
    it and calls `trainer.fit(loader, epochs)`, the trainer's constructor builds and prepares the
    model), is prepared on entry to that method: `loader = self.accelerator.prepare(loader)`.
    Handed again on every call (`for epoch ...: trainer.train_epoch(loader)`: a fresh prepared
    loader each epoch would restart its shuffling), it is reported on the line that binds it,
    naming the loop it feeds and where the model is prepared, with the change that lets it be
    prepared there (hand it to the constructor, kept as an attribute). A loop of a second training
    function that builds an optimizer of its own (a teacher trained by `train`, a student distilled
    by `distill`) is reported as such: nothing it trains is prepared, and the report says to create
    the Accelerator where both functions reach it and to prepare that function's model, optimizer
    and loader together there.
    A loader whose loop hands each batch to a method of an instance of a class of this file
    (`model.set_input(data)`, which keeps it in attributes) and trains through a method of that
    instance (`model.optimize_parameters()`), the pix2pix/CycleGAN shape, does feed the training
    step: it is reported on the line that binds it, with the line that prepares it below the
    bindings of the loader and the instance (`dataset = model.accelerator.prepare(dataset)`,
    where the class holds the Accelerator); once that line is written, nothing is reported.
    A prepared model whose whole input is drawn in the training loop from torch's global RNG (a
    GAN's noise, `fake = netG(torch.randn(b, nz, 1, 1, device=device))`, inline or through a name)
    while no seed of the file reads the rank: every process starts that RNG alike when the script
    seeds it (`torch.manual_seed(seed)`), or when the draw is on a CUDA device (`device=device`: the
    CUDA generator starts from torch's fixed default seed), so the N processes would draw the
    same noise at every step and train on N copies of one batch of it. Unseeded, torch's CPU
    generator takes its seed from the operating system in each process (`torch.initial_seed()`
    differs from run to run): noise drawn there without `device=` differs per process already and
    is left as it is. Otherwise, right after the prepare
    call the processes other than the main one are seeded apart:
    `if accelerator.process_index: torch.manual_seed(torch.initial_seed() + accelerator.process_index)`.
    The script's seeds (above the prepare call, at the module level, or in a function of the file
    called only so: `seed_all(args.seed)`) run before it, and so does what must stay alike (a
    `random_split`, the models' initial weights, a fixed preview noise); the main process keeps the script's own stream, so one process runs
    exactly as before; prepared loaders shuffle from the main process's seed whatever each
    process's RNG holds (`tests/e2e/test_gan_noise_per_rank.py` checks all three on 1 and 2
    processes).
    The loop, not the constructor, makes the loader: also one a training `while` loop draws from
    with `next(data_iter)` (`while True: try: batch = next(data_iter) except StopIteration:
    data_iter = iter(train_loader) ...`), and one built by a function the migration cannot read
    (`data_loader = get_loader(...)` or `train_dl, valid_dl, ... = get_data(opts)` from a module it
    was not given). Such a loader is prepared all the same, and its batches keep their moves to the
    device: the runtime's `prepare` shards it when it is a torch DataLoader (any subclass) and,
    on N processes, gives each process every N-th of its batches when it is another iterable (on
    one process it returns it as it is; see docs/runtime.md). So is an iterator the code shows is
    no DataLoader but makes batches of its own: a torchtext `BucketIterator` (also one a helper of
    this file returns, `train_iter, val_iter = prepare_dataloaders(opt, device)`), an instance of a
    class of this file, a generator function's generator (not one whose code draws from a global
    random generator the file never seeds, `torch.randn(...)`: each process draws its own batches,
    and it is reported as before). It is prepared with the model, its
    batches keep their moves (and a `device=device` it is given is the Accelerator's device), and
    its other uses (`train_iter.init_epoch()`, `len(train_iter)`, its attributes) reach it through
    the prepared object; an evaluation iterator of the same kind stays whole. One given another
    device than the script's choice (`device=torch.device("cuda", gpu)`, `device=0`) is reported
    instead: on N GPUs every process would place its batches on that one device.
    Under `--target accelerate` both are reported at their binding and not prepared: HF
    Accelerate's `prepare` would return a non-DataLoader unchanged, silently.
    A full-batch training step, which no DataLoader feeds because the model runs over all the
    samples at once (a graph network over every node, `output = model(features, adj)`), and whose
    loss selects the samples it trains on with an index or a boolean mask fixed across steps
    (`criterion(output[idx_train], labels[idx_train])`, PyG's `F.cross_entropy(out[data.train_mask],
    data.y[data.train_mask])`; bound before the training loop, or a parameter of the step function
    that every caller fills with a name bound outside its loop), gets this process's share of them:
    right before the statement that selects, `idx_train_share = accelerator.share_selection(idx_train)`
    (a runtime extension, docs/runtime.md: every N-th selected position, padded by wrapping as
    `DistributedSampler` pads, so each process's mean loss is over the same count and the averaged
    gradient is the whole selection's), and the loss's subscripts read it. Only the statements that
    feed the loss change: an accuracy over the training nodes, or an evaluation over other masks,
    keeps the whole selection on every process. The selection must be the one index of every
    subscript there, pair a selected output with a target selected alike, and be read nowhere else
    in them (`/ mask.sum()` counts the whole selection). A selection rebuilt in every step, taken
    inside a function the migration cannot read, counted whole, drawn from a generator the file
    never seeds (`torch.randperm(n)` unseeded: each process would draw its own split), in a file
    with a second training step, or under `--target accelerate` (HF Accelerate has no such call)
    is reported as a step no DataLoader feeds.
    A full-batch step over every row of fixed tensors (`loss = criterion(model(inputs), targets)`
    in the training loop, or in a closure the optimizer steps, LBFGS's `optimizer.step(closure)`,
    defined in the loop or once above it), whose one model call takes one tensor and whose loss is a
    mean over the output's rows (a torch criterion left to its mean reduction, without class
    weights, or `.mean()` of row-wise values; a term without the output, a weight penalty, may be
    added) gets this process's share of the rows: right before the training loop (or the
    statement stepping the closure), `inputs_rows = accelerator.share_selection(len(inputs))`, and
    the reads of `inputs` and `targets` in the statements that feed the loss select them
    (`model(inputs[inputs_rows])`); evaluations keep every row. A closure returns
    `accelerator.reduce(loss.detach(), "mean")` (its backward stays on the local loss), so that
    LBFGS line-searches and stops alike on every process. The tensors must be bound once, before
    the loop, to tensors (torch calls, drawn alike on every process, or handed to the training
    function by every caller), and read only there; the output only there too (or for its shape).
    Rows cut in the loop (minibatches by hand, truncated BPTT), data rebuilt per step, a summed or
    per-row weighted loss, several inputs (a graph's features and edges, two sets of points), an
    output also compared with all the targets (an accuracy in the step), a model with a
    sequence-first recurrent or attention module, or `--target accelerate` (its report says how to
    split the rows by hand) are reported as a step no DataLoader feeds. Data drawn once before
    the loop under a fixed seed gets that report too, not the advice to seed the processes apart
    (which would not change data already drawn).
    A loader such a factory is told to shard by rank (`create_loader(..., distributed=args.distributed)`,
    `rank=`/`world_size=`, also through a `**kwargs` dict built in the same function) shards itself:
    it is kept as it is, not prepared (it would be sharded twice), with a note saying so.

    A model the script wrapped by hand (`model = DDP(model)`, removed by AM007) whose state it then
    loads before the prepare point (a resume block between the optimizer and the loaders:
    `model.load_state_dict(ckpt["model"])`, `optimizer.load_state_dict(...)`) is prepared, with the
    optimizers already built, in a call of its own right before the statement holding that first
    load (`model, optimizer = accelerator.prepare(model, optimizer)`); the loaders keep their own
    call after they are built (`loader = accelerator.prepare(loader)`). The checkpoint the original
    wrote holds DDP's `module.` keys, which the bare module refuses with strict loading; the
    runtime's prepared model takes them and the user's keys, and optimizer state loaded after
    `prepare` lands on the parameters' device. Not under `--target accelerate` (its prepared model
    takes `module.` keys on N processes only): one call after the loaders, as before, and the
    load is reported (a checkpoint of the original needs its `module.` prefix stripped).

Why:
    `prepare` places the model on the device and wraps it for data parallelism, shards each loader
    so every sample reaches exactly one process, and makes optimizer and scheduler steps respect
    gradient accumulation.

Example:
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters())
    +model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)

Leaves alone:
    Values computed over the training loader in its order before it is prepared and read back by
    the batch position of a loop over the prepared loader (knowledge distillation: `outs =
    teacher_outputs(teacher, loader)` or `cached.append(teacher(x))` in a loop over the loader
    above the prepare point, then `for i, (x, y) in enumerate(loader):` reading `outs[i * n:(i +
    1) * n]` or `cached[i]`): prepared, the loader gives each process the batches i*N + rank, so
    position i is another batch of the loader as built and the step would learn against another
    batch's values. Reported on the reading line, with two fixes that work: compute the values in
    the step from the batch, or have the dataset return each sample's index and read the values,
    kept per sample, by it (`outs[index]`). A counter that indexes anything else (a warm-up table,
    log lines) is not reported.
    Under `--target accelerate`, `loader.batch_size` read where `loader` is the prepared training
    loader (a training loop over it, a function it is handed to: `total_num +=
    data_loader.batch_size`) is reported with the line that keeps the number before the prepare
    call: HF Accelerate rebuilds the loader around a batch sampler, which makes the attribute None
    (this runtime's prepared loader keeps it).
    Evaluation loaders (their batches keep their `.to(device)`), schedulers stepped once per epoch
    (prepared, they would advance once per optimizer step and process), frozen models that feed
    no optimizer. A training object first bound after training has started (`train(model, first,
    optimizer)`, then `loader = DataLoader(...)` and `train(model, loader, optimizer)`) refuses the
    file, at its binding: the one prepare call, after it, would leave the first training call
    unprepared. Objects built anew in every iteration of one loop that then trains them (K-fold
    cross-validation: `for fold in range(K):` building the fold's loaders, model and optimizer, or a
    function doing so called once per fold) are prepared in that iteration, after the last of them,
    with `accelerator.free_memory()` before the call (HF Accelerate's pattern for repeated runs: the
    Accelerator lets go of the previous fold's objects). Objects only some of which are rebuilt per
    iteration (an optimizer per learning rate over one model), built in a loop that does not train
    them, built per fold and trained again after the loop, loaded into after a hand wrap in the
    loop (`module.` keys), or created in another function than the optimizer, an
    attribute the class never sets (`self.model` assigned from outside), and an optimizer over
    `self.parameters()` (the class itself is the model) are reported instead. Test modules (importing unittest or pytest, or defining a
    `...TestCase`) and library modules (no entry point, no DataLoader built or iterated) are
    reported and left as they are: their models and data come from elsewhere. An optimizer built
    in a class body (`class Setup: optimizer = SGD(...)`, run once when the class is defined) is
    reported and the file left as it is: no placement of `prepare` there is right for its methods.
    Also reported: `torch.compile(model)` before the prepare call (it would compile the unwrapped
    model: compile the prepared one; not in a branch that never runs, `if False:` or a switch the
    file binds only to `False`, `use_compile = False` ... `if use_compile:`), a training loop over data the code shows is no
    `DataLoader` and no iterator of batches (`zip(...)` or another builtin; a list; a tensor or a
    torch Dataset), named with what builds it, or over a loader not bound
    where the model is prepared (it is not prepared, so every process would see all the data: the
    report says to build the batches with a DataLoader, which is then prepared), a loader still
    sharded by a `DistributedSampler`
    (when AM007 is off: preparing it would shard twice; where it may also be built with a sampler
    not of torch, DeiT's `RASampler` for repeated augmentation, the note says to keep the samplers),
    and a training step that no DataLoader
    feeds (every process would train on the same data; not when the model's whole input is drawn
    from a global generator the file never seeds, `model(torch.randn(20, 10))`, `np.random.rand`,
    `random`, or rows picked by such a draw, `data[torch.randint(0, n, (b,))]`: each process then draws data of its own, as the original drew its own; seeded, drawn
    on a CUDA device or with a `generator=`, or fixed, it is reported; when the batches come from a function of
    this file, `X, Y = get_batch()`, or an object of a class of this file, `x, y =
    train_loader.next_batch()`, the report names it as the one that must draw this process's
    share (a function called in the training loop whose result the model's inputs are not made
    from is none: `history[step] = evaluate(model, val_data)`, `val_loss = evaluate(model)`); a
    policy-gradient step (a `torch.distributions` distribution sampled and scored under one name,
    `action = m.sample(); m.log_prob(action)`: REINFORCE, actor-critic) in a file that seeds torch
    alike trains on episodes played with the model's sampled actions, which have no rows to split:
    the report says to seed each process apart after the prepare call
    (`torch.manual_seed(torch.initial_seed() + accelerator.process_index)`, and the environment's
    seed with it); when that function draws its batches from torch's global RNG, itself or through
    functions of the file, `x = torch.randn(batch_size)` or random offsets `torch.randint(...)`,
    and the module-level draws it reads (a task, `W_target = torch.randn(4, 1) * 5`) are seeded
    alike before they are drawn, it is not reported: the processes other than the main one are
    seeded apart right after the prepare call, as a GAN's noise is, so each draws its own batches
    of the one task (one process runs as before; `tests/e2e/test_step_loss_early_stop.py`); with no
    seed before such a task, drawn at the module level where the Accelerator already exists (it
    is created right below the imports, or at a device choice above the task), nothing is added
    either: the runtime's Accelerator gives every process rank 0's RNG state when it is created and
    its first prepare call seeds them apart again (docs/runtime.md), so every process draws the one
    task and its own batches (`tests/e2e/test_hand_update_unseeded_task.py`); drawn before the
    Accelerator is created, or under `--target accelerate` (HF's Accelerator leaves each process's
    RNG as it is), the report is at the task's line: torch seeds each process at random, so each
    would train on a different task: seed it alike, and run again; an object built with torchrun's global rank, nanoGPT's `DataLoaderLite(...,
    process_rank=ddp_rank, ...)`, already does, and is not reported; built with `LOCAL_RANK`,
    it is, since the local rank repeats on every node; when the batches are consecutive slices of
    one tensor along a later axis, `ids[:, i:i + seq_length]`, with state carried from one step to
    the next, truncated backpropagation through time, a prepared loader would hand each process
    every N-th chunk and break the carried state: the rows are the independent streams, and each
    process takes its share of them, whole and in order, right after the prepare call (or after
    the tensor's binding when that comes later), `ids = accelerator.share_streams(ids)` (a runtime
    extension, docs/runtime.md: every N-th stream, padded by wrapping as `DistributedSampler`
    pads), and the carried state's constructors read `ids.size(0)` where they read the batch size
    (`torch.zeros(num_layers, batch_size, hidden)`, `model.init_hidden(bsz)`), as
    `migrate/roles/sequence_streams.py` finds them: the tensor bound once where the model is
    prepared and read only along its later axes, the state built after the share from the one
    batch-size value the tensor's binding also reads, that value read nowhere else, the loss a
    torch loss's mean, one training step. Otherwise (or under `--target accelerate`) the report
    is at the tensor's binding and says to split its rows per process right after it,
    `ids = ids[accelerator.process_index::accelerator.num_processes]`, and to size the initial
    states to `ids.size(0)`; rows split so by rank, or shared so, are not reported. The word
    language model's layout, a (num_tokens, batch_size) tensor sliced along time by a function of
    the file handed it and the loop's index (`data, targets = get_batch(train_data, i)`, which takes
    `source[i:i + seq_len]`), has its columns as the streams: it is shared with
    `train_data = accelerator.share_streams(train_data, dim=1)` and the state sized from
    `train_data.size(1)` on the same conditions (the tensor read otherwise only along time,
    `len(t)`, `t.size(0)`, or handed to that function, which reads it so too; the training loop in
    the module's scope or in a function only the module calls, after the prepare call:
    `def train(): hidden = model.init_hidden(args.batch_size) ...`); otherwise the report, at the
    tensor's binding, says to share its columns so, and to size the initial state to
    `train_data.size(1)`, not to slice its rows, which are time steps; shared so, it is not
    reported).
    Noise of a GAN drawn in the training loop is seeded apart after the prepare call (see above);
    when a seed of the file may run after that point (in a loop, after the prepare call, or in a
    function not called only before it), which would seed the processes alike again, or a
    `random_split` may (seeded apart, the processes would split the data differently), the draw is reported
    instead, naming that seed and saying to seed with `seed + accelerator.process_index` once what
    must stay alike is done (without a DataLoader, the report of a training step no DataLoader
    feeds says it instead). Noise added to the batch
    (`model(x + noise)`) pairs the same noise with each process's own samples, as dropout does,
    and is not reported. An optimizer factory whose model cannot be told is reported and the file left as it is
    (prepared alone, the optimizer would step a model that is neither placed nor synchronised).
    A `torch.optim` optimizer whose model is not found is prepared alone and reported; once the
    model is added to that `prepare` call by hand, the report goes. Also reported with
    `--target accelerate`, after the prepare call: a prepared model handed to a function the
    migration cannot read that also takes a file path (`utils.restart_from_checkpoint(
    os.path.join(...), student=student)`, a resume or save helper of another module): on N
    processes Accelerate's model is wrapped in DDP and its state dict keys carry `module.`, while
    the migrated script saves the unwrapped module; the report says to pass
    `accelerator.unwrap_model(model)` if it loads or saves state. With `--target runtime` it is
    not reported: the runtime's prepared model has the user's keys and loads `module.` ones.
    A `torch.optim` optimizer whose model cannot be told (its parameter groups come from a library's
    helper, `AdamW(groups)` after `groups = timm_groups(model, wd)`, or from tensors of no model) is
    prepared without a model and reported at its line, naming what its parameters come from: no
    model is guessed, and on N processes each process would train its own copy until the model is
    added to `accelerator.prepare(...)` by hand.
    An optimizer wrapped in another object (`optimizer = ScheduledOptim(torch.optim.Adam(...),
    d_model, warmup)`, the name's only binding, a statement of its own) is bound as the inner
    optimizer, prepared, and wrapped again right after the prepare call (`optimizer =
    ScheduledOptim(optimizer, d_model, warmup)`), so the wrapper's schedule steps the prepared
    optimizer; other wrapped shapes (never bound, rebound, inside an expression) are reported.
    A copy of the model trained in its place (`learner = maml.clone()` in the training loop, then
    `learner(x)` directly or through a helper of this file, and a backward, the model itself never
    called in that loop) refuses the file: the prepared model is DDP on N processes, and a method it
    does not have runs on the wrapped module, so the copy's forward is never DDP's and no gradient
    is averaged (the runtime's check raises GradientSyncError). So does an optimizer rebound to
    another library's distributed optimizer (`optimizer = cherry.optim.Distributed(params,
    opt=optimizer)`, `hvd.DistributedOptimizer(optimizer, ...)`): it averages gradients with its own
    collectives, beside the ones DDP would add. So does a model loaded split over the GPUs
    (`from_pretrained(..., device_map="auto")`, also `"balanced"`, `"balanced_low_0"`,
    `"sequential"`): one process trains it across every GPU (model parallel), where `prepare`
    needs a whole copy on each process's device; the advice is to drop `device_map=` and migrate
    again. A single-device map (`device_map={"": 0}`) is prepared as usual.
    A training loader handed to `iter(...)` or to a generator of the script that yields its
    batches (`batches = cycle(loader)`, then `next(batches)` in the training loop) before the
    prepare point (above the optimizer) refuses the file at that line: the iterator holds the
    loader as it was, so rebinding the name by `prepare` does not reach it; moving the line below
    the optimizer makes the loader prepared (a generator's loader is followed like `iter`'s).
    A second training section in the same scope that builds its optimizer again after the prepare
    call (a notebook-style file training a baseline, then another model) is reported and the
    file left as it is: that section's model would train unprepared.

Fix safety:
    Safe on one process: the prepared loader yields the same batches in the same order, and the
    per-rank seed runs only on processes other than the main one.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from migrate.analysis import LibraryCall, Scope, StmtRef
from migrate.edits import EditPlan
from migrate.names import call_argument
from migrate.positions import start_lines
from migrate.roles import Roles, loader_calls, sampler_values
from migrate.roles.calls import RNG_DRAWS, RNG_SEEDS
from migrate.roles.loaders import unseeded_task_message
from migrate.roles.model import WrappedOptimizer
from migrate.roles.placement import first_code_statement
from migrate.roles.rng import TORCH, draw_generator, seeded_generators
from migrate.rules.base import (
    assignment, early_prepare, indent_of, prepared_at, prepared_loaders, reference, runs_before_prepare, statement,
)
from migrate.walk import Visitor, walk

CODE = "AM004"
NAME = "prepare-training-objects"


def _sampler_epoch_calls(roles: Roles, home: Scope, loader: str) -> list[str]:
    """The `set_epoch(...)` calls of the training function on the loader's sampler, as written
    (`<loader>.sampler.set_epoch(e)`, or `train_sampler.set_epoch(e)` on the name passed as
    `sampler=`): with the sampler dropped (as the report on an already-sharded loader asks) they
    would raise AttributeError (the loader's sampler is a plain one) or NameError."""
    empty = cst.Module([])
    found: list[str] = []
    receivers = {f"{loader}.sampler"} | {
        arg.value.value
        for _, call in loader_calls(roles, home, loader)
        for arg in call.args
        if arg.keyword is not None and arg.keyword.value == "sampler" and type(arg.value) is cst.Name
    }

    class Calls(Visitor):
        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            if type(func) is cst.Attribute and func.attr.value == "set_epoch" \
                    and empty.code_for_node(func.value) in receivers:
                found.append(empty.code_for_node(node))

    walk(home.node, Calls())
    return found


def _other_samplers(roles: Roles, home: Scope, loader: str) -> list[str]:
    """The samplers `loader` may be built with, besides torch's own (`RASampler` of the script's
    package beside a DistributedSampler, in DeiT): as written, in order, once each."""
    empty = cst.Module([])
    found: list[str] = []
    for scope, call in loader_calls(roles, home, loader):
        for value in sampler_values(roles, scope, call):
            if type(value) is not cst.Call:
                continue
            qualified = roles.facts.aliases.qualify(value.func) or ""
            if qualified.startswith("torch."):
                continue
            shown = empty.code_for_node(value.func)
            if shown not in found:
                found.append(shown)
    return found


def apply(roles: Roles, plan: EditPlan) -> None:
    home = roles.home
    if home is None or not (roles.models or roles.optimizers):
        return
    _unseeded_task(roles, plan)
    for name, loop in roles.rank_sampled.items():
        if name not in plan.unsharded_loaders:
            others = _other_samplers(roles, home, name)
            if others:
                shown = ", ".join(f"`{o}(...)`" for o in others)
                plan.report(
                    CODE,
                    loop,
                    f"`{name}` already shards the data by rank (a DistributedSampler, or {shown}, not torch's, which "
                    "may do more than shard: repeated augmentation, say); preparing it "
                    "would shard twice, so it was not prepared and it is sampled as before. Keep the samplers as "
                    f"they are: `prepare` has no equivalent of {shown}",
                )
                continue
            plan.report(
                CODE,
                loop,
                f"`{name}` already shards the data by rank (DistributedSampler); preparing it would shard "
                "twice, so it was not prepared: drop the sampler (the DataLoader then shuffles as the sampler did: `shuffle=True`, unless the sampler had `shuffle=False`)"
                + "".join(f", remove `{call}`" for call in _sampler_epoch_calls(roles, home, name))
                + " and migrate again: the loader is then prepared, which shards it by rank and reshuffles "
                "it each epoch",
            )
    if plan.target == "accelerate":
        for name, built in roles.unread_loaders.items():
            if name in home.prepared:
                continue  # prepared by hand, as the report asks
            plan.report(CODE, _loader_line(roles, home, name), (
                f"the training loop iterates `{name}`, built by `{built}(...)`, a function the migration cannot "
                "read: it may not be a torch DataLoader, and HF Accelerate's `prepare` returns anything else "
                "unchanged, so every process would see all the data; it was not prepared. If it is a DataLoader, "
                f"add `{name}` to `accelerator.prepare(...)` by hand; or migrate with `--target runtime`, whose "
                "`prepare` shards a DataLoader and gives each process its share of another iterator's batches"),
                unconverted=True)
        for name, why in roles.iterable_loaders.items():
            if name not in home.prepared:
                plan.report(CODE, _loader_line(roles, home, name), why, unconverted=True)
        _batch_size_reads(roles, plan, home)
    _batch_position_reads(roles, plan, home)
    moved = roles.training_only_loaders
    loaders = [n for n in prepared_loaders(roles, plan) if n not in moved]
    names = [
        n
        for n in (*roles.models, *roles.optimizers, *loaders, *plan.eval_loaders, *roles.schedulers)
        if n not in home.prepared
    ]
    if not names or home.prepared:
        _batches_left_alike(roles, plan)
        _full_batch_left_whole(roles, plan)
        return
    if not roles.can_reach(home):
        # An Accelerator the script already creates elsewhere (`def main(): accelerator = ...`)
        # that the code building the optimizer cannot see: a prepare call there would be a NameError.
        created = roles.accelerator_scope.name if roles.accelerator_scope is not None else "?"
        built = home.bindings[roles.optimizers[0]][0].where.stmt if roles.optimizers else home.node
        plan.report(CODE, built, (
            f"{', '.join(names)} are built where the script's Accelerator (created in `{created}`) cannot "
            "be seen, so they were not prepared: build them where the Accelerator is created, or pass it "
            "in, and add them to `accelerator.prepare(...)`"
        ), unconverted=True)
        _full_batch_left_whole(roles, plan)
        return
    where = roles.prepare_after
    names = _prepare_early(roles, plan, home, names)
    if not names:
        plan.use_accelerator(home)
        _prepare_received(roles, plan)
        _prepare_in_training_methods(roles, plan)
        _share_selection(roles, plan)
        _streams_left_whole(roles, plan)
        _share_rows(roles, plan)
        return
    # a model a trainer trains through a hand-wrapped alias is prepared into the alias
    bound = {model: alias for alias, model in roles.model_aliases.items()}
    targets = [bound.get(n, n) for n in names]
    stmt = assignment(targets, "accelerator.prepare", names, indent_of(home, where))
    # an alias the step uses, bound before the prepare point, names the prepared object again
    rebound = [statement(f"{alias} = {bound.get(n, n)}\n") for alias, n in roles.step_aliases.items() if n in names]
    # every iteration of a loop building them anew (or every call of a function called in a loop)
    # prepares its own objects: the Accelerator lets go of the previous iteration's first
    repeated = roles.prepare_per_iteration is not None or roles.prepare_repeated
    freed = [statement("accelerator.free_memory()\n")] if repeated else []
    if where is not None:
        plan.insert_after.setdefault(where.stmt, []).extend([*freed, stmt, *rebound])
        anchor = where.stmt
    else:
        anchor = roles.create_before
        if anchor is None:
            _batches_left_alike(roles, plan)
            _full_batch_left_whole(roles, plan)
            return
        plan.insert_before.setdefault(anchor, []).extend([*freed, stmt, *rebound])
    for name in names:
        wrapped = roles.wrapped_optimizers.get(name)
        if wrapped is not None:
            _rewrap(plan, name, wrapped, anchor, after=where is not None)
    plan.use_accelerator(home)
    if repeated:
        plan.change(CODE, anchor, (
            f"prepare {', '.join(names)} in every iteration of the loop that builds them anew, after "
            "`accelerator.free_memory()` lets go of the previous iteration's"))
    else:
        plan.change(CODE, anchor, f"prepare {', '.join(names)}")
    _prepare_received(roles, plan)
    _prepare_in_training_methods(roles, plan)
    _seed_draws_per_rank(roles, plan, where, anchor, after=where is not None)
    _share_selection(roles, plan)
    _share_streams(roles, plan, where, stmt)
    _share_rows(roles, plan)


def _batch_size_reads(roles: Roles, plan: EditPlan, home: Scope) -> None:
    """`--target accelerate`: `loader.batch_size` read where `loader` is the prepared training
    loader (a function it is handed to, or a training loop over it): HF Accelerate rebuilds the
    loader around a batch sampler, so the attribute is None there (`total += loader.batch_size`
    raises a TypeError). Reported with the line that keeps the number."""
    loaders = [n for n in prepared_loaders(roles, plan) if n not in home.prepared]
    if not loaders:
        return
    for scope in roles.facts.scopes:
        if scope is home:
            roots = [loop.node for loop in scope.loops if loop.source is not None and loop.source in loaders]
        else:
            roots = [scope.node]
        for root in roots:
            reads = _BatchSizeReads(roles, scope, loaders, root)
            walk(root, reads)
            for stmt, name in reads.found:
                built = sorted(n for s, n in roles.origins(scope, name) or set() if s is home) or [name]
                plan.report(CODE, stmt, (
                    f"`{name}.batch_size` is None once HF Accelerate has prepared `{built[0]}` (it rebuilds the "
                    "loader around a batch sampler), so this line would fail or compute with None. Keep the "
                    f"number before the prepare call in `{home.qualname}` (`batch_size = {built[0]}.batch_size`, "
                    "handed on to where it is read) and read that; or migrate with `--target runtime`, whose "
                    "prepared loader keeps `batch_size`"), unconverted=True)


def _batch_position_reads(roles: Roles, plan: EditPlan, home: Scope) -> None:
    """Values computed over a loader in its order before it is prepared (teacher outputs kept per
    batch, or per sample in dataset order: `outputs = teacher_outputs(teacher, loader)`, or
    `cached.append(teacher(x))` in a loop over it) and read back by the batch position of a loop
    over the prepared loader (`for i, (x, y) in enumerate(loader): t = outputs[i]`). Prepared, the
    loader gives this process its batches i*N + rank: position i is another batch of the loader
    as built, so the step would pair its samples with another batch's values. Reported on the
    reading line (no rewrite reorders the values exactly: the prepared loader's order depends on
    the number of processes, its shuffling and the padding of the last round)."""
    loaders = [*prepared_loaders(roles, plan), *plan.eval_loaders]
    if not loaders:
        return
    early = early_prepare(roles, plan)
    reported: set[int] = set()
    for scope in roles.facts.scopes:
        for loop in scope.loops:
            # the syntactic tests first: most loops read nothing by an enumerate counter
            counter = _enumerate_counter(loop.node) if loop.source is not None else None
            reads = _position_reads(loop.node, counter) if counter is not None else []
            if not reads or not roles.all_in(scope, loop.source, loaders):
                continue
            if runs_before_prepare(roles, scope, loop, early):
                continue
            origins = _loader_identity(roles, home, roles.origins(scope, loop.source) or set())
            if not origins:
                continue
            for stmt, read, cache in reads:
                if id(stmt) in reported:
                    continue
                built = _cached_over(roles, scope, cache, origins, early, 0)
                if built is None:
                    continue
                reported.add(id(stmt))
                line = start_lines(roles.facts.module, [built])[built]
                loader = sorted(n for _, n in origins)[0]
                plan.report(CODE, stmt, (
                    f"`{_code(read)}` reads `{cache}`, computed over `{loader}` in the order of the loader as built "
                    f"(line {line}: `{_code(built)}`), by the batch position `{counter}` of a loop over the prepared "
                    f"`{loop.source}`: on N processes this process's batch at position i is the loader's batch i*N + rank, "
                    f"so the step would pair its samples with another batch's values of `{cache}`. It was left as it "
                    "is: compute those values in the step from the batch itself (a teacher's outputs under "
                    "`torch.no_grad()`), or have the dataset return each sample's index with it (a "
                    "`torch.utils.data.Dataset` whose `__getitem__` returns `x, y, index`) and read the values "
                    f"kept per sample in dataset order by those indices (`{cache}[index]`)"), unconverted=True)


def _loader_identity(roles: Roles, home: Scope, origins: set) -> set:
    """The loader's origins, with what home binds it from when home keeps a parameter of its own
    (`self.loader = loader` in a constructor that prepares `self.loader`): the caller's loader,
    which is never rebound to the prepared one, is the loader as built."""
    found = set(origins)
    for scope, name in origins:
        if scope is not home:
            continue
        for binding in home.bindings.get(name, []):
            value = binding.value
            if isinstance(value, cst.Name) and value.value in home.params:
                found |= roles.origins(home, value.value) or set()
    return found


def _enumerate_counter(loop: cst.For) -> str | None:
    """`i` of `for i, batch in enumerate(loader)` (also through a wrapper: `tqdm(enumerate(loader))`)."""
    node: cst.BaseExpression = loop.iter
    while isinstance(node, cst.Call) and not (isinstance(node.func, cst.Name) and node.func.value == "enumerate"):
        if not node.args or node.args[0].keyword is not None:
            return None
        node = node.args[0].value
    if not isinstance(node, cst.Call) or not isinstance(loop.target, (cst.Tuple, cst.List)) or not loop.target.elements:
        return None
    first = loop.target.elements[0].value
    return first.value if isinstance(first, cst.Name) else None


class _IndexedBy(Visitor):
    """Whether a subscript's index reads the name `counter` (anywhere: reads or assignments)."""

    def __init__(self, counter: str) -> None:
        self.counter = counter
        self.found = False

    def visit_Subscript(self, node: cst.Subscript) -> bool:
        self.found = self.found or _reads_name(node.slice, self.counter)
        return not self.found


def _position_reads(loop: cst.For, counter: str) -> list[tuple[cst.BaseStatement, cst.Subscript, str]]:
    """The subscripts `cache[... counter ...]` the loop's body reads (not assigns), with their statement."""
    found: list[tuple[cst.BaseStatement, cst.Subscript, str]] = []
    indexed = _IndexedBy(counter)
    walk(loop.body, indexed)
    if not indexed.found:
        return found  # most loops use their counter for logging and schedules only
    statements: list[cst.BaseStatement] = []
    targets: set[int] = set()

    class Reads(Visitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return False
            if isinstance(node, cst.BaseStatement):
                statements.append(node)
            if isinstance(node, (cst.AssignTarget, cst.AugAssign)):
                target = node.target
                if isinstance(target, cst.Subscript):
                    targets.add(id(target))
            if isinstance(node, cst.Subscript) and id(node) not in targets and statements:
                name = reference(node.value)
                if name is not None and name != counter and _reads_name(node.slice, counter):
                    found.append((statements[-1], node, name))
            return True

        def on_leave(self, original_node: cst.CSTNode) -> None:
            if statements and statements[-1] is original_node:
                statements.pop()

    for stmt in loop.body.body:
        walk(stmt, Reads())
    return found


def _reads_name(nodes: Sequence[cst.SubscriptElement], name: str) -> bool:
    found = False

    class Names(Visitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nonlocal found
            if isinstance(node, cst.Name) and node.value == name:
                found = True
            return not found and not isinstance(node, cst.Attribute)

    for element in nodes:
        walk(element, Names())
    return found


def _cached_over(
    roles: Roles, scope: Scope, name: str, loader: set, early: tuple[StmtRef, list[str]] | None, depth: int,
) -> cst.BaseStatement | None:
    """The statement that computes `name` (as `scope` sees it) over the loader whose origins are
    `loader`, in that loader's order, before the loader is prepared: a call of a function of this
    file that loops over the loader it is handed (`get_teacher_output(teacher, loader)`), a loop over
    the loader that fills it (`cached.append(...)`, `outs[i * n:(i + 1) * n] = ...`), or a value
    made from such a name (`torch.cat(cached)`)."""
    if depth > 3:
        return None
    for origin_scope, origin in roles.origins(scope, name) or set():
        for binding in origin_scope.bindings.get(origin, []):
            if origin_scope is roles.home and not _before_prepare(roles, binding.where.order, loader, early):
                continue
            value = binding.value
            if value is not None and _comprehends(roles, origin_scope, value, loader):
                return binding.where.stmt
            if isinstance(value, cst.Call):
                callee = roles.facts.function_called(value)
                if callee is not None and _loops_over_argument(roles, origin_scope, callee, value, loader):
                    return binding.where.stmt
                for arg in value.args:
                    inner = reference(arg.value)
                    if inner is not None and inner != origin:
                        found = _cached_over(roles, origin_scope, inner, loader, early, depth + 1)
                        if found is not None:
                            return binding.where.stmt
        for loop in origin_scope.loops:
            if loop.source is None or not (roles.origins(origin_scope, loop.source) or set()) & loader:
                continue
            if origin_scope is roles.home and not runs_before_prepare(roles, origin_scope, loop, early):
                continue
            if _fills(loop.node, origin):
                return loop.node
    return None


def _comprehends(roles: Roles, scope: Scope, value: cst.BaseExpression, loader: set) -> bool:
    """`value` holds a comprehension over the loader (`[teacher(x) for x, _ in loader]`, also
    inside a call: `torch.cat([...])`)."""
    found = False

    class Comprehensions(Visitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nonlocal found
            if isinstance(node, cst.CompFor):
                name = reference(node.iter)
                if name is not None and (roles.origins(scope, name) or set()) & loader:
                    found = True
            return not found and not isinstance(node, (cst.Lambda, cst.FunctionDef))

    walk(value, Comprehensions())
    return found


def _before_prepare(roles: Roles, order: int, loader: set, early: tuple[StmtRef, list[str]] | None) -> bool:
    assert roles.home is not None
    names = sorted(n for s, n in loader if s is roles.home)
    at = prepared_at(roles, names[0], early) if names else None
    return at is not None and order <= at


def _loops_over_argument(roles: Roles, caller: Scope, callee: Scope, call: cst.Call, loader: set) -> bool:
    """`callee` iterates the parameter that `call` fills with the loader."""
    for loop in callee.loops:
        if loop.source is None or loop.source not in callee.params:
            continue
        index = callee.params.index(loop.source) - (1 if callee.is_method else 0)
        arg = call_argument(call, index, loop.source) if index >= 0 else None
        name = reference(arg) if arg is not None else None
        if name is not None and (roles.origins(caller, name) or set()) & loader:
            return True
    return False


def _fills(loop: cst.For, name: str) -> bool:
    """The loop's body appends to `name` (`append`/`extend`), assigns into it (`name[...] = ...`)
    or adds to it (`name += [...]`)."""
    found = False

    class Fills(Visitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nonlocal found
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in (
                "append", "extend"
            ) and reference(node.func.value) == name:
                found = True
            if isinstance(node, (cst.AssignTarget, cst.AugAssign)):
                target = node.target
                if isinstance(target, cst.Subscript):
                    target = target.value
                if reference(target) == name and (isinstance(node, cst.AugAssign) or target is not node.target):
                    found = True
            return not found

    walk(loop.body, Fills())
    return found


def _code(node: cst.CSTNode) -> str:
    text = cst.Module(body=[]).code_for_node(node).strip().splitlines()[0]
    return text if len(text) <= 60 else text[:57] + "..."


class _BatchSizeReads(Visitor):
    def __init__(self, roles: Roles, scope: Scope, loaders: list[str], root: cst.CSTNode) -> None:
        self.roles, self.scope, self.loaders, self.root = roles, scope, loaders, root
        self.statements: list[cst.BaseStatement] = []
        self.found: list[tuple[cst.BaseStatement, str]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is not self.root and isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if isinstance(node, cst.BaseStatement):
            self.statements.append(node)
        if (
            isinstance(node, cst.Attribute) and node.attr.value == "batch_size" and isinstance(node.value, cst.Name)
            and self.statements and self.roles.all_in(self.scope, node.value.value, self.loaders)
            and not any(stmt is self.statements[-1] for stmt, _ in self.found)
        ):
            self.found.append((self.statements[-1], node.value.value))
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if self.statements and self.statements[-1] is original_node:
            self.statements.pop()


def _prepare_early(roles: Roles, plan: EditPlan, home: Scope, names: list[str]) -> list[str]:
    """The models (and optimizers) whose state the script loads after a removed hand wrap and
    before the prepare point are prepared in a call of their own before that load (see
    `migrate.roles.placement._early_prepare`); returns what is left for the prepare point. Not
    under `--target accelerate`: its prepared model is DDP's on N processes (`module.` keys only)
    and the bare module on one (the user's keys only), so neither placement loads every checkpoint."""
    found = early_prepare(roles, plan)
    if roles.early_prepare is not None and roles.early_load is not None and found is None:
        shown = cst.Module([]).code_for_node(roles.early_load.func)
        plan.report(CODE, roles.early_load, (
            f"`{shown}(...)` loads state into the model the original wrapped by hand (`DistributedDataParallel` or "
            "`DataParallel`, removed here) before `accelerator.prepare(...)`, so it now runs on the bare module: a "
            "checkpoint the original wrote from its wrapped model holds `module.`-prefixed keys, which strict loading refuses (the migrated "
            "script's own checkpoints load). To resume a run the original started, strip the prefix from that "
            "checkpoint's model state (`{k.removeprefix('module.'): v for k, v in state.items()}`), or migrate "
            "with `--target runtime`, whose prepared model takes both"))
    if found is None or roles.prepare_after is None:
        return names
    holder, early = found
    early = [n for n in early if n in names]
    if not early:
        return names
    before = holder.stmt
    stmt = assignment(early, "accelerator.prepare", early, indent_of(home, holder))
    plan.insert_before.setdefault(before, []).append(stmt)
    for name in early:
        wrapped = roles.wrapped_optimizers.get(name)
        if wrapped is not None:
            _rewrap(plan, name, wrapped, before, after=False)
    plan.change(CODE, before, (
        f"prepare {', '.join(early)} before the state loaded into them: a checkpoint of the hand-wrapped "
        "model (`module.` keys) loads into the prepared model, and optimizer state lands on its device"))
    return [n for n in names if n not in early]


def _loader_line(roles: Roles, home: Scope, name: str) -> cst.CSTNode:
    """The statement binding `name` in home (its first), else in the other methods of home's class
    (`self.loader = get_loader(...)` in the constructor), else home itself."""
    for scope in (home, *(roles.methods_of(home) or [])):
        bound = scope.bindings.get(name, [])
        if bound:
            return bound[0].where.stmt
    return home.node


def _prepare_received(roles: Roles, plan: EditPlan) -> None:
    """A loader handed once to a method of home's class (`trainer.fit(loader)`, the model built and
    prepared by the constructor): prepared on entry to that method, where the class's
    `self.accelerator` is seen."""
    for scope, name in roles.received_loaders:
        first = first_code_statement(roles.facts, scope)
        if first is None or not roles.can_reach(scope):
            plan.report(CODE, scope.node, (
                f"`{name}` is the loader this method trains on, handed in by its caller, but the Accelerator "
                "cannot be seen here; it is not prepared, so every process would see all the data: prepare it "
                "where it is built"), unconverted=True)
            continue
        stmt = assignment([name], "accelerator.prepare", [name], indent_of(scope, None))
        plan.insert_before.setdefault(first, []).insert(0, stmt)
        plan.use_accelerator(scope)
        plan.change(CODE, first, f"prepare {name}, the loader handed to `{scope.qualname}`")


def _prepare_in_training_methods(roles: Roles, plan: EditPlan) -> None:
    """Loaders the instance holds that a method which does not train also iterates (`test()` over
    `self.celeba_loader`): prepared on entry to each method that trains from them, into a local
    read in place of the attribute there (`Roles.method_loaders`); the instance keeps the user's
    loader, so the other methods see all of it, as in the original."""
    for scope, found in roles.method_loaders.items():
        first = first_code_statement(roles.facts, scope)
        if first is None:
            continue
        locals_ = [local for _, local, _ in found]
        stmt = assignment(locals_, "accelerator.prepare", [attribute for attribute, _, _ in found], indent_of(scope, None))
        plan.insert_before.setdefault(first, []).insert(0, stmt)
        for _, local, reads in found:
            for read in reads:
                plan.attributes[read] = lambda _, local=local: cst.Name(local)
        plan.use_accelerator(scope)
        shown = ", ".join(f"`{attribute}`" for attribute, _, _ in found)
        plan.change(CODE, first, (
            f"prepare {shown} on entry to `{scope.qualname}`, which trains from it, into a local: the instance "
            "keeps the unprepared loader for the methods that do not train"))


# Draws from torch's global RNG of fresh values (not a permutation of the data: that is the
# loader's business, reported as a training step no DataLoader feeds).
_DRAWS = RNG_DRAWS
_SEEDS = RNG_SEEDS


def _seed_draws_per_rank(
    roles: Roles, plan: EditPlan, where: StmtRef | None, anchor: cst.BaseStatement, after: bool,
) -> None:
    """A training loop whose prepared model takes, as its whole input, a tensor drawn there from
    torch's global RNG (a GAN's noise, `fake = netG(torch.randn(b, nz, 1, 1, device=device))`):
    the global RNG starts alike on every process when the script seeds it (`torch.manual_seed(seed)`)
    or when the draw is on a CUDA device (the CUDA generator's default seed is fixed; unseeded, the
    CPU generator's is the operating system's, apart on each process, and nothing is done), so
    every process draws the same values at every step, and the N
    processes train on N copies of one batch of noise where one process with an N-times batch
    would draw N different ones. Unless a seed already reads the rank, right after the prepare
    call the processes other than the main one seed torch's RNG apart,
    `if accelerator.process_index: torch.manual_seed(torch.initial_seed() + accelerator.process_index)`:
    what must stay alike (a `random_split`, the models' initial weights, a fixed noise drawn for
    previews) was drawn before it, the main process keeps the script's own stream (one process
    runs exactly as before), and prepared loaders shuffle from the main process's seed whatever
    each process's RNG holds. Reported at the draw instead when a seed of the file may run after
    that point (in a loop, in another function, after the prepare call), which would make the
    processes alike again or reseed them where it is not known to be safe."""
    seeds = [(scope, call) for scope in roles.facts.scopes for call in scope.library_calls if call.qualified in _SEEDS]
    if not roles.loaders:
        if roles.random_batches is not None and not any(_reads_rank(call.call) for _, call in seeds):
            _seed_batches_per_rank(roles, plan, where, anchor, after, seeds)
        return  # otherwise its own report says every process trains alike
    if any(_reads_rank(call.call) for _, call in seeds):
        return
    drawn = [(draw, model) for scope in roles.facts.scopes if roles.can_reach(scope)
             for draw, model in _drawn_inputs(roles, scope)]
    if not drawn:
        return
    seeded_torch = TORCH in seeded_generators(roles.facts)
    if not seeded_torch and all(draw_generator(roles.facts, draw) == TORCH for draw, _ in drawn):
        return  # unseeded, torch's CPU generator starts from its own seed on each process: drawn apart already
    home = roles.home
    torch_names = roles.facts.aliases.local_names_for("torch")
    late = [(scope, call) for scope, call in seeds if not _runs_before(roles, scope, call.where, call.loops, where)]
    splits = [(scope, call) for scope in roles.facts.scopes for call in scope.library_calls
              if call.qualified in _SPLITS and not _runs_before(roles, scope, call.where, call.loops, where)]
    if torch_names and not late and not splits:
        torch_name = torch_names[0]
        stmt = cst.parse_statement(
            "if accelerator.process_index:\n"
            f"    {torch_name}.manual_seed({torch_name}.initial_seed() + accelerator.process_index)\n"
        )
        (plan.insert_after if after else plan.insert_before).setdefault(anchor, []).append(stmt)
        for draw, model in drawn:
            shown = cst.Module([]).code_for_node(draw)
            plan.change(CODE, draw, (
                f"`{shown}`, the whole input of `{model}(...)` in the training loop, is drawn apart on each process: "
                "after the prepare call the processes other than the main one seed torch's RNG with "
                "`torch.initial_seed() + accelerator.process_index`"))
        return
    seeded = cst.Module([]).code_for_node(seeds[0][1].call) if seeds else None
    why = ""
    if late:
        scope, call = late[0]
        if call.loops:
            where_seed = "runs in a loop"
        elif scope is home:
            where_seed = "runs after the prepare call"
        else:
            where_seed = (f"is in `{scope.qualname}`, not beside the prepare call, so whether it runs before that "
                          "call cannot be told")
        why = (f"It was not seeded apart after the prepare call, since `{cst.Module([]).code_for_node(call.call)}` "
               f"{where_seed}: a seed run after that point would seed the processes alike again. ")
    elif splits:
        why = (f"It was not seeded apart after the prepare call, since `{cst.Module([]).code_for_node(splits[0][1].call)}` "
               "may run after that point, and seeded apart the processes would split the data differently. ")
    for draw, model in drawn:
        shown = cst.Module([]).code_for_node(draw)
        origin = (f"`{seeded}` seeds every process alike when each gets the same value" if seeded is not None
                  else "a seed function of the file seeds every process alike" if seeded_torch
                  else "the file seeds nothing, but a draw on a CUDA device uses the CUDA generator, whose default "
                  "seed is the same on every process")
        fix = ("`accelerate.utils.set_seed(seed, device_specific=True)`" if plan.target == "accelerate"
               else "`torch.manual_seed(seed + accelerator.process_index)`")
        plan.report(CODE, draw, (
            f"`{shown}` is the whole input of `{model}(...)` in the training loop, drawn from torch's global RNG, "
            f"which starts alike on every process ({origin}): the processes draw the same values at every step, "
            "so N processes train on N copies of one batch of it, where one process with an N-times batch draws N "
            f"different ones. {why}Seed each process differently once what must stay alike is done (a `random_split` "
            f"or other draw that picks the data; prepared loaders shuffle alike whatever the seed): {fix}"
        ), unconverted=True)


def _unseeded_task(roles: Roles, plan: EditPlan) -> None:
    """Module-level draws the training batches are made from, with no seed before them (`W_target =
    torch.randn(4, 1) * 5`, read by `get_batch()`; `roles.unseeded_task`). Unseeded, torch's CPU
    generator starts apart on every process, so each would draw its own task. The runtime's
    Accelerator, created on N processes, gives every process rank 0's generator state when their
    seeds differ, and its first `prepare` call seeds the processes apart again (runtime/rng.py):
    drawn after the Accelerator is created, at the module level, the task is the same everywhere
    and each process draws its own batches, with nothing to add. Reported where the draws run
    before the Accelerator is created (it is created at a later device choice, or in a function),
    and under `--target accelerate`, whose Accelerator leaves the generators as they are."""
    if roles.unseeded_task is None:
        return
    function, task = roles.unseeded_task
    if plan.target != "accelerate" and plan.create_at is None:  # not at a removed group setup (AM007)
        created = _module_accelerator_order(roles)
        if created is not None and all(created <= b.where.order for b in task):
            return
    plan.report(CODE, task[0].where.stmt, unseeded_task_message(function, task), unconverted=True)


def _module_accelerator_order(roles: Roles) -> int | None:
    """The order of the module statement at which `accelerator = Accelerator()` is created (before
    the first statement after the imports, or in place of a device choice, which draws nothing), when
    it is created at the module level; else None."""
    facts = roles.facts
    if roles.accelerator_scope is not facts.module_scope or roles.accelerator_exists:
        return None
    if roles.device_binding is not None:
        return roles.device_binding.where.order
    end = facts.import_block_end
    if end is not None and roles.create_before is end.stmt:
        return end.order
    return None


def _share_selection(roles: Roles, plan: EditPlan) -> None:
    """A full-batch step whose loss selects its samples with a fixed index or mask
    (`roles.shared_selection`, `migrate.roles.full_batch`): right before the first statement that
    selects them, this process's share is bound (`idx_train_share =
    accelerator.share_selection(idx_train)`) and the loss's subscripts read it; every other use of
    the selection (an evaluation over the training nodes) keeps the whole of it. A runtime
    extension: under `--target accelerate`, or where the step cannot reach the Accelerator, the
    step is reported as before."""
    shared = roles.shared_selection
    if shared is None:
        return
    if plan.target == "accelerate" or not roles.can_reach(shared.scope):
        _selection_left_whole(roles, plan)
        return
    stmt = statement(f"{shared.name} = accelerator.share_selection({shared.shown})\n")
    plan.insert_before.setdefault(shared.before, []).append(stmt)
    for subscript in shared.subscripts:
        plan.subscripts[subscript] = lambda node, name=shared.name: node.with_changes(
            slice=[node.slice[0].with_changes(slice=cst.Index(cst.Name(name)))])
    plan.use_accelerator(shared.scope)
    plan.change(CODE, shared.before, (
        f"the loss is taken over this process's share of `{shared.shown}` (`accelerator.share_selection`, a "
        "runtime extension): every process runs the model over all the samples and each takes the loss over "
        "every N-th selected one, so N processes share the step's samples as a prepared DataLoader shares a "
        "dataset" + _PADDED))


# how a share of samples, rows or streams evens out (runtime/accelerator.py pads by wrapping around)
_PADDED = ("; when their number does not divide by N, some processes' shares repeat the first ones to "
           "even them out, as DistributedSampler pads (a few counted twice)")


def _share_streams(roles: Roles, plan: EditPlan, where: StmtRef | None, prepared: cst.BaseStatement) -> None:
    """Truncated BPTT over the streams (rows) of one batchified tensor (`roles.shared_streams`,
    `migrate.roles.sequence_streams`): this process's share of the streams is bound over the tensor
    (`ids = accelerator.share_streams(ids)`) right after the prepare call (`prepared`, inserted after
    `where`), or right after the tensor's binding when that comes later, and the carried state's
    constructors read the shared row count (`torch.zeros(num_layers, ids.size(0), hidden_size)`)
    where they read the batch size. A runtime extension: under `--target accelerate`, with no
    prepare point, or with a state built before the share, the step is reported as before."""
    shared = roles.shared_streams
    if shared is None:
        return
    if plan.target == "accelerate" or where is None or not roles.can_reach(shared.scope):
        _streams_left_whole(roles, plan)
        return
    after = max(where.order, shared.binding.where.order)
    if any(run.order <= after for run in shared.runs) or (
            not shared.runs and any(state.where.order <= after for state in shared.states)):
        _streams_left_whole(roles, plan)  # the state would be sized (or the step run) before the share
        return
    tensor = shared.tensor
    axis = ", dim=1" if shared.dim == 1 else ""
    stmt = statement(f"{tensor} = accelerator.share_streams({tensor}{axis})\n")
    if shared.binding.where.order > where.order:
        plan.insert_after.setdefault(shared.binding.where.stmt, []).append(stmt)
        anchor = shared.binding.where.stmt
    else:
        inserted = plan.insert_after.setdefault(where.stmt, [])
        inserted.insert(inserted.index(prepared) + 1 if prepared in inserted else len(inserted), stmt)
        anchor = where.stmt
    rows = f"{tensor}.size({shared.dim})"
    for call, positions in shared.calls:
        previous = plan.calls.get(call)

        def sized(node: cst.Call, positions: list[int] = positions, previous=previous) -> cst.BaseExpression:
            # a node of its own at each place: one node object must not sit in two places of the output
            args = [a.with_changes(value=cst.parse_expression(rows)) if k in positions else a
                    for k, a in enumerate(node.args)]
            node = node.with_changes(args=args)
            return previous(node) if previous is not None else node

        plan.calls[call] = sized
    plan.use_accelerator(shared.scope)
    plan.change(CODE, anchor, (
        f"each process trains on its share of the streams (rows) of `{tensor}`, whole and in order "
        f"(`accelerator.share_streams`, a runtime extension), and the state carried from one slice to the next "
        f"is sized to them (`{tensor}.size({shared.dim})`, not `{shared.size}`): N processes share the streams as a "
        "prepared DataLoader shares a dataset" + _PADDED))


def _full_batch_left_whole(roles: Roles, plan: EditPlan) -> None:
    """The reports of every data share (a selection, rows, streams) a step no DataLoader feeds would
    have taken, where no prepare call is inserted for AM004 to share them after."""
    _selection_left_whole(roles, plan)
    _rows_left_whole(roles, plan)
    _streams_left_whole(roles, plan)


def _streams_left_whole(roles: Roles, plan: EditPlan) -> None:
    """The report of a truncated-BPTT step no DataLoader feeds, for streams AM004 does not share."""
    shared = roles.shared_streams
    if shared is None:
        return
    finding = shared.finding
    message = finding.message
    if plan.target == "accelerate":
        message += (
            f". HF Accelerate has no call that shares `{shared.tensor}`'s streams out; `--target runtime` takes each "
            f"process's share of them with `{shared.tensor} = accelerator.share_streams({shared.tensor}"
            + (", dim=1" if shared.dim == 1 else "") + ")`")
    plan.report(CODE, finding.node, message, unconverted=True)


def _selection_left_whole(roles: Roles, plan: EditPlan) -> None:
    """The report of a step no DataLoader feeds, for a full-batch selection AM004 does not share."""
    shared = roles.shared_selection
    if shared is None:
        return
    finding = shared.finding
    message = finding.message
    if plan.target == "accelerate":
        message += (
            f". HF Accelerate has no call that shares `{shared.shown}` out; `--target runtime` takes each "
            f"process's share of it with `accelerator.share_selection({shared.shown})`")
    plan.report(CODE, finding.node, message, unconverted=True)


def _share_rows(roles: Roles, plan: EditPlan) -> None:
    """A full-batch step over every row of fixed tensors (`roles.shared_rows`,
    `migrate.roles.full_batch`): right before its training loop this process's rows are bound
    (`input_rows = accelerator.share_selection(len(input))`) and the reads of the tensors in the
    statements that feed the loss select them (`model(input[input_rows])`, `criterion(out,
    target[input_rows])`); other uses (an evaluation) keep every row. A closure the optimizer steps
    returns the loss averaged over the processes (`accelerator.reduce(loss.detach(), "mean")`), so
    that LBFGS searches and stops alike on every process; its backward stays on the local loss."""
    shared = roles.shared_rows
    if shared is None:
        return
    if plan.target == "accelerate" or not roles.can_reach(shared.scope):
        _rows_left_whole(roles, plan)
        return
    stmt = statement(f"{shared.name} = accelerator.share_selection(len({shared.data[0]}))\n")
    plan.insert_before.setdefault(shared.before, []).append(stmt)
    for read in shared.reads:
        plan.row_reads[read] = shared.name
    if shared.closure_return is not None:
        plan.replace_small[shared.closure_return] = shared.closure_return.with_changes(
            value=cst.parse_expression(f'accelerator.reduce({shared.loss}.detach(), "mean")'))
    plan.use_accelerator(shared.scope)
    shown = ", ".join(f"`{n}`" for n in shared.data)
    plan.change(CODE, shared.before, (
        f"the step trains on this process's share of the rows of {shown} (`accelerator.share_selection`, a "
        "runtime extension): each process takes the mean loss over every N-th row, so N processes share the "
        "step's rows as a prepared DataLoader shares a dataset" + _PADDED
        + (f"; the closure returns the loss averaged over the processes, so the optimizer decides alike on "
           "every process" if shared.closure_return is not None else "")))


def _rows_left_whole(roles: Roles, plan: EditPlan) -> None:
    """The report of a step no DataLoader feeds, for fixed rows AM004 does not share."""
    shared = roles.shared_rows
    if shared is None:
        return
    message = shared.finding.message
    if plan.target == "accelerate":
        shown = ", ".join(f"`{n}`" for n in shared.data)
        split = "; ".join(f"`{n} = {n}[accelerator.process_index::accelerator.num_processes]`" for n in shared.data)
        message = (
            f"no DataLoader feeds this training step: it trains on every row of {shown} at once, alike on every "
            "process (N times the compute for one process's worth of data), and HF Accelerate has no call that "
            f"shares the rows out. Split them per process before the training loop: {split} (a mean loss over "
            "near-equal parts keeps the averaged gradient close to the whole data's)"
            + (f"; the closure must then return `accelerator.reduce({shared.loss}.detach(), \"mean\")`, so that "
               "the optimizer decides alike on every process" if shared.closure_return is not None else "")
            + f"; or migrate with `--target runtime`, which shares them with `accelerator.share_selection(len({shared.data[0]}))`")
    plan.report(CODE, shared.finding.node, message, unconverted=True)


def _batches_left_alike(roles: Roles, plan: EditPlan) -> None:
    """Batches a function of the file draws from torch's RNG (`roles.random_batches`) where no
    prepare call is inserted to seed the processes apart after: reported, as a step no DataLoader
    feeds is."""
    if roles.random_batches is None:
        return
    function = roles.random_batches[0]
    sites = [site for scope in roles.facts.scopes for site in scope.backwards]
    if not sites:
        return
    plan.report(CODE, sites[0].call, (
        f"no DataLoader feeds this training step: its batches come from `{function}()`, which draws them from "
        "torch's global RNG; seeded alike, every process would train on the same batches: seed each process "
        "differently once what must stay alike is drawn (`torch.manual_seed(seed + accelerator.process_index)` "
        "after the prepare call)"), unconverted=True)


def _seed_batches_per_rank(
    roles: Roles, plan: EditPlan, where: StmtRef | None, anchor: cst.BaseStatement, after: bool,
    seeds: list[tuple[Scope, LibraryCall]],
) -> None:
    """No DataLoader feeds the training step: its batches come from a function of the file that
    draws them from torch's global RNG (`get_batch()` over `torch.randn`), and what they are made
    from (a task drawn at the module level) is seeded alike on every process before it is drawn
    (`migrate.roles.loaders.random_batches`). Seeded alike, every process would draw the same
    batches: right after the prepare call the processes other than the main one seed apart, as a
    GAN's noise is. Reported instead when a seed or the task's draw may run after that point."""
    assert roles.random_batches is not None
    function, task = roles.random_batches
    home = roles.home
    assert home is not None
    torch_names = roles.facts.aliases.local_names_for("torch")
    late = [call for scope, call in seeds if not _runs_before(roles, scope, call.where, call.loops, where)]
    drawn_late = [b for b in task if not _runs_before(roles, roles.facts.module_scope, b.where, (), where)]
    if torch_names and not late and not drawn_late:
        torch_name = torch_names[0]
        stmt = cst.parse_statement(
            "if accelerator.process_index:\n"
            f"    {torch_name}.manual_seed({torch_name}.initial_seed() + accelerator.process_index)\n"
        )
        (plan.insert_after if after else plan.insert_before).setdefault(anchor, []).append(stmt)
        plan.change(CODE, anchor, (
            f"the training batches, drawn by `{function}()` from torch's global RNG, are drawn apart on each "
            "process: after the prepare call the processes other than the main one seed torch's RNG with "
            "`torch.initial_seed() + accelerator.process_index`"))
        return
    what = (f"`{cst.Module([]).code_for_node(late[0].call)}` may run after the prepare call" if late
            else f"`{drawn_late[0].name}`, which `{function}()` reads, is drawn after the prepare call")
    node = late[0].call if late else drawn_late[0].where.stmt
    plan.report(CODE, node, (
        f"no DataLoader feeds this training step: its batches come from `{function}()`, which draws them from "
        f"torch's global RNG, seeded alike on every process, so all of them would train on the same batches. "
        f"They were not seeded apart after the prepare call, since {what}: seed each process differently once "
        "what must stay alike is drawn (`torch.manual_seed(seed + accelerator.process_index)`)"), unconverted=True)


# Draws from torch's global RNG that pick the data: they must give every process the same result.
_SPLITS = frozenset({"torch.utils.data.random_split", "torch.utils.data.dataset.random_split"})


def _runs_before(
    roles: Roles, scope: Scope, at: StmtRef, loops: tuple[object, ...], prepare: StmtRef | None, depth: int = 0,
) -> bool:
    """The statement `at` of `scope` runs once, before the prepare call `prepare` of home: beside it
    and above it, at the module level of a script whose home is a function, or in a plain function
    of the file (`def set_seed(s): torch.manual_seed(s)`) every call of which runs so."""
    home = roles.home
    if loops or depth > 3:
        return False
    if scope is home:
        return prepare is not None and at.order < prepare.order
    if scope is roles.facts.module_scope:
        return True  # home is a function: the module's statements run when the script starts
    if not scope.is_function or scope.is_method:
        return False
    sites = [(caller, site) for caller in roles.facts.scopes for site in caller.calls
             if site.callee == scope.name and roles.facts.resolve(site.callee, caller) is scope]
    return bool(sites) and all(
        _runs_before(roles, caller, site.where, site.loops, prepare, depth + 1) for caller, site in sites
    )


def _reads_rank(call: cst.Call) -> bool:
    """`torch.manual_seed(seed + rank)`, `manual_seed(s + int(os.environ["RANK"]))`,
    `set_seed(args.seed + accelerator.process_index)`, `set_seed(seed, device_specific=True)`."""
    code = "".join(cst.Module([]).code_for_node(a) for a in call.args)
    return any(word in code.lower() for word in ("rank", "process_index", "device_specific"))


def _drawn_inputs(roles: Roles, scope: Scope) -> list[tuple[cst.Call, str]]:
    """(the draw, the model) for each call of a model in a training loop of `scope` whose only
    argument is drawn in that loop from torch's global RNG: inline, or a name the loop binds to
    the draw (its latest binding before the call)."""
    draws: dict[cst.Call, tuple[object, ...]] = {}
    for call in scope.library_calls:
        if call.qualified in _DRAWS and any(roles.is_training_loop(loop) for loop in call.loops) and not any(
            a.keyword is not None and a.keyword.value == "generator" for a in call.call.args
        ):
            draws[call.call] = call.loops
    if not draws:
        return []
    found: list[tuple[cst.Call, str]] = []
    for site in scope.calls:
        if not site.loops or not roles.all_in(scope, site.callee, roles.models):
            continue
        args = [a for a in site.call.args if a.keyword is None]
        if len(args) != 1 or args[0].star or len(site.call.args) != 1:
            continue
        value = args[0].value
        if type(value) is cst.Name:
            before = [b for b in scope.bindings.get(value.value, []) if b.where.order < site.where.order]
            if not before:
                continue
            latest = max(before, key=lambda b: b.where.order)
            value = latest.value
        if type(value) is cst.Call and value in draws and site.loops[-1] in draws[value]:
            if all(value is not seen for seen, _ in found):
                found.append((value, site.callee))
    return found


def _rewrap(plan: EditPlan, name: str, wrapped: WrappedOptimizer, anchor: cst.BaseStatement, after: bool) -> None:
    """`optimizer = ScheduledOptim(Adam(...), 8, 4)` -> `optimizer = Adam(...)`, prepared, then
    `optimizer = ScheduledOptim(optimizer, 8, 4)` right after the prepare call: the wrapper keeps
    its schedule and steps the prepared optimizer (which skips steps while accumulating and
    unscales fp16 gradients)."""
    stmt = wrapped.binding.where.stmt
    assert isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)
    assign = stmt.body[0]
    plan.replace_stmt[stmt] = [stmt.with_changes(body=[assign.with_changes(value=wrapped.inner)])]
    args = [cst.Arg(cst.Name(name), keyword=a.keyword, equal=a.equal, comma=a.comma) if a.value is wrapped.inner else a
            for a in wrapped.wrapper.args]
    targets = [target.deep_clone() for target in assign.targets]  # the first statement keeps the originals
    rewrapped = wrapped.wrapper.with_changes(args=args)
    again = cst.SimpleStatementLine([assign.with_changes(targets=targets, value=rewrapped)])
    (plan.insert_after if after else plan.insert_before).setdefault(anchor, []).append(again)
    plan.change(CODE, stmt, f"`{name}` prepared as the optimizer it wraps, then wrapped again after the prepare call")

