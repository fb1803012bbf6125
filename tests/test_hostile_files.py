"""Hostile model, cluster, plan and measurement files and flag combinations, found by probing
every simpar command: each used to end in a traceback, a hang, an out-of-memory kill or an
answer of inf seconds. Each is now refused in one line naming the field and the value, exit 2,
no traceback."""

import json

import pytest
import yaml

from simpar.cli import main
from simpar.specs.cluster import builtin_clusters

MODEL = {"name": "t", "layers": 4, "hidden": 512, "heads": 8, "kv_heads": 8, "ffn_hidden": 1024,
         "vocab": 1000}
JOB = ["--seq-len", "512", "--global-batch", "16", "--gpus", "8"]
LLAMA = ["--model", "llama3-8b", "--gpu", "h100-sxm", *JOB]


def _code(argv) -> int:
    """main's exit code, also where argparse exits for a flag it cannot parse."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def _refused(capsys, argv, field: str, says: str) -> None:
    assert _code(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert field in err and says in err, err


@pytest.mark.parametrize("key,value,says", [
    ("bias", "abc", "give true or false"),  # was TypeError: int + str
    ("dropout", [1], "give true or false"),  # was TypeError: unhashable list
    ("gated_mlp", "false", "give true or false"),  # the string was taken as true
    ("position_embeddings", "abc", "must be a whole number"),
    ("position_embeddings", 2.5, "must be a whole number"),
    ("hidden", 10**12, "is beyond 10,000,000"),  # answered 2.7e14 s and 1.2e17 GiB
    ("vocab", 10**20, "is beyond 10,000,000"),
])
def test_a_bad_model_field(tmp_path, capsys, key, value, says):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({**MODEL, key: value}))
    _refused(capsys, ["simulate", "--model", str(path), "--gpu", "h100-sxm", *JOB],
             f"model.{key}", says)


def test_an_unknown_numeric_key_and_a_huge_value_are_named_briefly(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    # a number key beside text keys could not be sorted (TypeError); a YAML alias bomb in an
    # unknown key wrote a 2.1 GB error line
    aliases = ['b0: &a0 [' + ",".join(['"x"'] * 10) + ']'] + [
        f"b{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path.write_text(yaml.safe_dump(MODEL) + "1: 2\n" + "\n".join(aliases) + "\n")
    _refused(capsys, ["simulate", "--model", str(path), "--gpu", "h100-sxm", *JOB], "m.yaml.1",
             "unknown key")
    path.write_text(yaml.safe_dump(MODEL) + "\n".join(aliases) + "\n")
    assert main(["simulate", "--model", str(path), "--gpu", "h100-sxm", *JOB]) == 2
    assert len(capsys.readouterr().err) < 2000


def test_a_key_given_twice_is_refused(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(MODEL) + "layers: 8\n")  # YAML kept the last one silently
    _refused(capsys, ["simulate", "--model", str(path), "--gpu", "h100-sxm", *JOB], "--model",
             "key 'layers' is given twice")
    # a list as a key: the duplicate check passes it to PyYAML (it had raised a TypeError)
    path.write_text(yaml.safe_dump(MODEL) + "? [1, 2]\n: 3\n")
    _refused(capsys, ["simulate", "--model", str(path), "--gpu", "h100-sxm", *JOB], "--model",
             "is not valid YAML")


@pytest.mark.parametrize("extra,field", [
    ({"num_local_experts": 8, "num_experts_per_tok": "two"}, "num_experts_per_tok"),
    ({"num_local_experts": [8]}, "num_local_experts"),
    ({"num_local_experts": 8.7}, "num_local_experts"),  # was truncated to 8
    ({"num_local_experts": -8}, "num_local_experts"),  # was priced as a dense model
    ({"num_local_experts": 8, "num_experts_per_tok": 0}, "num_experts_per_tok"),  # was top-1
    ({"hidden_act": None}, "hidden_act"),  # 'None': priced as a GELU model
    ({"sliding_window": 128, "layer_types": [1, 2]}, "layer_types"),  # the window was dropped
    ({"attention_dropout": "x"}, "attention_dropout"),
    ({"head_dim": "x"}, "head_dim"),
    ({"sliding_window": 128, "layer_types": 5}, "layer_types"),
])
def test_a_bad_hugging_face_config(tmp_path, capsys, extra, field):
    cfg = {"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
           "intermediate_size": 1024, "vocab_size": 1000, **extra}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    _refused(capsys, ["simulate", "--model", str(path), "--gpu", "h100-sxm", *JOB],
             f"config.json:{field}", "must be")


# a GPU given inline in a cluster file
GPU = {"name": "g", "fp32_tflops": 60, "tf32_tflops": 400, "bf16_tflops": 900, "fp8_tflops": 0,
       "hbm_gib": 80, "hbm_tbps": 3, "sm_count": 132, "gemm_efficiency": 0.7,
       "attention_efficiency": 0.5, "gemm_table_dtype": "bf16"}


def _cluster(tmp_path, base: str, edit) -> str:
    data = yaml.safe_load(builtin_clusters()[base].read_text())
    edit(data)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("base,edit,field,says", [
    # inf latency hung the simulation; inf bandwidth crashed topo show's max-flow
    ("dgx-h100", lambda d: d.update(inter_node_latency_us=float("inf")),
     "cluster.inter_node_latency_us", "must be a finite number"),
    ("dgx-h100", lambda d: d.update(nic_bw_gbps=float("inf")), "cluster.nic_bw_gbps",
     "must be a finite number"),
    ("dgx-h100", lambda d: d.update(straggler_delay_frac=float("inf")),
     "cluster.straggler_delay_frac", "must be a finite number"),  # answered inf seconds
    ("dgx-h100", lambda d: d.update(name=[1]), "cluster.name", "give the cluster a name"),
    ("dgx-h100", lambda d: d.update(collective_efficiency={1: 0.5, "allreduce": 0.5}),
     "cluster.collective_efficiency", "name one of"),
    ("dgx-h100", lambda d: d.update(gpus_per_node=10**9), "cluster.gpus_per_node",
     "is beyond 1024"),  # built a billion-GPU node: killed for memory
    ("dragonfly", lambda d: d["topology"].update(routers_per_group=1.5),
     "topology.routers_per_group", "give a whole number"),
    ("dragonfly", lambda d: d["topology"].update(gpus_per_router=0.5),
     "topology.gpus_per_router", "give a whole number"),
    ("dgx-h100", lambda d: d["topology"].update(leaf_radix=1), "topology.leaf_radix",
     "give a whole number from 2"),
    ("torus-2d", lambda d: d["topology"].update(dims=[100000, 100000]), "topology.dims",
     "of at most 1,000,000 nodes"),
    # a group of 10^6 routers filled memory building the graph
    ("dragonfly", lambda d: d["topology"].update(routers_per_group=100000),
     "topology.routers_per_group", "real dragonfly groups hold 16-64 routers"),
    # `simpar collective` answered 6e298 ms
    ("dgx-h100", lambda d: d["topology"].update(switch_latency_us=1e300),
     "topology.switch_latency_us", "must be 0 or between"),
    # a rate of 1e-300 or a latency of 1e300 answered a step of inf seconds
    ("dgx-h100", lambda d: d.update(intra_node_bw_gbps=1e-300), "cluster.intra_node_bw_gbps",
     "is beyond any real value"),
    ("dgx-h100", lambda d: d.update(intra_node_latency_us=1e300),
     "cluster.intra_node_latency_us", "is beyond any real value"),
    ("dgx-h100", lambda d: d.update(gpu={**GPU, "hbm_tbps": 1e-300}), "gpu.hbm_tbps",
     "is beyond any real value"),
    ("dgx-h100", lambda d: d.update(gpu={**GPU, "kernel_overhead_us": 1e300}),
     "gpu.kernel_overhead_us", "is beyond any real value"),
    # a GPU named .nan (read by YAML as a number) was priced as '8 x nan'
    ("dgx-h100", lambda d: d.update(gpu={**GPU, "name": float("nan")}), "gpu.name",
     "give the GPU a name"),
    # TypeError: 'int' object is not iterable / has no len()
    ("dgx-h100", lambda d: d.update(gpu={**GPU, "gemm_table": 5}), "gpu.gemm_table",
     "must be a list of [m, n, k, seconds] rows"),
    ("dgx-h100", lambda d: d.update(gpu={**GPU, "gemm_table": [5]}), "gpu.gemm_table",
     "each row is [m, n, k, seconds]"),
    ("dgx-h100", lambda d: d.update(gpu={**GPU, "gemm_table": [[1, 1, 1, 1e-300]]}),
     "gpu.gemm_table", "each row is [m, n, k, seconds]"),
    ("dgx-h100", lambda d: d.update(gpu={**GPU, "attention_table": {"a": 1}}),
     "gpu.attention_table", "must be a list of [sequences x heads, tokens, head dim"),
    ("dgx-h100", lambda d: d.update(gpu={**GPU, "attention_table": [[8, 256, 64, 1e-3]],
                                          "attention_table_dtype": "bf16"}),
     "gpu.attention_table", "each row is [sequences x heads, tokens, head dim, forward s"),
    ("dgx-h100", lambda d: d.update(gpu={**GPU, "attention_table": [[8, 256, 64, 1e-3, 2e-3]],
                                          "attention_table_dtype": "int4"}),
     "gpu.attention_table_dtype", "name the precision the table was measured in"),
])
def test_a_bad_cluster_file(tmp_path, capsys, base, edit, field, says):
    path = _cluster(tmp_path, base, edit)
    _refused(capsys, ["simulate", "--model", "llama3-8b", "--cluster", path, *JOB], field, says)


@pytest.mark.parametrize("flags,field,says", [
    (["--pp", "2", "--straggler", "1:inf"], "--straggler", "give a value from 1 to 100"),
    (["--pp", "2", "--straggler", "0-99999999999:1.2"], "--straggler", "0 <= FIRST <= LAST"),
    (["--pp", "2", "--straggler", "1-0:1.2"], "--straggler", "0 <= FIRST <= LAST"),
    (["--pp", "2", "--stage-gpu", "1:h999"], "--stage-gpu", "unknown GPU"),
    (["--pp", "2", "--stage-gpu", "0:h200", "--stage-gpu", "0:a100-80gb"], "--stage-gpu",
     "names this pipeline rank twice"),
    (["--bucket-mb", "1e-30"], "--bucket-mb", "must be at least 1"),
    (["--straggler-delay", "1e300"], "--straggler-delay", "must be at most 10,000"),
    (["--node-mtbf-hours", "1e-12", "--tokens", "1T"], "--node-mtbf-hours", "must be at least"),
    # answered 'job MTBF inf h ... goodput 0.0%' and a step of inf seconds
    (["--gpu-mtbf-hours", "1e308"], "--gpu-mtbf-hours", "must be at most"),
    (["--ps-servers", "1", "--ps-server-gbps", "1e-300"], "--ps-server-gbps",
     "must be at least 0.001"),
    (["--steps", "1000000000"], "--steps", "must be at most 1,000,000"),  # filled 15 GB
    # 12.5 million micro-batches for the event engine: ran out of memory
    (["--global-batch", "100000000"], "--global-batch", "give a larger --micro-batch or "
                                                        "--engine analytic"),
    # priced a 20-hour step
    (["--compress", "powersgd", "--powersgd-rank", "1000000000"], "--powersgd-rank",
     "sends more than the gradient it compresses"),
    (["--offload-activations", "1000"], "--offload-activations", "give at most 32"),
    (["--ps-server-gbps", "5"], "--ps-server-gbps", "add --ps-servers"),
    (["--trace", "t.json", "--engine", "analytic"], "--trace", "drop --engine analytic"),
    (["--trace", "t.json", "--timeline", "t.json"], "--timeline", "give each its own file"),
])
def test_a_bad_flag_combination(capsys, flags, field, says):
    _refused(capsys, ["simulate", *LLAMA, *flags], field, says)


def test_a_sequence_beyond_learned_positions_is_refused(capsys):
    _refused(capsys, ["simulate", "--model", "gpt3-175b", "--gpu", "h100-sxm", "--seq-len", "4096",
                      "--global-batch", "64", "--gpus", "64", "--tp", "8", "--pp", "8"],
             "--seq-len", "is beyond gpt3-175b's 2,048 learned positions")


@pytest.mark.parametrize("path,says", [("/proc/t.json", "cannot be written"),
                                       ("/dev/full", "No space left on device")])
def test_an_output_the_system_refuses(capsys, path, says):
    """Paths that pass the up-front check but whose write fails: a traceback before."""
    _refused(capsys, ["simulate", *LLAMA, "--trace", path], "--trace", says)


def test_nothing_fits_is_one_line_in_json_too(capsys):
    argv = ["compare", "--model", "llama3-70b", "--gpu", "h100-sxm", "--seq-len", "8192",
            "--global-batch", "16", "--gpus", "8"]
    _refused(capsys, argv, "--gpus=8", "no strategy fits in 79.6 GiB per GPU")
    _refused(capsys, argv + ["--json"], "--gpus=8", "no strategy fits")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["plan", *LLAMA, "--zero", "3", "--out", str(path)]) == 0
    return path


MEASURED = {"schema": "execpar-measurement", "step_time_s": 0.5, "tokens_per_s": 16000,
            "global_batch": 16, "breakdown": {"comm_s": 0.1, "compute_s": 0.4}}


@pytest.mark.parametrize("change,field", [
    ({"breakdown": [1]}, "measured.breakdown"),  # AttributeError
    ({"breakdown": {"comm_s": "x"}}, "measured.breakdown.comm_s"),  # format ValueError
    ({"breakdown": {"kernels": {"source": "gpu kernels"}}}, "measured.breakdown.kernels.top"),
    ({"breakdown": {"kernels": "x"}}, "measured.breakdown.kernels"),
    ({"step_time_s": "abc"}, "measured.step_time_s"),
    ({"step_time_s": float("nan")}, "measured.step_time_s"),  # answered error +nan%
    ({"step_time_s": -1}, "measured.step_time_s"),
    ({"memory": {"peak_allocated_gib": "x"}}, "measured.memory.peak_allocated_gib"),
    ({"strategy": [1, 2]}, "measured.strategy"),
    ({"global_batch": "16"}, "measured.global_batch"),
])
def test_a_malformed_measurement(tmp_path, capsys, plan, change, field):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**MEASURED, **change}))
    _refused(capsys, ["validate", str(plan), str(path)], field, "must")


@pytest.mark.parametrize("change,field", [
    (lambda d: d.update(prediction=[1]), "plan.prediction"),
    (lambda d: d["prediction"].update(step_time_s="x"), "plan.prediction.step_time_s"),
    (lambda d: d["prediction"].update(breakdown={"dp_comm": "x"}),
     "plan.prediction.breakdown.dp_comm"),
    (lambda d: d.update(model=[1]), "plan.model"),  # IndexError
])
def test_a_malformed_plan(tmp_path, capsys, plan, change, field):
    data = json.loads(plan.read_text())
    change(data)
    bad, measured = tmp_path / "p.json", tmp_path / "m.json"
    bad.write_text(json.dumps(data))
    measured.write_text(json.dumps(MEASURED))
    assert main(["validate", str(plan), str(measured)]) == 0  # the measurement itself is fine
    capsys.readouterr()
    _refused(capsys, ["validate", str(bad), str(measured)], field, "must be a")


def test_a_sweep_without_torch_is_refused_before_writing(tmp_path, capsys, monkeypatch):
    """It wrote the sweep's model and log, then blamed a failed step (the cause was in the log)."""
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # import torch now fails
    out = tmp_path / "sweep"
    _refused(capsys, ["validate", "--sweep", "--out", str(out)], "--device", "needs torch")
    assert not out.exists()


