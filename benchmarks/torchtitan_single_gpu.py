"""torchtitan's own trainer on one device, on Llama-3-style models of our sizes: the reference
that simpar's single-GPU predictions are compared with.

For each configuration (model, sequence length, local batch, activation checkpointing) this runs
torchtitan's real training loop (`torchtitan.train.main(Trainer)`, in a child process set up as
`torchrun --nproc-per-node 1` would set it up) for `--steps` steps, logging every step, and
keeps its per-step metric lines (`step: N  loss: ..  memory: ..GiB(..%)  tps: ..  tflops: ..
mfu: ..%`). What torchtitan does by itself on one device is kept: fp32 parameters with bf16
autocast (no FSDP at world size 1, so torchtitan's AMP path), fused AdamW, SDPA attention, no
compile, no float8. Only these are ours, registered at run time:

- the model flavors (`m1b`, `m3b`, `m8b4l`; entries added to `torchtitan.models.llama3.
  llama3_args`), each checked by building it on the meta device and reading w1's shape;
- a synthetic dataset (`synthetic`, in torchtitan's dataset registry): random words of a local
  word-level tokenizer whose vocabulary is the model's (128256), written under --out, so
  nothing is downloaded and the output layer and the loss have the real size.

Output, per configuration ID: `OUT/ID.log` (the console output) and `OUT/ID.json` (versions,
device, model and run configuration, torchtitan's whole job config, the parsed metric lines,
medians over the steps after the first 3, peak memory, or the error), and one summary line
`ID  ok  tps ..  step_s ..  mfu ..%  mem ..GiB` on stdout. Each configuration runs under its own
`--timeout`; one failing does not stop the others.

On the device machine (repository root as the working directory, .whl carried): 20-25 s a
configuration on an H200, 26-34 s compiled (2026-11-26; reports/torchtitan-h200):

  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
  python3 benchmarks/torchtitan_single_gpu.py --out /tmp/tt

The wheels, fetched here for CPython 3.12 (pip download --no-deps --only-binary=:all:
--python-version 3.12 -d .whl NAME==VERSION): torchtitan 0.2.2 (the release of torch 2.10/2.11's
time; 0.3.0 needs spmd_types, torch_checkpointing and wandb besides) and what it imports that a
torch image with tokenizers, tensorboard, einops, pyarrow, pandas, huggingface-hub and requests
lacks: torchdata 0.11.0, datasets 4.8.5 (dill 0.4.1, multiprocess 0.70.19), tyro 1.0.17
(docstring-parser 0.18.0, typeguard 4.6.1); the image has httpx, httpcore, h11 and anyio. No
tomli: torchtitan reads TOML with tomllib on 3.11+. Should `datasets` still not
import there, a list-backed stand-in takes its place (the JSON says which was used).

Here, without a GPU, the same plumbing on a tiny model (gloo, CPU; Triton's absence is bridged):

  python3 benchmarks/torchtitan_single_gpu.py --out /tmp/tt-cpu --small --device cpu
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import types
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DATASET = "synthetic"
WARMUP_STEPS = 3  # logged steps left out of the medians
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_METRICS = re.compile(
    r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>\S+)"
    r".*?memory:\s*(?P<mem>[\d.]+)GiB\((?P<mem_pct>[\d.]+)%\)"
    r".*?tps:\s*(?P<tps>[\d,]+)"
    r"(?:.*?tflops:\s*(?P<tflops>[\d,.]+))?"
    r"(?:.*?mfu:\s*(?P<mfu>[\d.]+)%)?"
)


@dataclass(frozen=True)
class Flavor:
    """A Llama-3 model in torchtitan's terms (TransformerModelArgs), with the FFN width that
    dim, multiple_of and ffn_dim_multiplier must give."""

    name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    multiple_of: int
    ffn_dim_multiplier: float | None
    vocab_size: int = 128256
    rope_theta: float = 500000.0

    def model_args(self) -> dict[str, Any]:
        return {
            "dim": self.dim, "n_layers": self.n_layers, "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads, "vocab_size": self.vocab_size,
            "multiple_of": self.multiple_of, "ffn_dim_multiplier": self.ffn_dim_multiplier,
            "rope_theta": self.rope_theta,
        }


# FFN width in torchtitan: h = int(2 * 4 * dim / 3); h = int(mult * h); round h up to multiple_of.
FLAVORS = {f.name: f for f in (
    Flavor("m1b", 2048, 16, 32, 8, 8192, multiple_of=256, ffn_dim_multiplier=1.5),
    Flavor("m3b", 3072, 28, 24, 8, 8192, multiple_of=256, ffn_dim_multiplier=1.0),
    Flavor("m8b4l", 4096, 4, 32, 8, 14336, multiple_of=1024, ffn_dim_multiplier=1.3),
    Flavor("tiny", 256, 2, 8, 4, 768, multiple_of=256, ffn_dim_multiplier=None,
           vocab_size=1024),
)}


@dataclass(frozen=True)
class RunConfig:
    id: str
    flavor: str
    seq_len: int
    batch: int
    ac: str  # none | selective-op | full
    compile: bool = False  # torchtitan's --compile.enable: each block and the loss

    def small(self) -> RunConfig:
        """The same plumbing (activation checkpointing included) on the tiny model."""
        return RunConfig(f"{self.id}-small", "tiny", min(self.seq_len, 256), min(self.batch, 2),
                         self.ac, self.compile)

    def compiled(self) -> RunConfig:
        return dataclasses.replace(self, id=f"{self.id}-compile", compile=True)


EAGER = (
    RunConfig("tt-1b-s2k-mb8", "m1b", 2048, 8, "none"),
    RunConfig("tt-1b-s4k-mb4-sel", "m1b", 4096, 4, "selective-op"),
    RunConfig("tt-3b-s8k-mb1-full", "m3b", 8192, 1, "full"),
    RunConfig("tt-8b4l-s4k-mb2", "m8b4l", 4096, 2, "none"),
)
# the same runs compiled (IDs ending -compile): not run unless named in --configs
CONFIGS = {c.id: c for c in EAGER + tuple(c.compiled() for c in EAGER)}


# ---------------------------------------------------------------- the parent: runs and parsing


def torchtitan_args(cfg: RunConfig, steps: int, out: Path, tokenizer_dir: Path,
                    device: str) -> list[str]:
    """torchtitan's command line for one run (what `torchrun -m torchtitan.train` would get)."""
    ac = {"none": ["--activation_checkpoint.mode", "none"],
          "full": ["--activation_checkpoint.mode", "full"],
          "selective-op": ["--activation_checkpoint.mode", "selective",
                           "--activation_checkpoint.selective_ac_option", "op"]}[cfg.ac]
    return [
        "--job.description", cfg.id,
        "--job.dump_folder", str(out / f"{cfg.id}.dump"),
        "--model.name", "llama3",
        "--model.flavor", cfg.flavor,
        "--model.hf_assets_path", str(tokenizer_dir),
        "--training.dataset", DATASET,
        "--training.local_batch_size", str(cfg.batch),
        "--training.seq_len", str(cfg.seq_len),
        "--training.steps", str(steps),
        "--training.mixed_precision_param", "bfloat16",
        "--optimizer.name", "AdamW",
        "--optimizer.implementation", "fused" if device == "cuda" else "foreach",
        "--lr_scheduler.warmup_steps", "2",
        "--metrics.log_freq", "1",
        "--metrics.disable_color_printing",
        *ac,
        *(["--compile.enable"] if cfg.compile else []),
    ]


