"""The candidate worker's timing of one benchmark shape, and the checks of the timed calls.

Several input sets are rotated call by call (a cache keyed on the input pointer cannot hit
on consecutive calls) and timed with ``triton.testing.do_bench(..., return_mode="median")``
(which flushes L2 before each call), plus a host-wall cross-check (synchronize; t0; call;
synchronize; t1) so the parent can flag work that escapes the timed stream. The calls the
timer made are checked too: :data:`~coda_agent.verifier.gpu.protocol.TIMED_LOOP_SLOTS` of
them kept by secret reservoir sampling (:func:`reservoir_slot`) and gathered in stream
order right after each, one of the wall-time calls, and one more call in the same rotation
after timing; the timed input sets' checksums must not change. One call's launches are
counted at the shape.
"""

from __future__ import annotations

import gc
import random
import statistics
from typing import Any

import torch

from ..spec import LAUNCH_NAMES_KEPT
from .inputs import rotation_count, tensor_bytes
from .instruments import _perf_counter
from .protocol import (
    BENCH_SEED_BASE,
    TIMED_LOOP_SLOTS,
    BenchShape,
    timed_check_run,
    timed_loop_check_run,
    wall_check_run,
)
from .samples import output_samples

BENCH_WALL_REPS = 7


def reservoir_slot(i: int, k: int, rng: random.Random) -> int | None:
    """Reservoir sampling (Algorithm R) of ``k`` calls: the slot the ``i``-th call (1-based)
    takes, or None. Every call of a stream of any length ends up kept with probability
    k / length, and the draw for call ``i`` needs no knowledge of later calls."""
    j = i - 1 if i <= k else rng.randrange(i)
    return j if j < k else None


