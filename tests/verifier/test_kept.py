"""verifier/library/kept.py: the kept verdicts folder of ``bench`` (merging shape by shape, folding a
copied-back folder in, reading back, guarding hand-written pages) and what the page says."""

import shutil
from unittest import mock

import pytest
from test_benchrun import ROOT, _accepted
from test_repeats import FWD, SHAPES, TWO, _run

from coda_agent.verifier.library.bench import bench_kernels, page_from_kept, results_markdown
from coda_agent.verifier.library.kept import PAGE_MARK, keep_verdict, merge_kept
from coda_agent.verifier.library.repeats import combine, merge_shapes
from coda_agent.verifier.verdict import Verdict
from coda_agent.verifier.workspace import sha256_file


def _kept_folder(tmp_path, folder):
    """A workspace with swiglu_fwd accepted and ``results/<folder>/`` holding one verdict of it
    (one shape, started t0). Returns (results folder, kept folder)."""
    shutil.copytree(ROOT / "kernel_specs", tmp_path / "kernel_specs")
    h = sha256_file(_accepted(tmp_path, "swiglu_fwd", "good_swiglu_fwd.py"))
    res = tmp_path / "results"
    vdir = res / folder
    vdir.mkdir(parents=True)
    (vdir / "swiglu_fwd.json").write_text(_run(FWD, 1.0, 1.0, started="t0", cand=h).to_json())
    return res, vdir


def test_bench_with_shape_keeps_the_other_shapes_and_the_page_says_when(tmp_path):
    shutil.copytree(ROOT / "kernel_specs", tmp_path / "kernel_specs")
    _accepted(tmp_path, "swiglu_fwd", "good_swiglu_fwd.py")
    calls = []

    def fake(loaded, kernel, bench_shapes=None, **kw):
        calls.append(bench_shapes)
        shapes = [bs for bs in TWO if bench_shapes is None or bs.name in bench_shapes]
        v = _run(loaded, 1.0 + 0.1 * len(calls), 1.0, started=f"t{len(calls)}", shapes=shapes)
        return v.model_copy(update={"candidate_hash": sha256_file(kernel)})

    out = tmp_path / "out"
    bench_kernels(tmp_path, ["swiglu_fwd"], verify_fn=fake, out_dir=out)
    rep = bench_kernels(tmp_path, ["swiglu_fwd"], verify_fn=fake, out_dir=out, bench_shapes=[TWO[1].name], repeat=3)
    kept = next(out.glob("*/swiglu_fwd.json"))
    shapes = Verdict.model_validate_json(kept.read_text()).stage("bench").metrics["shapes"]
    assert set(shapes) == {TWO[0].name, TWO[1].name}  # before: the 3-run verdict replaced the file
    assert shapes[TWO[0].name]["measured_at"] == "t1" and shapes[TWO[1].name]["measured_at"] == "t2"
    text = rep.markdown_path.read_text()
    assert f"Measured in 2 bench calls: t1 ({TWO[0].name}); t2 ({TWO[1].name}); candidate worker: " in text
    assert f"- median of 3 runs at {TWO[1].name} (started t2, t3, t4)" in text
    assert "Kernels whose rows come from more than one bench call" in text and "swiglu_fwd" in text


def test_merge_kept_folds_a_copied_back_folder(tmp_path):
    shutil.copytree(ROOT / "kernel_specs", tmp_path / "kernel_specs")
    kernel = _accepted(tmp_path, "swiglu_fwd", "good_swiglu_fwd.py")
    h = sha256_file(kernel)
    main, src = tmp_path / "main" / "2026-11-30-nvidia-h200", tmp_path / "src" / "2026-11-30-nvidia-h200"
    main.mkdir(parents=True)
    src.mkdir(parents=True)
    (main / "swiglu_fwd.json").write_text(_run(FWD, 1.0, 1.0, started="t0", shapes=TWO, cand=h).to_json())
    (src / "swiglu_fwd.json").write_text(_run(FWD, 1.5, 1.0, started="t9", shapes=TWO[1:], cand=h).to_json())
    (src / "swiglu_bwd.json").write_text("{not json")
    lines = merge_kept(tmp_path, src, main)
    assert (
        "swiglu_fwd: merged, 1 shape(s) from this verdict, 1 from the kept one (a shape in both: the later measurement)"
        in lines
    )
    assert (
        "skipped swiglu_bwd.json: not a readable verdict, left out (1 problem(s); first: (file): Invalid JSON"
        in lines[0]
    )
    shapes = Verdict.model_validate_json((main / "swiglu_fwd.json").read_text()).stage("bench").metrics["shapes"]
    assert shapes[TWO[0].name]["fused_ms"] == 1.0 and shapes[TWO[1].name]["fused_ms"] == 1.5
    with pytest.raises(ValueError, match="not a folder"):
        merge_kept(tmp_path, tmp_path / "nope", main)
    with pytest.raises(ValueError, match="the same folder as --from-verdicts"):
        merge_kept(tmp_path, main, main)
    with pytest.raises(ValueError, match=r"no verdict files \(\*.json\)"):
        merge_kept(tmp_path, tmp_path / "src", main)  # one level too high


