"""Peak memory of one attention call, each in a fresh process, and the largest n an implementation handles.

A probe (``python -m jaxformer.benchmarks.attention_memory --impl naive --n 8192 ...``) compiles
one call and prints one JSON line with three numbers:

- ``planned_bytes``: XLA's own buffer plan, ``compiled.memory_analysis()`` temporaries +
  arguments + outputs;
- ``peak_added_bytes``: how far the process's peak resident set (``VmHWM``, reset through
  ``/proc/self/clear_refs`` just before the call, so compilation is excluded) rose above its
  resident set before the call: what the operating system actually handed out;
- ``seconds``: the call's wall time.

A probe refuses with status ``memory`` when the plan exceeds the budget, and runs under
``RLIMIT_AS`` = its virtual size + budget, so an allocation failure also reads ``memory``;
a probe that outlives its time budget is killed by the parent and reads ``time``; with
``--plan-only`` it stops after the plan (status ``planned``). The budget stands in for "this
machine": on a shared box, running into the real limit would wake the kernel's OOM killer
for everyone.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.functional.dispatch import attention, check_impl

MODES = ("forward", "train")
_MEMORY_ERRORS = ("RESOURCE_EXHAUSTED", "bad_alloc", "MemoryError", "Cannot allocate memory", "Out of memory")


def attention_call(impl: str, mode: str, n: int, *, batch: int, heads: int, head_dim: int, block_size: int, causal: bool):
    """``(jitted_fn, (q, k, v))`` for self-attention over ``[batch, n, heads, head_dim]`` fp32 inputs.

    ``forward`` returns the output; ``train`` returns ``(sum(out), (dq, dk, dv))``, the attention
    part of a training step.
    """
    check_impl(impl)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((batch, n, heads, head_dim), dtype=np.float32)) for _ in range(3))
    attend = functools.partial(attention, impl=impl, causal=causal, block_size=block_size)
    if mode == "forward":
        return jax.jit(attend), (q, k, v)
    return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(attend(q, k, v)), argnums=(0, 1, 2))), (q, k, v)


def _proc_status_bytes(field: str) -> int:
    """``VmRSS``, ``VmHWM``, ``VmSize`` … of this process, from /proc/self/status (reported in kB)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise ValueError(f"/proc/self/status has no field {field}")


def _probe_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one attention call; prints a JSON line")
    for name in ("--n", "--batch", "--heads", "--head-dim", "--block-size", "--budget-bytes"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--impl", required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--plan-only", action="store_true", help="compile and report XLA's plan, do not run")
    args = parser.parse_args(argv)
    fn, inputs = attention_call(args.impl, args.mode, args.n, batch=args.batch, heads=args.heads,
                                head_dim=args.head_dim, block_size=args.block_size, causal=args.causal)
    stats = fn.lower(*inputs).compile().memory_analysis()
    planned = stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes
    result = {"impl": args.impl, "mode": args.mode, "n": args.n, "planned_bytes": planned}
    if planned > args.budget_bytes:
        result |= {"status": "memory", "detail": f"XLA plans {planned / 2**30:.2f} GiB > budget {args.budget_bytes / 2**30:.2f} GiB"}
    elif args.plan_only:
        result |= {"status": "planned", "detail": f"XLA plans {planned / 2**30:.2f} GiB, within the budget; not run"}
    else:
        limit = _proc_status_bytes("VmSize") + args.budget_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        rss_before = _proc_status_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # resets VmHWM to the current resident set
        start = time.perf_counter()
        try:
            jax.block_until_ready(fn(*inputs))
        except jax.errors.JaxRuntimeError as error:
            # the call runs at smaller n; under the address-space limit a failed allocation is
            # what breaks it (XLA's CPU kernels report it as e.g. "YNNPACK operation failed")
            first_line = str(error).splitlines()[0][:160]
            result |= {"status": "memory", "detail": f"failed under RLIMIT_AS (budget {args.budget_bytes / 2**30:.2f} GiB): {first_line}"}
        else:
            seconds = time.perf_counter() - start
            peak = _proc_status_bytes("VmHWM")
            result |= {"status": "ok", "seconds": seconds, "peak_added_bytes": peak - rss_before, "peak_rss_bytes": peak}
    print(json.dumps(result))
    return 0


