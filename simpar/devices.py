"""The device a measurement asks for, checked before any process starts (torch is
imported only here and only when CUDA is asked for: simpar itself runs without torch)."""

from __future__ import annotations

import importlib.util
import os

from simpar.errors import SpecError


def check_device(device: str | None) -> None:
    """Refuse, in one line, a run on `device` where torch is missing (every device runs
    execpar), or --device cuda where this torch sees no CUDA device. Only CUDA needs torch
    loaded to answer: finding it installed is enough for the others (loading it took the
    launcher most of a second before every torchrun)."""
    if importlib.util.find_spec("torch") is None:
        raise SpecError("--device", device, "runs execpar, which needs torch: pip install -e "
                        "'.[exec]'")
    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        cuda = torch.version.cuda
        build = f"CUDA {cuda}, no device visible" if cuda else "built without CUDA"
        raise SpecError(
            "--device", device,
            f"torch {torch.__version__} here is {build}; use --device cpu or run it on a GPU node")


# Past this many CPU processes per core a gloo calibration mostly waits for the scheduler.
MAX_PROCESSES_PER_CORE = 2


def oversubscribed(nproc: int, device: str | None, cores: int | None = None) -> str | None:
    """The warning for more CPU processes than this machine has cores (each measured rate would
    include the sharing), or None. A CUDA run has one device per process and is not checked here."""
    if device == "cuda":
        return None
    if device is None:  # the default is cuda where there is one
        try:
            import torch
        except ImportError:
            return None
        if torch.cuda.is_available():
            return None
    cores = cores or len(os.sched_getaffinity(0))
    if nproc <= cores:
        return None
    if nproc > MAX_PROCESSES_PER_CORE * cores:
        raise SpecError("--nproc-per-node", nproc,
                        f"{nproc} processes on {cores} CPU cores would run for minutes and measure "
                        f"mostly their own sharing; give at most {cores}")
    return (
        f"warning: --nproc-per-node {nproc} on {cores} CPU cores: processes share cores, so the "
        f"measured rates include the sharing; give at most {cores} for a profile of this machine")


# The catalog GPU a CUDA device name (torch.cuda.get_device_name) stands for: the first entry
# whose key the name contains, so each longer name comes before the one it contains (an "NVIDIA
# GH200 480GB" also contains "H200", a "GB200" "B200").
DEVICE_NAMES = (("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"), ("GH200", "gh200"),
                ("H200", "h200"), ("A100-SXM4-40GB", "a100-40gb"), ("A100", "a100-80gb"),
                ("GB200", "gb200"), ("GB300", "gb300"), ("B300", "b300"), ("B200", "b200"))


def catalog_gpu(device_name: str) -> str | None:
    """The catalog GPU a device name stands for, or None for one the catalog lacks."""
    return next((gpu for key, gpu in DEVICE_NAMES if key in device_name), None)
