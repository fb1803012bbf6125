import json
import os
import stat
import subprocess
import sys
import threading

import pytest

from simpar.cli import main

COMPARE = [
    "compare", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "1024", "--seq-len", "8192",
    "--global-batch", "1024"
]
# a smaller search where a test needs a ranking but not the quick-start case's size
MID = ["compare", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "32", "--seq-len", "4096",
       "--global-batch", "64"]
SIM = [
    "simulate", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "1024", "--seq-len", "8192",
    "--global-batch", "1024", "--tp", "8", "--pp", "8", "--sp", "--zero", "1"
]


def test_compare_prints_a_ranked_table(capsys):
    assert main(COMPARE + ["--top", "5"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") > 8 and "tokens/s" in out and "strategies searched" in out
    # the footer's counts add up: every candidate fits or not, every fitting one is priced or pruned
    nums = [int(w.replace(",", "")) for w in out.split("strategies searched")[0].split()[-1:]]
    foot = out[out.index("strategies searched"):]
    oom, fit, priced, pruned = (int(foot.split(k)[0].split()[-1])
                                for k in (" do not fit", " fit;", " priced", " pruned"))
    assert oom + fit == nums[0] and priced + pruned == fit and pruned > 0


def test_compare_json_parses_and_is_ranked(capsys):
    assert main(MID + ["--json", "--top", "5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    steps = [p["step_time_s"] for p in doc["top"]]
    assert steps == sorted(steps) and len(steps) == 5 and doc["enumerated"] > 1000
    assert all(p["fits_memory"] for p in doc["top"])


def test_compare_ranks_the_stacks_schedules_unless_asked_for_others(capsys):
    """Megatron has no DualPipeV: compare ranks it only where --schedules asks, and simulate
    says a Megatron plan of it is a what-if."""
    seventy = ["compare", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64",
               "--seq-len", "4096", "--global-batch", "64", "--pp", "4", "--top", "50", "--json"]
    ranked = {}
    for extra in ([], ["--schedules", "all"], ["--stack", "torchtitan"]):
        assert main(seventy + extra) == 0
        doc = json.loads(capsys.readouterr().out)
        ranked[tuple(extra)] = {p["strategy"]["schedule"] for p in doc["top"]}
    assert ranked[()] <= {"1f1b", "interleaved"}
    assert "dualpipev" in ranked[("--schedules", "all")]
    assert "dualpipev" in ranked[("--stack", "torchtitan")]
    simulate = ["simulate", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64",
                "--seq-len", "4096", "--global-batch", "64", "--tp", "8", "--pp", "4",
                "--schedule", "dualpipev", "--engine", "analytic"]
    assert main(simulate) == 0
    assert "schedule: a what-if, megatron pipelines with 1f1b, interleaved only" in (
        capsys.readouterr().out)
    assert main(simulate + ["--stack", "torchtitan", "--zero", "1"]) == 0
    assert "what-if" not in capsys.readouterr().out
    assert main(simulate + ["--stack", "mosaic", "--schedule", "1f1b", "--zero", "1"]) == 0
    assert "schedule: a what-if, mosaic does not pipeline" in capsys.readouterr().out


def test_compare_filters(capsys):
    assert main(COMPARE + ["--json", "--tp", "8", "--pp", "4"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {(p["strategy"]["tp"], p["strategy"]["pp"]) for p in doc["top"]} == {(8, 4)}


SMALL = ["compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
         "--global-batch", "64"]


@pytest.mark.parametrize("flags, field", [(["--zero", "9"], "--zero='9'"),
                                          (["--zero=-1"], "--zero='-1'"),
                                          (["--tp", "0"], "--tp='0'"),
                                          (["--recompute", "most"], "--recompute"),
                                          (["--schedules", "1f1b,pipedream"], "--schedules")])
def test_compare_refuses_values_it_cannot_search(flags, field, capsys):
    """These ranked hundreds of strategies that ignored the value (--zero 9), or failed
    deep inside."""
    assert main(SMALL + flags) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"simpar: error: {field}") and err.count("\n") == 1


@pytest.mark.parametrize("flags, field",
                         [(["--mem-limit-gib", "500"], "--mem-limit-gib=500.0"),
                          (["--mem-limit-gib", "500", "--gpus", "8,16"], "--mem-limit-gib=500.0"),
                          (["--gpu-mtbf-hours", "0", "--gpus", "8,16"], "--gpu-mtbf-hours=0.0")])
def test_compare_refuses_limits_that_would_mislead(flags, field, capsys):
    """A memory limit above the GPU's listed strategies that cannot fit on it; an MTBF
    of 0 was read as "not given" and priced with the default."""
    args = list(SMALL)
    if "--gpus" in flags:
        args[args.index("--gpus") + 1] = flags[flags.index("--gpus") + 1]
        flags = flags[:flags.index("--gpus")] + flags[flags.index("--gpus") + 2:]
    assert main(args + flags) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"simpar: error: {field}") and err.count("\n") == 1


def test_compare_prices_the_token_budget_of_its_fastest_strategy(capsys):
    assert main(SMALL + ["--top", "2", "--tokens", "1T", "--price-per-gpu-hour", "2.5"]) == 0
    out = capsys.readouterr().out
    assert "#1 failures:" in out and "token budget:" in out and "cost" in out
    assert main(SMALL +
                ["--top", "2", "--tokens", "1T", "--price-per-gpu-hour", "2.5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    run, best = doc["capacity"]["run"], doc["top"][0]
    # the days follow from the #1 strategy's throughput: 1e12 tokens at its tokens/s,
    # before failures
    assert run["ideal_days"] == pytest.approx(1e12 / best["tokens_per_s"] / 86400, rel=1e-6)


def test_compare_says_when_fixed_degrees_cannot_be_placed(capsys):
    """--tp 3 on 8 GPUs used to end in "no strategy fits in memory", blaming memory for
    a degree that does not divide the GPUs."""
    assert main(SMALL + ["--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert "--tp 3" in err and "divide --gpus" in err and "memory" not in err


def test_simulate_text_and_json(capsys):
    assert main(SIM) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "pipeline_bubble" in out and "optimizer states" in out
    assert main(SIM + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["strategy"]["dp"] == 16 and doc["memory"]["total_gib"] > 0


def test_models_and_gpus(capsys):
    assert main(["models"]) == 0 and "llama3.1-405b" in capsys.readouterr().out
    assert main(["gpus", "--json"]) == 0 and "mi300x" in json.loads(capsys.readouterr().out)


def test_stacks_lists_every_profile_and_what_it_runs(capsys):
    from simpar.specs.stack import STACKS

    assert main(["stacks"]) == 0
    table, aliases = capsys.readouterr().out.split("\n\n")
    rows = {line.split()[0]: line for line in table.splitlines()[2:]}
    assert set(rows) == set(STACKS)
    assert "mosaic: composer, llm-foundry" in aliases
    assert "param, waited for" in rows["deepspeed"] and "block, prefetched" in rows["torchtitan"]
    assert "fsdp2 copies" in rows["torchtitan"] and "flat grads" in rows["mosaic"]
    assert "torch hooks" in rows["execpar"] and "reentrant" in rows["megatron"]
    assert main(["stacks", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nemo"]["loss"] == "fused" and doc["deepspeed"]["recompute_regathers"] is True
    assert doc["execpar"]["selective"] == "attention" and doc["megatron"]["selective"] == "core"
    assert doc["execpar"]["rotary_table_kernels"] == 20 and doc["torchtitan"]["checkpoint_hooks"]


BAD = [
    (["--model", "gpt-9"], "--model"),
    (["--gpu", "tpu-v9"], "--gpu"),
    (["--gpus", "-8"], "--gpus"),
    (["--seq-len", "0"], "--seq-len"),
    (["--global-batch", "-1"], "--global-batch"),
    (["--tp", "3"], "tp*pp*cp"),
    (["--tp", "3", "--dp", "16", "--gpus", "384"], "--tp"),
    # 80 layers, the embedding and the loss: at most 82 pipeline stages
    (["--pp", "83", "--dp", "1", "--gpus", "664"], "layers"),
    (["--dp", "7"], "dp*tp*pp*cp"),
    (["--micro-batch", "3"], "--global-batch"),
    (["--ep", "2"], "--ep"),
    (["--zero", "5"], "--zero"),
    (["--schedule", "zigzag"], "--schedule"),
    (["--recompute", "half"], "--recompute"),
    (["--vpp", "2", "--schedule", "1f1b"], "--vpp"),  # alone, --vpp means interleaved
    (["--tp", "abc"], "--tp"),
    (["--gpu-mtbf-hours", "0"], "--gpu-mtbf-hours"),
    (["--seq-len", "8190"], "--seq-len=8190"),  # sequence parallelism over tp 8
    # an op slowed e^(1e9)-fold: the event engine would never finish
    (["--jitter", "1e9"], "--jitter"),
    (["--jitter", "nan"], "--jitter"),
]


@pytest.mark.parametrize("change, needle", BAD)
def test_bad_input_is_one_line_and_exit_2(capsys, change, needle):
    args = list(SIM)
    for i in range(0, len(change), 2):
        flag = change[i]
        if flag in args:
            args[args.index(flag) + 1] = change[i + 1]
        else:
            args += change[i:i + 2]
    code = _run(args)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def _run(args) -> int:
    """main() as the console script runs it: argparse errors exit through SystemExit."""
    try:
        return main(args)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("content, suffix", [("{not json", ".json"), ("a: [1\n", ".yaml")])
def test_malformed_files_exit_2_without_traceback(tmp_path, content, suffix):
    path = tmp_path / f"model{suffix}"
    path.write_text(content)
    proc = subprocess.run([sys.executable, "-m", "simpar.cli"] + SIM[:1] +
                          ["--model", str(path)] + SIM[3:], capture_output=True, text=True)
    assert proc.returncode == 2
    assert (
        "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1 and str(path) in proc.stderr
    )


def test_malformed_cluster_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("gpu: h100-sxm\ngpus_per_node: 8\nintra_node_bw_gbps: -1\n")
    proc = subprocess.run([
        sys.executable, "-m", "simpar.cli", "simulate", "--model", "llama3-8b", "--cluster",
        str(path), "--gpus", "8", "--seq-len", "4096", "--global-batch", "8"
    ], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_mem_limit_drops_strategies_above_it(capsys):
    assert main(MID + ["--json", "--top", "50"]) == 0
    assert max(p["memory"]["total_gib"] for p in json.loads(capsys.readouterr().out)["top"]) > 60
    assert main(MID + ["--json", "--top", "50", "--mem-limit-gib", "60"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["top"]) == 50 and all(p["memory"]["total_gib"] <= 60 for p in doc["top"])


def test_nothing_fits_says_why(capsys):
    args = [
        "compare", "--model", "llama3.1-405b", "--gpu", "a100-40gb", "--gpus", "8", "--seq-len",
        "8192", "--global-batch", "64"
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("simpar: error: --gpus=8: no strategy fits in ") and "\n" not in err
    assert "the smallest needs" in err
    assert main(args + ["--json"]) == 2  # a script learns it the same way


def test_output_writers_keep_links_and_special_files_and_follow_the_umask(tmp_path):
    from simpar.files import write_text

    target = tmp_path / "real.json"
    link = tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    write_text(str(link), "new")  # written through the link, which stays a link
    assert link.is_symlink() and target.read_text() == "new"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    write_text(str(fifo), "through the pipe")
    reader.join(5)
    assert got == ["through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    old = os.umask(0o022)
    try:
        write_text(str(tmp_path / "plain.json"), "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "plain.json").st_mode) == 0o644


@pytest.mark.parametrize("where, says", [("missing/sub/out.json", "does not exist"),
                                         ("", "is a folder")])
def test_bad_output_paths_get_one_line_and_leave_nothing(tmp_path, capsys, where, says):
    out = tmp_path / where if where else tmp_path
    args = [
        "simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
        "--global-batch", "8", "--trace",
        str(out)
    ]
    before = set(tmp_path.rglob("*"))
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trace" in err[0] and says in err[0]
    assert set(tmp_path.rglob("*")) == before


def test_json_output_is_strict_json():
    from simpar.files import strict_json

    doc = {"mtbf_h": float("inf"), "rates": [1.5, float("nan")], "nested": {"x": -float("inf")}}
    assert strict_json(
        doc, indent=None) == '{"mtbf_h": null, "rates": [1.5, null], "nested": {"x": null}}'


def test_every_json_command_prints_strict_json(capsys):
    def reject(name):
        raise AssertionError(f"{name} is not JSON")

    for args in (SIM + ["--json", "--engine", "analytic"], ["gpus", "--json"], ["models",
                                                                                "--json"]):
        assert main(args) == 0
        json.loads(capsys.readouterr().out, parse_constant=reject)


@pytest.mark.parametrize("flag, typo, meant", [("--gpu", "h100-smx", "h100-sxm"),
                                               ("--gpu", "b20O", "b200"),
                                               ("--model", "llama3-8", "llama3-8b"),
                                               ("--stack", "torchtitn", "torchtitan"),
                                               ("--recompute", "ful", "full"),
                                               ("--cluster", "dgx-h10", "dgx-h100"),
                                               ("--dtype", "bf61", "bf16")])
def test_a_typo_is_answered_with_the_name_it_was_meant_to_be(flag, typo, meant, capsys):
    args = [
        "simulate", "--model", "llama3-8b", "--gpus", "8", "--seq-len", "4096", "--global-batch",
        "64"
    ]
    args += [] if flag == "--cluster" else ["--gpu", "h100-sxm"]
    if flag in args:
        args[args.index(flag) + 1] = typo
    else:
        args += [flag, typo]
    assert _run(args) == 2
    err = capsys.readouterr().err
    assert f"did you mean {meant!r}?" in err and err.count("\n") == 1


@pytest.mark.parametrize("given,meant", [(["--micro", "2"], "--micro-batch"),
                                        (["--recompte=full"], "--recompute")])
def test_a_misspelt_flag_is_refused_with_the_commands_flag_it_was_meant_to_be(given, meant,
                                                                             capsys):
    # argparse would take "--micro" as "--micro-batch" if abbreviations were allowed: a prefix
    # is a typo here, answered by name, never silently read as another flag
    args = ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len",
            "4096", "--global-batch", "64", *given]
    assert _run(args) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and f"did you mean {meant!r}?" in err
    assert err.count("\n") == 1


def test_an_unknown_key_in_a_model_file_names_the_key_it_was_meant_to_be(tmp_path, capsys):
    f = tmp_path / "m.yaml"
    f.write_text(
        "name: m\nlayers: 2\nhiden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 128\nvocab: 100\n")
    assert _run([
        "simulate", "--model",
        str(f), "--gpu", "h100-sxm", "--gpus", "1", "--seq-len", "64", "--global-batch", "1"
    ]) == 2
    err = capsys.readouterr().err
    assert "hiden" in err and "did you mean 'hidden'?" in err and err.count("\n") == 1


def test_an_moe_prediction_says_what_its_expert_dispatch_assumes(capsys):
    """Balanced routing, every kernel launched by the host: Megatron-Bridge's 25.11 recipes ran
    the same Qwen3-30B-A3B layout 1.7x slower than its 26.06 ones, which capture the whole
    iteration in CUDA graphs (23,766 against 40,706 tokens/s per GPU), and simpar says so."""
    args = ["simulate", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "64"]
    assert _run(args + ["--model", "gpt-oss-20b", "--ep", "8"]) == 0
    out = capsys.readouterr().out
    assert ("experts: 32 x top 4, priced balanced, every kernel launched by the host, the "
            "experts' after the host waits for their token counts (--cuda-graphs: replayed)") in out
    assert _run(args + ["--model", "gpt-oss-20b", "--stack", "torchtitan"]) == 0
    assert "every kernel launched by the host; Megatron" in capsys.readouterr().out
    assert _run(args + ["--model", "gpt-oss-20b", "--ep", "8", "--stack", "nemo",
                        "--cuda-graphs"]) == 0
    assert "priced balanced, replayed from CUDA graphs" in capsys.readouterr().out
    assert _run(args + ["--model", "gpt-oss-20b", "--stack", "fsdp", "--cuda-graphs"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fsdp does not capture CUDA graphs" in err
    assert _run(args + ["--model", "llama3-8b"]) == 0
    assert "experts:" not in capsys.readouterr().out


@pytest.mark.parametrize("args", [
    ["topo", "show", "dgx-h100", "--gpus", "16", "--png", ""],
    ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
     "--global-batch", "8", "--trace", " "],
    ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
     "--global-batch", "8", "--zero", "3", "--out", "PLAN", "--emit", ""],
])
def test_an_empty_path_or_list_is_refused_not_read_as_none(args, tmp_path, monkeypatch, capsys):
    # an empty --png drew to the default topo-*.png; an empty --emit wrote a plan file where a
    # folder of launch files was asked for
    monkeypatch.chdir(tmp_path)
    assert _run([str(tmp_path / "p") if a == "PLAN" else a for a in args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("empty" in err or "--emit=''" in err), err
    assert list(tmp_path.iterdir()) == []


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """`simpar models | head -2`: the pipe closes under the table; no traceback, the shell's
    code for a command a closed pipe stopped (128 + SIGPIPE)."""
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m simpar.cli models | head -2", shell=True,
                          capture_output=True, text=True, executable="/bin/bash", timeout=60)
    assert proc.stdout.splitlines()[0].startswith("model")
    assert proc.stderr == ""
