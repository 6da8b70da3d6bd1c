"""``make gpu-check``: validate the GPU path on a machine with an NVIDIA GPU.

Uses that machine's own python3 and packages (CuPy, cuDNN 9 from an nvidia-cudnn wheel,
PyTorch, pytest) with PYTHONPATH=. and no installs. Runs every ``gpu`` test (the hazard
files first), compares the params layout with cuDNN's, then runs short benchmarks (the
GPU path against PyTorch's cuDNN RNNs and the frameworks' training steps). The report
(``gpu-report.md``, ``gpu-summary.json``, the pytest log and JUnit XML, the layout tables,
the benchmark JSON) goes into ``$OUT`` when it is set. It is written again after every
step, so a run cut short still says what passed. A summary table is printed last.
Exits non-zero without a GPU, on any failure, or when no GPU test passed.
"""

import datetime
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
# Limits in seconds; their sum (359) stays under the six minutes a check may take. The
# tests took 21 s on an H200 (2026-11-30, before plans, the torch ops, JAX and the
# hazard tests, whose torch.compile step compiles for tens of seconds). A script past its
# limit keeps the rows it printed.
LAYOUT_TIMEOUT_S = 12
TEST_TIMEOUT_S = 140
BENCH_TIMEOUT_S = 75
#: Framework benchmarks: script, arguments, limit, the module it needs (a device machine
#: may lack Flax or Keras: the report then says so), extra environment. Compiling
#: (inductor, XLA) dominates them.
FRAMEWORK_BENCHES = [
    ("torch_bench.py", ["--device", "cuda", "--repeat", "5"], 32, "torch", {}),
    ("jax_bench.py", ["--platform", "gpu", "--repeat", "5"], 32, "jax", {}),
    ("flax_bench.py", ["--platform", "gpu", "--repeat", "3"], 16, "flax", {}),
    ("keras_bench.py", ["--size", "gpu", "--repeat", "3"], 16, "keras",
     {"KERAS_BACKEND": "jax"}),
    # WGAN-GP's second order against torch.nn with cuDNN off; one process per side
    ("second_order_bench.py", ["--device", "cuda", "--rounds", "1", "--repeat", "10"], 36,
     "torch", {}),
]

