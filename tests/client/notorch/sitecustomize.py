"""On PYTHONPATH, makes ``import torch`` fail: a device without PyTorch, for the torch-free tests."""

import sys


class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} is not installed on this device (tests/client/notorch)")


sys.meta_path.insert(0, _NoTorch())
