"""A package's names that load on first use (PEP 562), so that importing one part of fsdp_mini does not
import the others: `import fsdp_mini.fsdp` loads the two FSDP designs, and neither the launcher, the
checkpoints nor tensor parallelism, although `fsdp_mini` exports them all."""
from __future__ import annotations

import importlib


def lazy_exports(package: str, exports: dict[str, str]):
    """The module-level `__getattr__` and `__dir__` of `package`. `exports` maps each name to where it
    lives, as entry points are written: "module:name" for a name defined in a module, "module" for a module."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = exports[name].partition(":")
        value = importlib.import_module(module)
        return getattr(value, attr) if attr else value

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