def build_tokenizer(directory: Path, vocab_size: int) -> Path:
    """A word-level tokenizer of exactly `vocab_size` tokens (w0, w1, .., then <unk>, BOS and
    EOS), as tokenizer.json and tokenizer_config.json, which torchtitan's HF tokenizer reads."""
    if (directory / "tokenizer.json").exists():
        return directory
    tokenizers = importlib.import_module("tokenizers")
    words = [f"w{i}" for i in range(vocab_size - 3)]
    vocab = {w: i for i, w in enumerate([*words, "<unk>", "<|begin_of_text|>",
                                         "<|end_of_text|>"])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": True}))
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(device: str, out: Path) -> dict[str, str]:
    """The environment torchrun gives a single process, plus what torchtitan's run_train.sh
    sets, and no network for the HF libraries."""
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONUNBUFFERED="1", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_DATASETS_CACHE=str(out / "hf-cache"), TOKENIZERS_PARALLELISM="false")
    env.setdefault("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "2")
    return env


def run_child(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> str | None:
    """Runs `cmd` with its output in `log`; returns None, or why it failed. On timeout the
    child's whole process group (its own session) is killed."""
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"timeout after {timeout:.0f} s"
    return None if rc == 0 else f"exit code {rc}"


def parse_metrics(log: str) -> list[dict[str, Any]]:
    """torchtitan's per-step metric lines (validation lines left out)."""
    rows = []
    for line in _ANSI.sub("", log).splitlines():
        m = _METRICS.search(line)
        if not m or "validate step" in line:
            continue
        g = m.groupdict()
        rows.append({
            "step": int(g["step"]), "loss": _num(g["loss"]), "memory_gib": float(g["mem"]),
            "memory_pct": float(g["mem_pct"]), "tps": float(g["tps"].replace(",", "")),
            "tflops": _num(g["tflops"]), "mfu_pct": _num(g["mfu"])})
    return rows


def merge_logged_metrics(rows: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """Adds the step time, data loading time and active memory that torchtitan computed for
    each step (record_metrics) to the console's rows."""
    keys = {"time_metrics/end_to_end(s)": "end_to_end_s",
            "time_metrics/data_loading(s)": "data_loading_s",
            "time_metrics/data_loading(%)": "data_loading_pct",
            "memory/max_active(GiB)": "max_active_gib"}
    logged = {}
    if path.exists():
        for line in path.read_text().splitlines():
            d = json.loads(line)
            logged[d["step"]] = {new: d.get(old) for old, new in keys.items()}
    return [{**r, **logged.get(r["step"], {})} for r in rows]


def _num(text: str | None) -> float | None:
    try:
        return float(text.replace(",", "")) if text is not None else None
    except ValueError:
        return None


def summarize(rows: list[dict[str, Any]], cfg: RunConfig) -> dict[str, Any]:
    """Medians over the steps after the first WARMUP_STEPS, and the peak memory (reserved, as
    the console prints it, and active)."""
    kept = [r for r in rows if r["step"] > WARMUP_STEPS]
    if not kept:
        return {"steps_kept": 0}

    def median_of(key: str) -> float | None:
        values = [float(r[key]) for r in kept if r.get(key) is not None]
        return statistics.median(values) if values else None

    def peak_of(key: str) -> float | None:
        return max((float(r[key]) for r in rows if r.get(key) is not None), default=None)

    tps = median_of("tps")
    return {
        "steps_kept": len(kept),
        "median_tps": tps,
        "median_step_s": cfg.seq_len * cfg.batch / tps if tps else None,
        "median_end_to_end_s": median_of("end_to_end_s"),
        "median_data_loading_pct": median_of("data_loading_pct"),
        "median_mfu_pct": median_of("mfu_pct"),
        "median_tflops": median_of("tflops"),
        "peak_memory_gib": peak_of("memory_gib"),
        "peak_active_gib": peak_of("max_active_gib"),
    }


def run_one(cfg: RunConfig, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    flavor = FLAVORS[cfg.flavor]
    tokenizer_dir = build_tokenizer(out / f"tokenizer-{flavor.vocab_size}", flavor.vocab_size)
    tt_args = torchtitan_args(cfg, args.steps, out, tokenizer_dir, args.device)
    meta_path, metrics_path = out / f"{cfg.id}.meta.json", out / f"{cfg.id}.metrics.jsonl"
    meta_path.unlink(missing_ok=True)
    metrics_path.unlink(missing_ok=True)
    spec = {"flavor": asdict(flavor), "device": args.device, "meta": str(meta_path),
            "metrics": str(metrics_path), "torchtitan_args": tt_args}
    log = out / f"{cfg.id}.log"
    start = time.perf_counter()
    error = run_child([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                      child_env(args.device, out), log, args.timeout)
    text = log.read_text(errors="replace")
    rows = merge_logged_metrics(parse_metrics(text), metrics_path)
    amp = [ln.split(" - ")[-1] for ln in text.splitlines() if "Mixed precision training" in ln]
    result: dict[str, Any] = {
        "id": cfg.id, "ok": error is None and len(rows) >= args.steps, "error": error,
        "wall_s": round(time.perf_counter() - start, 1),
        "config": {**asdict(cfg), "model": asdict(flavor)},
        "torchtitan_args": tt_args, "mixed_precision": amp[-1] if amp else None,
        **(json.loads(meta_path.read_text()) if meta_path.exists() else {}),
        "summary": summarize(rows, cfg), "steps": rows,
    }
    if error is None and not result["ok"]:
        result["error"] = f"{len(rows)} metric lines for {args.steps} steps"
    if result["error"]:
        result["log_tail"] = log.read_text(errors="replace").splitlines()[-40:]
    (out / f"{cfg.id}.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def summary_line(r: dict[str, Any]) -> str:
    s = r.get("summary", {})
    if not r["ok"] and not s.get("steps_kept"):
        return f"{r['id']}  FAILED  {r['error']}  ({r['wall_s']} s)"

    def fmt(key: str, spec: str) -> str:
        return "n/a" if s.get(key) is None else format(s[key], spec)

    status = "ok" if r["ok"] else f"PARTIAL ({r['error']})"
    return (f"{r['id']}  {status}  tps {fmt('median_tps', ',.0f')}  step_s "
            f"{fmt('median_step_s', '.4f')}  mfu {fmt('median_mfu_pct', '.2f')}%  mem "
            f"{fmt('peak_memory_gib', '.2f')}GiB  ({r['wall_s']} s)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS),
                   default=[c.id for c in EAGER])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--small", action="store_true", help="the tiny model, same plumbing")
    p.add_argument("--timeout", type=float, default=90.0, help="seconds per configuration")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ok = True
    for cid in args.configs:
        cfg = CONFIGS[cid].small() if args.small else CONFIGS[cid]
        try:
            result = run_one(cfg, args, args.out)
        except Exception as e:  # noqa: BLE001 - one configuration must not stop the others
            result = {"id": cfg.id, "ok": False, "error": f"{type(e).__name__}: {e}",
                      "wall_s": 0.0, "config": asdict(cfg)}
            (args.out / f"{cfg.id}.json").write_text(json.dumps(result, indent=1))
        ok &= bool(result["ok"])
        print(summary_line(result), flush=True)
    return 0 if ok else 1


# ---------------------------------------------------------------- the child: torchtitan itself


def stub_moe_kernels_without_triton() -> None:
    """torchtitan imports its MoE Triton kernels at import time; a CPU-only torch has no Triton.
    The dense Llama never calls them, so on CPU a stand-in module takes their place."""
    if importlib.util.find_spec("triton") is not None:
        return
    name = "torchtitan.models.moe.kernels"
    stub = types.ModuleType(name)

    def generate_permute_indices(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("MoE kernels need Triton")

    stub.generate_permute_indices = generate_permute_indices  # type: ignore[attr-defined]
    sys.modules[name] = stub


class _CpuDevice:
    """What torchtitan asks of `torch.cuda` (its device module), answered for the CPU; memory
    is the process's peak resident set."""

    @staticmethod
    def _peak_rss() -> int:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def set_device(self, device: Any) -> None: ...
    def current_device(self) -> int: return 0
    def get_device_name(self, device: Any = None) -> str: return "CPU"
    def reset_peak_memory_stats(self, device: Any = None) -> None: ...
    def empty_cache(self) -> None: ...
    def synchronize(self, device: Any = None) -> None: ...
    def device_count(self) -> int: return 1

    def get_device_properties(self, device: Any = None) -> Any:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return types.SimpleNamespace(total_memory=total, name="CPU")

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        peak = self._peak_rss()
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak,
                "num_alloc_retries": 0, "num_ooms": 0}


def use_cpu_device() -> None:
    """torchtitan picks CUDA when no accelerator is found; point it (and the modules that copied
    its choice at import) at the CPU, whose default process-group backend is gloo."""
    device = _CpuDevice()
    for name in ("torchtitan.tools.utils", "torchtitan.components.metrics",
                 "torchtitan.distributed.utils", "torchtitan.distributed.parallel_dims",
                 "torchtitan.tools.profiling"):
        module = importlib.import_module(name)
        for attr, value in (("device_type", "cpu"), ("device_module", device)):
            if hasattr(module, attr):
                setattr(module, attr, value)


def register_flavor(flavor: dict[str, Any]) -> dict[str, Any]:
    """Adds the flavor to torchtitan's llama3 registry and builds it on the meta device to check
    the FFN width; returns what was checked."""
    import torch

    llama3 = importlib.import_module("torchtitan.models.llama3")
    f = Flavor(**flavor)
    llama3.llama3_args[f.name] = llama3.TransformerModelArgs(**f.model_args())
    with torch.device("meta"):
        model = llama3.Transformer(dataclasses.replace(llama3.llama3_args[f.name]))
    w1 = tuple(model.layers["0"].feed_forward.w1.weight.shape)
    out_shape = tuple(model.output.weight.shape)
    if w1 != (f.ffn_hidden, f.dim) or out_shape != (f.vocab_size, f.dim):
        raise SystemExit(f"flavor {f.name}: w1 {w1}, output {out_shape}, want FFN "
                         f"{f.ffn_hidden} and vocab {f.vocab_size}")
    return {"w1_shape": list(w1), "output_shape": list(out_shape),
            "n_params": sum(p.numel() for p in model.parameters())}


def _random_docs(vocab_size: int, n_docs: int = 128, words: int = 2048) -> list[str]:
    rng = random.Random(0)
    return [" ".join(f"w{rng.randrange(vocab_size - 3)}" for _ in range(words))
            for _ in range(n_docs)]


def register_dataset(vocab_size: int) -> str:
    """Adds `synthetic` to torchtitan's dataset registry: random words of the tokenizer's
    vocabulary, in a `datasets.Dataset` (torchtitan's text dataset re-loops it). Without a
    working `datasets` package, a list-backed stand-in of the two names torchtitan uses."""
    try:
        datasets = importlib.import_module("datasets")
        mode = f"datasets {datasets.__version__}"
    except Exception as e:  # noqa: BLE001 - any import failure: fall back
        datasets = _datasets_stand_in()
        mode = f"stand-in ({type(e).__name__}: {e})"
    text = importlib.import_module("torchtitan.hf_datasets.text_datasets")
    config_cls = importlib.import_module("torchtitan.hf_datasets").DatasetConfig
    text.DATASETS[DATASET] = config_cls(
        path="(in memory)",
        loader=lambda path: datasets.Dataset.from_dict({"text": _random_docs(vocab_size)}),
        sample_processor=lambda sample: sample["text"])
    return mode


def _datasets_stand_in() -> Any:
    class Dataset(list):  # type: ignore[type-arg]
        @classmethod
        def from_dict(cls, columns: dict[str, list[Any]]) -> Dataset:
            keys = list(columns)
            rows = zip(*columns.values(), strict=True)
            return cls(dict(zip(keys, row, strict=True)) for row in rows)

        def skip(self, n: int) -> Any:
            return iter(self[n:])

    root = types.ModuleType("datasets")
    dist = types.ModuleType("datasets.distributed")
    root.Dataset = Dataset  # type: ignore[attr-defined]
    root.load_dataset = lambda *a, **k: None  # type: ignore[attr-defined]
    dist.split_dataset_by_node = lambda ds, rank, world_size: ds  # type: ignore[attr-defined]
    root.distributed = dist  # type: ignore[attr-defined]
    sys.modules.update({"datasets": root, "datasets.distributed": dist})
    return root


def record_metrics(metric_logger: Any, path: Path) -> None:
    """Also writes every metrics dict torchtitan hands its (tensorboard/wandb) logger, one JSON
    line per logged step: step time, data loading time, active memory besides the console's."""
    inner = metric_logger.log

    def log(metrics: dict[str, Any], step: int) -> None:
        with path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}, default=float) + "\n")
        inner(metrics, step)

    metric_logger.log = log


def worker(spec: dict[str, Any]) -> None:
    """In the child: torchtitan's own entry point, after our registrations. torchtitan binds
    sys.argv at import time, so its command line is put there before any torchtitan import."""
    sys.argv = [sys.argv[0], *spec["torchtitan_args"]]
    meta: dict[str, Any] = {}
    if spec["device"] == "cpu":
        stub_moe_kernels_without_triton()
    dataset_mode = register_dataset(spec["flavor"]["vocab_size"])  # before torchtitan: stand-in
    import torch

    torchtitan = importlib.import_module("torchtitan")
    train = importlib.import_module("torchtitan.train")
    if spec["device"] == "cpu":
        use_cpu_device()
    meta.update(torchtitan_version=torchtitan.__version__, torch_version=torch.__version__,
                device_name=torch.cuda.get_device_name() if spec["device"] == "cuda" else "CPU",
                dataset=dataset_mode, flavor_check=register_flavor(spec["flavor"]))

    class RecordingTrainer(train.Trainer):  # type: ignore[misc, name-defined]
        def __init__(self, job_config: Any) -> None:
            meta["job_config"] = dataclasses.asdict(job_config)
            Path(spec["meta"]).write_text(json.dumps(meta, indent=1, default=str))
            super().__init__(job_config)
            vocab = self.tokenizer.get_vocab_size() if self.tokenizer else None
            meta.update(tokenizer_vocab=vocab, model_vocab=self.model_args.vocab_size,
                        gradient_accumulation_steps=self.gradient_accumulation_steps)
            Path(spec["meta"]).write_text(json.dumps(meta, indent=1, default=str))
            record_metrics(self.metrics_processor.logger, Path(spec["metrics"]))

    train.main(RecordingTrainer)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
    else:
        sys.exit(main())
