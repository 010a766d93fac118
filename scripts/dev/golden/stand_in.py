"""Stand-ins for Python packages a reference implementation imports but the golden scripts do not
run (transformers, flash_attn): used by official.py, kvpress.py and kvpress_kvzip.py."""
import types


class StandIn(types.ModuleType):
    """A module whose every attribute is an empty class (names imported but not used here)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, cls)
        return cls