@pytest.mark.parametrize("suffix,text", [
    (".json", "[" * 100_000 + "]" * 100_000),
    (".yaml", "a: " + "[" * 100_000 + "]" * 100_000 + "\n"),
    (".json", '{"layers": ' + "9" * 5000 + "}"),  # past Python's int-from-text limit
])
def test_a_spec_file_nested_too_deep_or_too_long_a_number(tmp_path, capsys, suffix, text):
    """RecursionError and ValueError tracebacks from the parsers."""
    path = tmp_path / f"m{suffix}"
    path.write_text(text)
    _refused(capsys, ["simulate", "--model", str(path), "--gpu", "h100-sxm", *JOB], "--model",
             "is not a spec file")


@pytest.mark.parametrize("argv,says", [
    # a list flag was shown as the tuple it parses to: --zero=(3,)
    (["compare", "--model", "gpt-oss-20b", "--gpu", "h100-sxm", "--gpus", "1", "--seq-len",
      "2048", "--global-batch", "8", "--zero", "3", "--compress", "topk"], "--zero=3: "),
    # named the plan's field (strategy.offload_optimizer), not the flag
    (["plan", *LLAMA, "--offload-optimizer", "--out", "p.json"], "--offload-optimizer=True: "),
    (["simulate", *LLAMA, "--stage-gpu", "1:a100-80gb"], "name one of those or raise --pp"),
])
def test_an_error_says_it_as_the_command_line_does(tmp_path, monkeypatch, capsys, argv, says):
    monkeypatch.chdir(tmp_path)
    assert _code(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "p.json").exists()


def test_calibrate_checks_its_output_before_measuring(capsys):
    """It started torchrun and measured for minutes, then failed to write in the child."""
    _refused(capsys, ["calibrate", "--nproc-per-node", "1", "--device", "cpu", "--out",
                      "/nonexistent/dir/p.yaml"], "--out", "does not exist")
