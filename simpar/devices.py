"""The device a measurement asks for, checked before any process starts (torch is imported only here and
only when CUDA is asked for: simpar itself runs without torch)."""

from __future__ import annotations

from simpar.errors import SpecError


def check_device(device: str | None) -> None:
    """Refuse --device cuda where this torch sees no CUDA device (or torch is missing), in one line."""
    if device != "cuda":
        return
    try:
        import torch
    except ImportError:
        raise SpecError("--device", device, "needs torch: pip install -e '.[exec]'") from None
    if not torch.cuda.is_available():
        build = "built without CUDA" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no device visible"
        raise SpecError("--device", device, f"torch {torch.__version__} here is {build}; use --device cpu or run it "
                        "on a GPU node")