#: Issues 17's, 40's and 47's hazards and the ``gpu`` tests that settle each (test function
#: names; "[cuda]" marks the real-GPU run of a ``device`` test).
HAZARDS = [
    ("1 reserve space reused by a second backprop",
     ["test_one_reserve_space_serves_any_number_of_backprops[cuda]",
      "test_gpu_jacrev_on_cuda_equals_the_cpu",
      "test_gpu_whether_cudnn_writes_the_reserve_space"]),
    ("2 captured graph keeps what its replay touches",
     ["test_a_captured_graph_keeps_what_its_replays_use[cuda]"]),
    ("3 dropout under rematerialisation",
     ["test_gpu_jax_grad_with_and_without_checkpoint_at_dropout",
      "test_gpu_torch_checkpoint_at_dropout_equals_plain[False]",
      "test_gpu_torch_checkpoint_at_dropout_equals_plain[True]",
      "test_a_keyed_forward_run_again_draws_its_masks_and_leaves_the_state[cuda]"]),
    ("4 foreign CUDA arrays in the functional API",
     ["test_gpu_functional_api_on_a_torch_side_stream"]),
    ("7 JAX buffers sized for the platform", ["test_gpu_jax_reserve_is_the_plans"]),
    ("8 dx padding, bfloat16 zero, torch.compile reduce-overhead",
     ["test_input_backprop_padding_is_zero_whatever_the_buffer_held[cuda]",
      "test_ragged_batch_major_bfloat16_with_an_empty_row_through_a_plan[cuda]",
      "test_gpu_ragged_batch_major_bfloat16_with_an_empty_row_through_pytorch",
      "test_gpu_torch_compile_reduce_overhead_trains_three_steps[plain]",
      "test_gpu_torch_compile_reduce_overhead_trains_three_steps[dropout]",
      "test_gpu_torch_compile_reduce_overhead_trains_three_steps[lengths]"]),
    # Issue 40's (tests/test_gpu_lifetime.py)
    ("40.1 graphs captured by PyTorch or CuPy keep their plans",
     ["test_a_graph_captured_outside_pycudnnrnn_keeps_the_plans_it_replays[cuda]",
      "test_gpu_torch_graph_replays_after_lru_eviction_and_clear_caches"]),
    ("40.2 a dead plan waits for every stream it ran on",
     ["test_a_dead_plan_waits_for_its_runs_on_every_stream[cuda]"]),
    ("40.3 graphs.capture with PyTorch tensors", ["test_gpu_graphs_capture_with_torch_tensors"]),
    ("40.7 JAX's forward workspace is forward's", ["test_gpu_jax_forward_workspace_is_forwards"]),    # Issue 47's: review 3 (2026-12-07), by finding (tests/test_gpu_hazards.py's last blocks)
    ("47.1 the functional API on PyTorch tensors under a capture",
     ["test_gpu_graphs_capture_of_the_functional_api_on_torch_tensors",
      "test_gpu_torch_cuda_graph_of_the_functional_api_on_torch_tensors"]),
    ("47.2 a CuPy capture keeps the call's temporaries",
     ["test_gpu_finding_2_a_cupy_capture_on_cupys_pool_keeps_the_calls_temporaries"]),
    ("47.3 a plan first built during a capture",
     [f"test_gpu_a_plan_first_built_during_a_capture[{m}-{d}]"
      for m in ("relaxed", "global") for d in ("0.0", "0.5")]),
    ("47.4 JAX's checked forward takes no second workspace",
     ["test_gpu_jax_checked_training_forward_takes_no_second_workspace"]),
    ("47.5 per-thread default streams told apart",
     ["test_gpu_finding_5_a_plan_built_on_one_threads_default_stream_runs_on_anothers"]),
    ("47.6 a seed's dropout states outlive a queued forward",
     ["test_gpu_finding_6_a_seeds_dropout_states_outlive_a_queued_forward"]),
    ("47.7 a plan on cuda:1 dropped with cuda:0 current (2 GPUs)",
     ["test_gpu_finding_7_a_plan_on_cuda1_dropped_with_cuda0_current"]),
    ("47.8 a dropped captured graph keeps its plans under a queued replay",
     ["test_gpu_finding_8_a_dropped_captured_graph_keeps_its_plans_under_a_queued_replay"]),
    ("47.9 a penalty step leaves cuDNN's flag to other threads",
     ["test_gpu_penalty_step_leaves_cudnns_flag_to_other_threads"]),
    ("47.11 graphs.capture refuses arrays on another device (2 GPUs)",
     ["test_gpu_graphs_capture_refuses_arrays_on_another_device"]),
]
# Hazards 5 and 6 (plan buffers on any stream, host syncs, cudnnDestroy) are ordering
# and counting properties the stand-in GPU settles in CI; here the thread and graph
# tests of test_gpu.py and test_plan.py exercise them on the hardware.


def environment():
    """Facts for the report; raises SystemExit(2) at once without a usable GPU."""
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        sys.exit(f"gpu-check: no usable GPU ({type(exc).__name__}: {exc}); nothing was run")
    if count < 1:
        sys.exit("gpu-check: CUDA reports no GPU; nothing was run")
    from pycudnnrnn.cudnn import loader
    props = cupy.cuda.runtime.getDeviceProperties(0)
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "gpus": count,
        "cudnn": ".".join(map(str, loader.version())),
        "cudnn_path": loader.library_path(),
        "cupy": cupy.__version__,
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "torch": torch_version,
        "python": platform.python_version(),
    }


