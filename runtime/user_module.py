"""What makes a prepared model look like the user's own module from the outside.

``prepare(model)`` may return a wrapper (``PreparedDDP`` on several processes, ``AutocastModule``
for fp16/bf16 on one) or the user's module itself. Code the codemod never rewrites (a project's
``save_checkpoint`` helper, a sibling ``test.py``, ``torch.jit.trace``, a module-level
``load_state_dict(..., strict=True)``) must see the same thing in every case, so that a checkpoint
or a pickled model is interchangeable with the original script's on any number of processes:

* ``state_dict()`` has the user's keys (no ``module.`` prefix); ``load_state_dict()`` takes the
  user's keys and also ``module.``-prefixed ones (a checkpoint of a hand-written DDP script);
* ``named_parameters()``, ``named_buffers()``, ``named_modules()``, ``children()`` and
  ``named_children()`` give the user's names and objects;
* ``torch.save(model)``, ``pickle`` and ``copy.deepcopy`` give (a copy of) the user's module,
  which loads in a process without a process group or this runtime;
* ``.module`` of a wrapper is the user's module;
* a container model (``nn.Sequential``, or a class of the user's built on ``nn.ModuleList`` /
  ``nn.ModuleDict``) is indexed, sliced, measured and iterated as the user's: ``model[0].weight``,
  ``model[-1]``, ``len(model)``, ``for layer in model``; ``bool(model)`` is the module's (an
  empty ``nn.Sequential`` stays falsy, any other module truthy). These are special methods,
  which Python looks up on the class, never through ``__getattr__``: without them a DDP
  wrapper answers ``model[0]`` with "'PreparedDDP' object is not subscriptable" on N processes
  only. On a module that is no container they raise the TypeError the module itself raises.

A state dict of a wrapper is a ``UserStateDict``: the user's keys, and a lookup of DDP's
``module.<key>`` still finds ``<key>``, because code written for a DDP model builds such keys
itself (timm's ``ModelEma.update``: ``msd["module." + k]`` when the model has ``.module``).
``prepare`` does not give the bare module (one process) a ``.module`` of its own: that module
would then be its own ``.module``, which turns the same ``hasattr(model, "module")`` tests into
``module.`` lookups on a plain state dict (KeyError), and recursive unwrapping
(``while hasattr(m, "module"): m = m.module``) into an endless loop.

Lightning Fabric's ``_FabricModule`` does the same for state dicts and attribute access; HF
Accelerate returns the plain DDP wrapper (``module.`` keys, pickles as DDP).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any, Callable

import torch
import torch.jit._trace
from torch import nn

PREFIX = "module."


class AcceptWrapperKeys:
    """Load-state-dict pre-hook of the user's module: drop DDP's ``module.`` prefix from the keys.

    ``prepare`` registers it on the user's module (whether it returns a wrapper or the module
    itself), so ``model.load_state_dict(checkpoint, strict=True)`` takes a checkpoint of the
    original single-device script (the user's keys) and one of a hand-written DDP script
    (``module.`` keys) on any number of processes. The prefix is removed only when every key
    under the module's prefix carries it and the stripped keys match the module better than the
    keys as saved: a module that has a submodule named ``module`` keeps its own ``module.`` keys.

    torch calls it inside ``load_state_dict`` on the dict torch copied, before any key is read;
    renaming keys (and ``_metadata``, which per-module versions come from) in place is what the
    loading of the module and its children then sees.

    Pickled (``torch.save(model)``, ``copy.deepcopy``), the hook becomes ``"".format``, a builtin
    that accepts the hook's arguments and does nothing, so the saved module loads where this
    runtime is not installed.
    """

    def __call__(self, module: nn.Module, state_dict: dict[str, Any], prefix: str,
                 *_: Any) -> None:
        head = prefix + PREFIX
        keys = [key for key in state_dict if key.startswith(prefix)]
        if not keys or not all(key.startswith(head) for key in keys):
            return
        expected = {prefix + key for key in module.state_dict(keep_vars=True)}
        stripped = {key: prefix + key[len(head):] for key in keys}
        if len(expected.intersection(stripped.values())) <= len(expected.intersection(keys)):
            return
        for old, new in stripped.items():
            state_dict[new] = state_dict.pop(old)
        metadata = getattr(state_dict, "_metadata", None)
        if metadata is not None:
            for name in [n for n in metadata if n == head[:-1] or n.startswith(head)]:
                metadata[prefix + name[len(head):] if name != head[:-1] else prefix[:-1]] = metadata[name]

    def __reduce__(self) -> tuple[Any, ...]:
        return (getattr, ("", "format"))


def accept_wrapper_keys(module: nn.Module) -> None:
    """Register ``AcceptWrapperKeys`` on ``module`` once."""
    hooks = module._load_state_dict_pre_hooks.values()
    if not any(isinstance(getattr(hook, "hook", hook), AcceptWrapperKeys) for hook in hooks):
        module.register_load_state_dict_pre_hook(AcceptWrapperKeys())


class UserStateDict(OrderedDict):  # type: ignore[type-arg]
    """A state dict with the user's keys where ``sd["module." + key]`` also finds ``sd[key]``.

    Only a lookup that misses tries the alias (``__missing__``): iteration, ``keys()``, ``in``
    and ``len`` see the user's keys alone. Pickled (``torch.save(model.state_dict())``) and
    deep-copied it is a plain ``OrderedDict`` with the same ``_metadata``, so the file loads with
    ``weights_only=True`` and without this runtime.
    """

    def __missing__(self, key: Any) -> Any:
        if isinstance(key, str) and key.startswith(PREFIX) and dict.__contains__(self, key[len(PREFIX):]):
            return self[key[len(PREFIX):]]
        raise KeyError(key)

    def __reduce__(self) -> tuple[Any, ...]:
        return (OrderedDict, (), vars(self) or None, None, iter(self.items()))


class ForwardsToUserModule:
    """Mixin for an ``nn.Module`` wrapper whose ``self.module`` is the user's module.

    Put it first among the bases, so that its methods win over ``nn.Module``'s (and DDP's). The
    wrapper keeps its own ``_modules`` (``{"module": user_module}``): torch's own machinery that
    walks ``_modules`` directly (DDP's reducer, ``nn.Module.__repr__``, ``to()`` through
    ``_apply`` below) still finds the user's module there.
    """

    module: nn.Module

    # -- state dicts ------------------------------------------------------------------------------

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The user's module's ``state_dict`` (its own keys; no ``module.`` prefix), as a
        ``UserStateDict`` unless the caller passes its own ``destination``."""
        if not args and kwargs.get("destination") is None:
            kwargs["destination"] = UserStateDict()
            kwargs["destination"]._metadata = OrderedDict()
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> Any:
        """Load the user's keys, or a ``module.``-prefixed dict saved through DDP (the user's
        module's ``AcceptWrapperKeys`` hook drops the prefix)."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    # -- introspection: the user's names ----------------------------------------------------------

    def named_modules(self, memo: set[nn.Module] | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, nn.Module]]:
        return self.module.named_modules(memo, prefix, remove_duplicate)

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, nn.Parameter]]:
        return self.module.named_parameters(prefix, recurse, remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Any]]:
        return self.module.named_buffers(prefix, recurse, remove_duplicate)

    def named_children(self) -> Iterator[tuple[str, nn.Module]]:
        if torch.jit._trace._trace_module_map is not None:
            # torch.jit.trace is recording scope names: they must follow the real _modules
            # hierarchy (wrapper -> module -> ...), or the trace fails with "unordered_map::at".
            return nn.Module.named_children(self)  # type: ignore[arg-type]
        return self.module.named_children()

    def children(self) -> Iterator[nn.Module]:
        return self.module.children()

    # -- a container model: indexing, length, iteration (special methods skip __getattr__) --------

    def __getitem__(self, index: Any) -> Any:
        return self.module[index]  # type: ignore[index]

    def __len__(self) -> int:
        return len(self.module)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.module)  # type: ignore[call-overload]

    def __bool__(self) -> bool:
        # Defined because __len__ is: truth must not call len() on a module that has none.
        return bool(self.module)

    # -- nn.Module methods that walk children(): walk the real submodule instead ------------------
    # (nn.Module.train/_apply/apply iterate self.children(), which now skips the user's root.)

    def train(self, mode: bool = True) -> Any:
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        self.module.train(mode)
        return self

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> Any:
        if recurse:
            self.module._apply(fn)
        return nn.Module._apply(self, fn, recurse=False)  # type: ignore[arg-type]

    def apply(self, fn: Callable[[nn.Module], None]) -> Any:
        self.module.apply(fn)
        fn(self)  # type: ignore[arg-type]
        return self

    # -- pickling ---------------------------------------------------------------------------------

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle (``torch.save(model)``) and ``copy.deepcopy`` as the user's module itself."""
        # max() of a one-element tuple is that element: a builtin that unpickles (and deep
        # copies) to the user's module alone, so loading needs neither the runtime nor the wrapper.
        # (Returning the module's own reduce tuple is refused by pickle: the class differs.)
        return (max, ((self.module,),))