def bench_shape(worker: Any, name: str, dims: dict[str, int]) -> dict[str, Any]:
    """Time the entry at one benchmark shape and check the calls it timed (see the module
    docstring); the ``bench`` record's fields. ``worker`` is the run's
    :class:`~coda_agent.verifier.gpu.worker_candidate.Worker`; the ``recheck`` records of the
    checked calls are written through it on the way."""
    assert worker.fn is not None
    set_bytes = tensor_bytes(worker.spec, dims, "inputs")
    n = rotation_count(set_bytes)
    set_inputs = [worker.inputs_for(dims, BENCH_SEED_BASE + worker.plan.secret + k) for k in range(n)]
    sets = [worker.args_of(i) for i in set_inputs]
    sums_before = worker.set_checksums(set_inputs)
    worker.sync()
    counter = [0]
    fn = worker.entry_with(dims)
    # The timed-loop checks (protocol.timed_loop_check_run): TIMED_LOOP_SLOTS of the
    # timer's calls, picked by reservoir sampling with a secret RNG, have their outputs'
    # sampled elements gathered right after them. Sample positions are drawn per input
    # set before timing.
    shape = BenchShape(name=name, dims=dims)
    slots = TIMED_LOOP_SLOTS
    loop_runs = [[timed_loop_check_run(shape, k, worker.plan.secret, j) for k in range(n)] for j in range(slots)]
    loop_idx = [
        [i.to(worker.device) for i in output_samples(worker.spec, dims, r.sample, r.seed)] for r in loop_runs[0]
    ]  # same seed per set
    pick = random.Random(f"{worker.plan.secret}/timed-loop/{name}")
    timing = {"on": False, "calls": 0}
    kept: list[dict[str, Any] | None] = [None] * slots

    def call():
        k = counter[0] % n
        counter[0] += 1
        res = worker.no_host_sync(fn, *sets[k])
        if timing["on"]:
            i = timing["calls"] = timing["calls"] + 1
            j = reservoir_slot(i, slots, pick)
            if j is not None:
                kept[j] = dict(
                    check=worker.gather_timed(loop_runs[j][k], res, set_inputs[k], loop_idx[k]),
                    timed_set=k,
                    timed_call=i,
                )
        return res

    for _ in range(2):
        call()
    worker.sync()
    timing["on"] = True
    event_ms = worker.time_event_ms(call)
    timing["on"] = False
    worker.sync()
    for slot in kept:
        if slot is not None:
            worker.record(
                "recheck",
                **worker.save_gathered(slot["check"], timed_set=slot["timed_set"], timed_call=slot["timed_call"]),
            )
    wall, host = [], []
    # one wall-time call, picked with the secret RNG, is checked too (protocol.wall_check_run)
    wall_pick, wall_kept = pick.randrange(BENCH_WALL_REPS), None
    for w in range(BENCH_WALL_REPS):
        worker.sync()
        k = counter[0] % n
        t0 = _perf_counter()
        res = call()
        host.append((_perf_counter() - t0) * 1e3)  # until the call returned (launches enqueued)
        worker.sync()
        wall.append((_perf_counter() - t0) * 1e3)
        if w == wall_pick:  # gathered after the measurement, outside the timed span
            wall_kept = dict(
                check=worker.gather_timed(
                    wall_check_run(shape, k, worker.plan.secret), res, set_inputs[k], loop_idx[k]
                ),
                timed_set=k,
            )
        del res
    if wall_kept is not None:
        worker.record("recheck", **worker.save_gathered(wall_kept["check"], timed_set=wall_kept["timed_set"]))
    # The launches of one call at this shape (the correctness stage counts them at each
    # correctness shape; a candidate can branch on shape). Recorded for the bench
    # stage, which fails a count over the spec's max_launches.
    launches: dict[str, Any] = {}
    if worker.profiler_ok:
        # a failure to count is recorded (and fails the bench stage), never a crash of the
        # run: on the H200 it counted every accepted kernel at every benchmark shape
        try:
            counted = worker.count_launches(call)  # synchronizes inside
            # every name of a call within budget: the bench stage counts the GEMMs among them
            launches = dict(
                launches=counted.count,
                launch_kernels=counted.kernels[:LAUNCH_NAMES_KEPT],
                workspace_bytes=counted.workspace,
            )
        except Exception as e:  # noqa: BLE001 -- see above; reported by the bench stage
            launches = dict(launch_count_error=f"{type(e).__name__}: {e}"[:300])
    # One more call in the same rotation, indistinguishable from the timed ones: its
    # sampled outputs are judged against the reference of that input set as drawn
    # (protocol.timed_check_run), so work skipped only while timing, or inputs
    # changed during timing, fail the candidate.
    k = counter[0] % n
    res, workspace = worker.measured_call(call)
    check = timed_check_run(BenchShape(name=name, dims=dims), k, worker.plan.secret)
    fields = worker.save_result(check, res, set_inputs[k], {}, timed_set=k, workspace_bytes=workspace)
    changed = [
        i
        for i, (a, b) in enumerate(zip(sums_before, worker.set_checksums(set_inputs), strict=False))
        if not torch.equal(a, b)
    ]
    if changed:
        fields["violations"] = [
            *fields["violations"],
            dict(
                kind="input-mutated",
                output=None,
                message=f"timed input set(s) {changed} at {name} changed during timing (checksums before/after): "
                "inputs are read-only",
            ),
        ]
    worker.record("recheck", **fields)
    del res
    sets.clear()  # the closure `call` holds the lists: empty them to free the inputs
    set_inputs.clear()
    gc.collect()
    if worker.cuda:
        torch.cuda.empty_cache()
    return dict(
        shape=name,
        dims=dims,
        event_ms=event_ms,
        wall_ms=statistics.median(wall),
        host_ms=statistics.median(host),
        guard_host_ms=worker.guard_host_ms(),
        wall_samples_ms=wall,
        timer="do_bench" if worker.cuda else "cpu-loop",
        timer_calls=timing["calls"],
        n_sets=n,
        set_bytes=set_bytes,
        calls=counter[0],
        **launches,
    )
