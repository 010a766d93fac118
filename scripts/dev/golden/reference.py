"""What the golden scripts share about a reference checkout: its commit, its packages imported from
their source folders (nothing installed), and stand-ins for Python packages the reference imports
but the golden scripts do not run (transformers, flash_attn, tqdm...)."""
import subprocess
import sys
import types
from pathlib import Path

# The transformers modules kvpress imports at load time (its model-specific presses).
KVPRESS_TRANSFORMERS = ("transformers.models", "transformers.models.llama", "transformers.models.llama.modeling_llama",
                        "transformers.models.gemma3", "transformers.models.gemma3.modeling_gemma3",
                        "transformers.models.phi3", "transformers.models.phi3.modeling_phi3",
                        "transformers.models.qwen3", "transformers.models.qwen3.modeling_qwen3")


class StandIn(types.ModuleType):
    """A module whose every attribute is an empty class (names imported but not used here)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, cls)
        return cls


def commit_of(checkout):
    """The checkout's git commit, or "unknown"."""
    out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def source_packages(checkout, names):
    """Makes each dotted package name importable from its folder in the checkout (a.b -> a/b),
    without running the package's __init__.py."""
    for name in names:
        package = types.ModuleType(name)
        package.__path__ = [str(Path(checkout) / name.replace(".", "/"))]
        sys.modules[name] = package


def kvzap_stand_ins(kvpress, packages, others=()):
    """Stand-ins for what kvpress's KVzap code imports: transformers (PretrainedConfig holding its
    keyword arguments, PreTrainedModel as a torch module; kvpress's model-specific modules empty),
    `others` empty; then the checkout's `packages` importable (source_packages)."""
    import torch

    class PretrainedConfig:
        def __init__(self, **kwargs):
            for k, v in kwargs.items():
                setattr(self, k, v)

    class PreTrainedModel(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config

    transformers = StandIn("transformers")
    transformers.PretrainedConfig = PretrainedConfig
    transformers.PreTrainedModel = PreTrainedModel
    sys.modules["transformers"] = transformers
    for name in KVPRESS_TRANSFORMERS + tuple(others):
        sys.modules[name] = StandIn(name)
    source_packages(kvpress, packages)