#: Test files run first, so that a run cut short has settled the hazards.
FIRST = ("test_gpu_hazards.py", "test_gpu_lifetime.py")
#: A verbose pytest line: ``tests/x.py::name[params] PASSED`` (``-s`` may put a test's own
#: prints before the outcome on the same line).
OUTCOME = re.compile(r"::(\S+?) .*?\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def test_command(xml_path):
    """pytest on every ``gpu`` test, verbose, so each outcome reaches the log as it ends."""
    tests = os.path.join(ROOT, "tests")
    # Files named one by one: given a folder, pytest runs its own order whatever else
    # the command line names first.
    files = sorted(name for name in os.listdir(tests)
                   if name.startswith("test_") and name.endswith(".py"))
    files = [name for name in FIRST if name in files] + [n for n in files if n not in FIRST]
    # -s: the hazard tests print what they measured (sizes, CUDA-graph skips) for the report
    return [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-s", "-rfE",
            "-p", "no:cacheprovider", f"--junitxml={xml_path}",
            *(os.path.join(tests, name) for name in files)]


def run_tests(out):
    """Run the tests into ``gpu-tests.log`` as they go; (exit status, counts, log)."""
    xml_path, log_path = os.path.join(out, "gpu-tests.xml"), os.path.join(out, "gpu-tests.log")
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(test_command(xml_path), cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, text=True)
        try:
            rc = proc.wait(timeout=TEST_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = 124
    with open(log_path, errors="replace") as f:
        text = f.read()
    if rc == 124:
        text += f"\nTIMED OUT after {TEST_TIMEOUT_S} s"
        with open(log_path, "a") as f:
            f.write(f"\nTIMED OUT after {TEST_TIMEOUT_S} s\n")
    return rc, count_outcomes(test_outcomes(xml_path) or log_outcomes(text)), text


def log_outcomes(log: str) -> dict:
    """{test name: outcome} read from the verbose log: all a run cut short leaves."""
    outcomes = {}
    for name, word in OUTCOME.findall(log):
        outcomes[name] = ("failed" if word in ("FAILED", "ERROR") else
                          "skipped" if word in ("SKIPPED", "XFAIL") else "passed")
    return outcomes


def count_outcomes(outcomes: dict) -> dict:
    values = list(outcomes.values())
    return dict(tests=len(values), passed=values.count("passed"),
                failures=values.count("failed"), errors=0, skipped=values.count("skipped"))


def test_outcomes(xml_path) -> dict:
    """{test name: "passed" | "failed" | "skipped"} from pytest's JUnit XML."""
    if not os.path.exists(xml_path):
        return {}
    outcomes = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcomes[case.get("name")] = ("failed" if kinds & {"failure", "error"} else
                                      "skipped" if "skipped" in kinds else "passed")
    return outcomes


def hazard_verdicts(outcomes: dict) -> list:
    """[(hazard, verdict, detail)]: fixed when every test of it passed, NOT FIXED when
    one failed, not settled when one is missing or skipped."""
    rows = []
    for hazard, names in HAZARDS:
        seen = [outcomes.get(n, "missing") for n in names]
        verdict = ("NOT FIXED" if "failed" in seen else "fixed" if set(seen) == {"passed"}
                   else "not settled")
        rows.append((hazard, verdict, ", ".join(f"{n}: {o}" for n, o in zip(names, seen))))
    return rows


def run_script(name, args, timeout_s, extra_env=None):
    """Run ``benchmarks/<name> <args>``; (exit status, its output, partial on a time-out)."""
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", name), *args]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **(extra_env or {}))
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
        return proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        return 124, f"{text(exc.stdout)}{text(exc.stderr)}\n{name} TIMED OUT after {timeout_s} s"


class Report:
    """``gpu-report.md`` and ``gpu-summary.json``, written again after every step.

    A run cut short (the device's time limit kills it) still leaves a report of the
    steps it finished and names the step it was in.
    """

    STEPS = ("params layout against cuDNN", "gpu tests", "benchmark",
             "frameworks: training steps")

    def __init__(self, out, env):
        self.out, self.env = out, env
        self.sections = {}
        self.summary = dict(environment=env, finished=False)

    def step(self, title, lines, **summary):
        """Record a finished step (or one under way) and write the report now."""
        self.sections[title] = lines
        self.summary.update(summary)
        self.write()

    def write(self):
        lines = ["# pycudnnrnn gpu-check", "", *[f"- {k}: {v}" for k, v in self.env.items()],
                 ""]
        for title in self.STEPS:
            lines += [f"## {title}", "", *self.sections.get(title, ["not reached"]), ""]
        with open(os.path.join(self.out, "gpu-report.md"), "w") as f:
            f.write("\n".join(lines))
        with open(os.path.join(self.out, "gpu-summary.json"), "w") as f:
            json.dump(self.summary, f, indent=2)


def fenced(text):
    return ["```", text.strip(), "```"]


def main():
    env = environment()
    out = os.environ.get("OUT") or os.path.join(ROOT, "gpu-check-report")
    os.makedirs(out, exist_ok=True)
    report = Report(out, env)
    report.step("gpu tests", [f"running (since {datetime.datetime.now():%H:%M:%S}): each "
                              "outcome reaches gpu-tests.log as the test ends"])
    rc, counts, log = run_tests(out)
    outcomes = test_outcomes(os.path.join(out, "gpu-tests.xml")) or log_outcomes(log)
    verdicts = hazard_verdicts(outcomes)
    tail = "\n".join(log.strip().splitlines()[-40:])
    printed = [line for line in log.splitlines()
               if line.startswith(("JAX reserve", "torch.compile reduce-overhead",
                                   "cuDNN reserve space"))]
    report.step("gpu tests", [
        f"passed {counts['passed']}, failed {counts['failures']}, errors {counts['errors']}, "
        f"skipped {counts['skipped']} (pytest exit {rc})", "", *fenced(tail), "",
        "### a verdict per hazard", "", "| hazard | verdict | tests |", "|---|---|---|",
        *[f"| {h} | {v} | {d} |" for h, v, d in verdicts], "",
        *(["```", *printed, "```"] if printed else [])],
        tests=counts, pytest_exit=rc, hazards={h: v for h, v, _ in verdicts})
    layout_rc, layout_text = run_script(
        "gpu_layout.py", ["--json", os.path.join(out, "gpu-layout.json")], LAYOUT_TIMEOUT_S)
    report.step("params layout against cuDNN", fenced(layout_text), layout_exit=layout_rc)
    _, bench = run_script("gpu_bench.py", ["--json", os.path.join(out, "gpu-bench.json")],
                          BENCH_TIMEOUT_S)
    report.step("benchmark", fenced(bench))
    frameworks = []
    for name, args, timeout_s, module, extra_env in FRAMEWORK_BENCHES:
        if importlib.util.find_spec(module) is None:
            frameworks += [f"### {name} (not run: {module} is not installed here)", ""]
        else:
            status, text = run_script(name, args, timeout_s, extra_env)
            frameworks += [f"### {name} (exit {status})", "", *fenced(text), ""]
        report.step("frameworks: training steps", frameworks)
    with open(os.path.join(out, "gpu-frameworks.md"), "w") as f:
        f.write("\n".join(frameworks))
    ok = (rc == 0 and layout_rc == 0 and counts["passed"] > 0
          and counts["failures"] == counts["errors"] == 0)
    report.summary.update(ok=ok, finished=True)
    report.write()
    print(tail)
    print()
    for hazard, verdict, _ in verdicts:
        print(f"{'hazard ' + hazard:60s} {verdict}")
    print()
    print(bench.strip())
    print()
    print(f"{'GPU':28s} {env['gpu']}")
    print(f"{'cuDNN':28s} {env['cudnn']} ({env['cudnn_path']})")
    print(f"{'CuPy / torch':28s} {env['cupy']} / {env['torch']}")
    print(f"{'params layout':28s} {(layout_text.strip().splitlines() or ['?'])[-1]}")
    print(f"{'gpu tests':28s} passed {counts['passed']}, failed {counts['failures']}, "
          f"errors {counts['errors']}, skipped {counts['skipped']}")
    print(f"{'result':28s} {'OK' if ok else 'FAILED'}  (report in {out})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
