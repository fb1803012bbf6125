"""benchmarks/gpu_validation.py, the six-run GPU check of issue 12, prepared for a session with a
GPU: its runs span what the issue asks, and each fits an H100 as simpar prices it."""

import importlib.util
from pathlib import Path

from simpar.memory.model import memory_breakdown
from simpar.specs import JobSpec, Strategy, dgx_like
from simpar.specs.loaders import load_model

PATH = Path(__file__).parents[1] / "benchmarks" / "gpu_validation.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_validation", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_runs_span_the_issues_ranges_and_fit_an_h100():
    configs = _module().CONFIGS
    assert len(configs) >= 6
    assert {c[5] for c in configs} == {"none", "selective", "full"}
    assert min(c[2] for c in configs) == 2048 and max(c[2] for c in configs) == 8192
    assert min(c[3] for c in configs) == 1 and max(c[3] for c in configs) == 8
    h100 = dgx_like("h100-sxm").gpu
    for name, model_file, seq, mb, m, recompute in configs:
        model = load_model(str(PATH.parent / "data" / "h100_execpar" / model_file))
        assert 1e9 < model.total_params < 9e9, name
        s = Strategy(micro_batch=mb, recompute=recompute, stack="execpar")
        peak = memory_breakdown(model, JobSpec(seq, mb * m), s).total_gib
        assert peak < h100.hbm_gib * 0.95, (name, peak)