def test_a_kept_folder_renders_its_own_page_name(tmp_path):
    """A folder such as <date>-<gpu>-repeat/ gets <date>-<gpu>-repeat.md, never the day's main page."""
    res, rep_dir = _kept_folder(tmp_path, "2026-11-30-nvidia-h200-repeat")
    (res / "2026-11-30-nvidia-h200.md").write_text("main page\n")

    out = page_from_kept(tmp_path, rep_dir)
    assert out.markdown_path == res / "2026-11-30-nvidia-h200-repeat.md"
    text = out.markdown_path.read_text()
    assert text.startswith("# coda-agent benchmark, 2026-11-30")
    # measured at 1 of swiglu_fwd's benchmark shapes: the targets cell says so
    n = len(FWD.spec.shapes.benchmark)
    assert f"| yes at the 1 of {n} shapes measured here |" in text
    assert (res / "2026-11-30-nvidia-h200.md").read_text() == "main page\n"


def test_a_page_bench_did_not_write_is_never_overwritten_without_force(tmp_path):
    res, vdir = _kept_folder(tmp_path, "2026-11-30-nvidia-h200-resample")
    page = res / "2026-11-30-nvidia-h200-resample.md"
    page.write_text("# hand-written run A/B comparison\n")

    with pytest.raises(ValueError, match="was not written by `coda-agent bench`.*--force"):
        page_from_kept(tmp_path, vdir)
    assert page.read_text() == "# hand-written run A/B comparison\n"
    page_from_kept(tmp_path, vdir, force=True)
    text = page.read_text()
    assert text.rstrip("\n").endswith(PAGE_MARK.format(folder=vdir.name))
    page_from_kept(tmp_path, vdir)  # its own page now: re-rendered without --force
    assert page.read_text() == text
    # a live bench into a folder whose page is hand-written keeps the verdicts and says why
    # the page was not written, instead of failing after the measurements
    page.write_text("# hand-written again\n")

    def fake(loaded, kernel, **kw):
        return _run(loaded, 1.2, 1.0, started="t9", cand=sha256_file(kernel))

    with mock.patch("coda_agent.verifier.library.bench.verdicts_dir", lambda out, date, gpu: vdir):
        rep = bench_kernels(tmp_path, ["swiglu_fwd"], verify_fn=fake, out_dir=res)
    assert any(n.startswith("page not written: ") for n in rep.notes)
    assert page.read_text() == "# hand-written again\n"
    kept = Verdict.model_validate_json((vdir / "swiglu_fwd.json").read_text())
    assert kept.stage("bench").metrics["shapes"][SHAPES[0].name]["fused_ms"] == 1.2


def test_a_single_later_run_replacing_a_median_is_named(tmp_path):
    med = combine(
        FWD, [_run(FWD, f, 1.0, started=t, shapes=TWO[1:]) for f, t in ((1.2, "t1"), (1.1, "t2"), (1.3, "t3"))]
    )
    (tmp_path / "swiglu_fwd.json").write_text(
        merge_shapes(FWD, _run(FWD, 1.0, 1.0, started="t0", shapes=TWO), med).to_json()
    )
    out, line = keep_verdict(tmp_path, FWD, _run(FWD, 1.4, 1.0, started="t8", shapes=TWO[1:]))
    assert out.stage("bench").metrics["shapes"][TWO[1].name]["fused_ms"] == 1.4
    assert line.endswith(f"WARNING: a median over more runs gave way to a later one at {TWO[1].name} (3 runs -> 1)")


def test_a_verdict_file_named_after_another_kernel_is_left_out(tmp_path):
    shutil.copytree(ROOT / "kernel_specs", tmp_path / "kernel_specs")
    h = sha256_file(_accepted(tmp_path, "swiglu_fwd", "good_swiglu_fwd.py"))
    src, main = tmp_path / "src" / "2026-11-30-nvidia-h200", tmp_path / "main" / "2026-11-30-nvidia-h200"
    src.mkdir(parents=True)
    main.mkdir(parents=True)
    (src / "foo.json").write_text(_run(FWD, 1.0, 1.0, started="t0", cand=h).to_json())
    with pytest.raises(ValueError, match="(?s)nothing to merge.*foo.json: holds a verdict of 'swiglu_fwd', not 'foo'"):
        merge_kept(tmp_path, src, main)


def test_a_verdict_without_stages_is_left_out_by_name(tmp_path):
    """A kept file with its stages deleted is not rendered as "NOT verified: no GPU": it is
    left off the page, by name."""
    import json

    from coda_agent.verifier.library.kept import day_verdicts

    _, vdir = _kept_folder(tmp_path, "2026-11-30-nvidia-h200")
    d = json.loads((vdir / "swiglu_fwd.json").read_text())
    assert d["stages"]
    del d["stages"]
    (vdir / "swiglu_fwd.json").write_text(json.dumps(d))
    verdicts, notes = day_verdicts(tmp_path, vdir)
    assert verdicts == {} and notes == ["- swiglu_fwd.json: records no stages (missing or empty 'stages'); left out"]


def test_page_names_each_stack_and_does_not_judge_a_failing_run():

    ok = _run(FWD, 1.0, 1.0, started="t0")
    other = _run(FWD, 1.0, 1.0, started="t1", driver="999.0")
    bad = _run(FWD, 1.0, 1.0, started="t2", status="fail")
    text = results_markdown({"swiglu_fwd": ok, "swiglu_bwd": other, "x_fwd": bad}, "2026-11-30")
    assert "The kernels were measured on different GPUs or software versions:" in text
    assert "driver 999.0" in text and "driver None" in text
    row = next(line for line in text.splitlines() if line.startswith("| x_fwd"))
    assert "NOT verified (correctness): numbers not judged" in row
    assert "| yes |" in next(line for line in text.splitlines() if line.startswith("| swiglu_fwd"))
