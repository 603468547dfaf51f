"""kiln.jit(module): a torch.nn.Module that is the original module with its forward compiled.

The wrapper shares the original's state: its `_parameters`, `_buffers` and `_modules` dicts
and its hooks are the original's own objects, and its training flag is the original's. So
`state_dict()` has the original's keys, `parameters()` yields the original's tensors,
`.train()`, `.eval()`, `.to()` and `load_state_dict` change the original, and a change made
through the original is seen by the wrapper. Calls run the module's hooks, then the compiled
`forward`, whose parameters and buffers are implicit inputs read on every call (kiln._state).

    m = torch.nn.BatchNorm1d(4)
    jm = kiln.jit(m)
    jm(x)          # running_mean, running_var, num_batches_tracked of m updated as eager does
    jm.eval()      # m.training is False; the next call compiles the eval program
"""

from __future__ import annotations

from typing import Any

import torch

from ._jit import JitFunction


class JitModule(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, fallback: bool = True) -> None:
        if isinstance(module, JitModule):
            module = module._kiln_module
        mode = module.training
        object.__setattr__(self, "_kiln_module", module)
        super().__init__()
        # Module.__init__ made empty state dicts: use the original's instead (its parameters,
        # buffers, children and hooks), so both objects are views of one module.
        for key in list(self.__dict__):
            if key in module.__dict__ and key != "training":
                self.__dict__[key] = module.__dict__[key]
        module.training = mode
        object.__setattr__(self, "_kiln_forward", JitFunction(module.forward, fallback, module))
        object.__setattr__(self, "_kiln_ready", True)

    # The training flag is the original's (train() and eval() set it on self, then children).
    @property
    def training(self) -> bool:  # type: ignore[override]
        return self._kiln_module.training

    @training.setter
    def training(self, mode: bool) -> None:
        if self.__dict__.get("_kiln_ready"):
            self._kiln_module.training = mode

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._kiln_forward(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._kiln_module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # Parameters, buffers and submodules go into the shared dicts (Module.__setattr__);
        # any other attribute is the original's, which its forward reads.
        if not self.__dict__.get("_kiln_ready") or name == "training":
            super().__setattr__(name, value)
        elif isinstance(value, (torch.nn.Parameter, torch.nn.Module)) or name in self._buffers:
            super().__setattr__(name, value)
        else:
            setattr(self._kiln_module, name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._parameters or name in self._buffers or name in self._modules:
            super().__delattr__(name)
        else:
            delattr(self._kiln_module, name)

    def extra_repr(self) -> str:
        return self._kiln_module.extra_repr()

    def _get_name(self) -> str:
        return f"kiln.jit({self._kiln_module._get_name()})"
