"""Register the SwiftKV types with transformers' Auto classes at the moment those are imported.

``import swiftkv`` promises that ``AutoConfig`` / ``AutoModelForCausalLM`` know ``llama_swiftkv`` & co. Doing that
eagerly costs every ``import swiftkv`` (and every ``swiftkv --help``) the ~6 s import of torch and transformers.
Instead, ``install()`` registers right away where transformers' auto modules are already loaded, and otherwise
puts a finder on ``sys.meta_path`` that runs the registration right after
``transformers.models.auto.configuration_auto`` (configs) and ``...modeling_auto`` (models) finish loading — the
only ways to reach the Auto classes. Our own modules register at their end too (``swiftkv.configuration``,
``swiftkv.models``), so importing them directly is also enough.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys

logger = logging.getLogger(__name__)

# transformers module -> our module whose import registers what that transformers module needs
TARGETS = {
    "transformers.models.auto.configuration_auto": "swiftkv.configuration",
    "transformers.models.auto.modeling_auto": "swiftkv.models",
}


_done: set[str] = set()  # our modules that finished importing (they call ``done`` at their end)
_pending: set[str] = set()  # registrations that had to wait for one of our modules to finish importing


def _register(ours: str) -> None:
    if ours in sys.modules:  # imported or being imported: it registers itself at its end
        return
    if any(name in sys.modules and name not in _done for name in TARGETS.values()):
        _pending.add(ours)  # one of ours is mid-import (it imported transformers): import ``ours`` once it is done
        return
    try:
        importlib.import_module(ours)
    except ImportError as err:  # another transformers than the model classes were written for (the vLLM venv)
        logger.debug("SwiftKV: %s unavailable, not registered: %s", ours, err)


def done(name: str) -> None:
    """Called at the end of ``swiftkv.configuration`` and ``swiftkv.models``: run what waited for them."""
    _done.add(name)
    for ours in sorted(_pending):
        _pending.discard(ours)
        _register(ours)


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, loader, ours: str):
        self.loader, self.ours = loader, ours

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _register(self.ours)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        ours = TARGETS.get(fullname)
        if ours is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RegisteringLoader(spec.loader, ours)
        return spec


def install() -> None:
    """Register now for what transformers has loaded; watch for the rest (idempotent)."""
    for theirs, ours in TARGETS.items():
        if theirs in sys.modules:
            _register(ours)
    if any(t not in sys.modules for t in TARGETS) and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
