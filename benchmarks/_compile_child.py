"""One cold compile of the fixed-work PPO program, for `compile_profile.py` (run it there).

Runs in a fresh process so the compile is cold. `--library jaxplan` compiles
`jax.jit(make_train(plan, n), compiler_options=jaxplan.compiler_options())` of throughput.py's
`FIXED_WORK`; `--library rejax` compiles rejax 0.1.3's `jax.jit(algo.train)` of the same work
(`_rejax_worker.make_algo`; run with rejax's interpreter, never imports jaxplan). Prints one line
`COMPILE_CHILD <json>`: the XLA module's name, trace / lower / XLA compile wall seconds and the
process CPU seconds of the XLA compile, and with `--dump DIR` (XLA's dump of the program there)
the number of kernels XLA compiled (one LLVM module each) by loop depth.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
import time
from collections import Counter


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def jaxplan_program(steps: int):
    import jax
    from throughput import fixed_work_plan

    import jaxplan

    _, plan, n, _ = fixed_work_plan(steps)
    train = jax.jit(jaxplan.make_train(plan, n), compiler_options=jaxplan.compiler_options())
    return train, jax.random.PRNGKey(0)


def rejax_program(steps: int):
    import jax
    from _rejax_worker import BATCH, make_algo

    algo = make_algo(math.ceil(steps / BATCH) * BATCH)
    return jax.jit(algo.train), jax.random.PRNGKey(0)  # compiled as rejax's users do


def kernels_by_depth(dump_dir: str, module: str) -> dict[str, int]:
    """Kernels (LLVM modules in XLA's dump) of `module`, counted by the loop depth of the
    computation that launches them: 0 the program's entry, 1 the loop over iterations, 2 and
    deeper the loops inside it (a rollout's steps, the SGD epochs, their minibatches)."""
    hlo_files = glob.glob(os.path.join(dump_dir, f"*{module}.cpu_after_optimizations.txt"))
    if not hlo_files:
        return {}
    hlo = open(hlo_files[0]).read()
    names = set()
    pattern = rf"{module}\.(?:__compute_module_)?(.*?)(?:_kernel_module)?\.ir-no-opt\.ll"
    for path in glob.glob(os.path.join(dump_dir, f"*{module}.*ir-no-opt.ll")):
        m = re.search(pattern, path)
        if m:
            names.add(m[1])
    where, caller, entry = {}, {}, None
    for comp in re.split(r"\n\n", hlo):
        head = re.match(r"\s*(ENTRY )?%?(\S+)", comp)
        if not head:
            continue
        name = head[2]
        if head[1]:
            entry = name
        for line in comp.split("\n")[1:]:
            inst = re.match(r"\s*(?:ROOT )?%?(\S+) = ", line)
            if not inst:
                continue
            where[inst[1]] = name
            for kind, callee in re.findall(r"(body|condition|to_apply|calls)=%?([\w.\-]+)", line):
                caller.setdefault(callee, (name, kind == "body"))

    def depth(comp: str) -> int:
        d = 0
        while comp != entry and comp in caller:
            comp, is_body = caller[comp]
            d += is_body
        return d

    counts = Counter(depth(where[k]) for k in names if k in where)
    counts["unplaced"] = sum(k not in where for k in names)  # e.g. shared or outlined kernels
    return {str(k): v for k, v in sorted(counts.items(), key=str) if v}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--library", choices=("jaxplan", "rejax"), required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--dump", default=None, help="dump XLA's compiled program here and count")
    args = p.parse_args(argv)
    if args.dump:
        flags = f"--xla_dump_to={args.dump} --xla_dump_hlo_module_re=.*train.*"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}"
    from common import warm_up_backend  # stdlib + jax: safe in rejax's venv

    warm_up_backend()  # the backend's start-up, not billed to the compile
    build = jaxplan_program if args.library == "jaxplan" else rejax_program
    train, key = build(args.steps)
    t0 = time.perf_counter()
    traced = train.trace(key)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2, c2 = time.perf_counter(), cpu_s()
    compiled = lowered.compile()
    t3, c3 = time.perf_counter(), cpu_s()
    module = compiled.as_text().split("\n", 1)[0].split()[1].rstrip(",")
    row = {
        "library": args.library,
        "module": module,
        "trace_s": t1 - t0,
        "lower_s": t2 - t1,
        "xla_s": t3 - t2,
        "xla_cpu_s": c3 - c2,
    }
    if args.library == "rejax":
        assert "jaxplan" not in sys.modules
    if args.dump:
        row["kernels_by_depth"] = kernels_by_depth(args.dump, module)
    print("COMPILE_CHILD " + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