def probe(impl: str, mode: str, n: int, *, budget_bytes: int, time_budget_s: float, shape: dict,
          plan_only: bool = False) -> dict:
    """Runs one probe in a subprocess; status ``ok``, ``planned``, ``memory``, ``time`` or ``error`` with a detail."""
    command = [sys.executable, "-m", "jaxformer.benchmarks.attention_memory", "--impl", impl, "--mode", mode,
               "--n", str(n), "--budget-bytes", str(int(budget_bytes))]
    for name in ("batch", "heads", "head_dim", "block_size"):
        command += [f"--{name.replace('_', '-')}", str(shape[name])]
    command += (["--causal"] if shape["causal"] else []) + (["--plan-only"] if plan_only else [])
    base = {"impl": impl, "mode": mode, "n": n}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=time_budget_s)
    except subprocess.TimeoutExpired:
        return base | {"status": "time", "detail": f"probe ran past its {time_budget_s:g} s time budget"}
    if done.returncode == 0:
        return json.loads(done.stdout.strip().splitlines()[-1])
    last_line = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:200]
    # SIGKILL is the kernel's OOM killer; SIGABRT is XLA aborting on a failed allocation under RLIMIT_AS
    out_of_memory = done.returncode in (-9, -6) or any(marker in done.stderr for marker in _MEMORY_ERRORS)
    return base | {"status": "memory" if out_of_memory else "error", "detail": f"exit {done.returncode}: {last_line}"}


def _time_stop(probes: list[dict], n: int, time_budget_s: float, deadline: float, total_time_s: float) -> str | None:
    """Why the call at ``n`` should not be run for time, or None.

    Its time is extrapolated from the last two runs with their local slope: same ratio again.
    """
    done = [p for p in probes if p["status"] == "ok"]
    if len(done) >= 2:
        predicted_s = done[-1]["seconds"] ** 2 / done[-2]["seconds"]
        if predicted_s > time_budget_s:
            return f"n = {n} predicted at {predicted_s:.0f} s > time budget {time_budget_s:g} s"
    if time.monotonic() > deadline:
        return f"total time budget {total_time_s:g} s spent before n = {n}"
    return None


def largest_n(impl: str, mode: str, *, start_n: int, max_n: int, budget_bytes: int, time_budget_s: float,
              total_time_s: float, shape: dict) -> dict:
    """Doubles n from ``start_n``, running one call per n, until one is refused or ``max_n`` is passed.

    Once time stops the runs (predicted, or a probe killed), the doubling goes on with
    plan-only probes (compile, no run), so the report says how far XLA's memory plan fits the
    budget. ``limited_by`` names what refused the first n not handled: ``memory`` when its
    plan (or allocation) does not fit, whatever the time; else ``time``; ``none`` at the cap.
    """
    if start_n < 1:  # n doubles from start_n: from 0 it would stay 0 for ever
        raise ValueError(f"the memory search starts at a positive n, got {start_n}")
    deadline = time.monotonic() + total_time_s
    probes: list[dict] = []
    time_stop = None  # why calls stopped being run
    n = start_n
    while n <= max_n:
        time_stop = time_stop or _time_stop(probes, n, time_budget_s, deadline, total_time_s)
        if time_stop is None:
            probes.append(probe(impl, mode, n, budget_bytes=budget_bytes, time_budget_s=time_budget_s, shape=shape))
            if probes[-1]["status"] == "ok":
                n *= 2
                continue
            if probes[-1]["status"] != "time":
                break
            time_stop = f"n = {n}: {probes[-1]['detail']}"
        probes.append(probe(impl, mode, n, budget_bytes=budget_bytes, time_budget_s=time_budget_s, shape=shape,
                            plan_only=True))
        if probes[-1]["status"] != "planned":
            break
        n *= 2
    handled = max((p["n"] for p in probes if p["status"] == "ok"), default=None)
    first_refused = start_n if handled is None else 2 * handled
    refusals = {p["status"]: p["detail"] for p in probes if p["n"] == first_refused and p["status"] != "planned"}
    if "memory" in refusals:
        limited_by, detail = "memory", f"n = {first_refused}: {refusals['memory']}"
        detail += f" (time alone: {time_stop})" if time_stop else ""
    elif time_stop:
        limited_by, detail = "time", time_stop
    elif refusals:
        limited_by, detail = "error", f"n = {first_refused}: {refusals.popitem()[1]}"
    else:
        limited_by, detail = "none", f"reached the cap n = {max_n}"
    return {"impl": impl, "mode": mode, "largest_n": handled, "limited_by": limited_by, "detail": detail,
            "plan_fits_up_to": max((p["n"] for p in probes if p["status"] in ("ok", "planned")), default=None),
            "probes": probes}


if __name__ == "__main__":
    sys.exit(_probe_main())
