"""README.md and ARCHITECTURE.md cannot drift from the tree and the command line.

* Sizes: README.md at most 10 KB, ARCHITECTURE.md at most 20 KB.
* Every relative link (``[text](path)``, ``![alt](path)``) and every backticked repository
  path of both pages names a file or folder that exists, inside the repository.
* No page names a machine's own paths or tells history (the rules go there, the history
  goes to CHANGELOG.md).
* The README's quickstart ("no GPU, no API key") is one fenced block; each of its commands
  runs here, ``coda-agent`` replaced by ``python -m coda_agent``, in a copy of the
  workspace under ``tmp_path`` (the tree is never written), and must exit 0 with a telling
  piece of output. ``RUN`` stands for the run the manual ``generate`` before it created;
  the test answers that run with the spec's accepted kernel before resuming it. Commands
  that compile for sm_90a are marked ``slow`` and ``compile``.
* Every command of the README's command table is a subcommand of ``coda-agent --help``,
  and every flag the table names exists in that subcommand's ``--help``.
* Every other command in the README's fenced blocks at least parses: ``coda-agent``
  commands (the GPU and API-key ones are not run) use flags their subcommand has, pip
  extras exist in pyproject.toml, pytest markers are registered.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
PAGES = (README, ARCHITECTURE)
MAX_BYTES = {README: 10 * 1024, ARCHITECTURE: 20 * 1024}

QUICKSTART_HEADING = "## Quickstart: no GPU, no API key"
COMMANDS_HEADING = "## Commands"
RUN_PLACEHOLDER = "RUN"
TOP_LEVEL = (
    "agent/",
    "verifier/",
    "generated_kernels/",
    "kernel_specs/",
    "benchmarks/",
    "docs/",
    "tests/",
    "primitives_docs/",
    ".ci/",
)
WORKSPACE = ("kernel_specs", "generated_kernels", "primitives_docs", "tricks_log.md")

FENCE_RE = re.compile(r"^```(?P<lang>[a-z]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
LINK_RE = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_RE = re.compile(r"`([^`\n]+)`")
FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
FORBIDDEN = re.compile(
    r"/work/|\.\./shared|\bsessions? \d+|red[- ]team|this session|the fix below|\brounds? \d+", re.IGNORECASE
)


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` (a ``## `` line) up to the next ``## `` heading."""
    start = text.find("\n" + heading + "\n")
    assert start >= 0, f"README.md has no section {heading!r}"
    rest = text[start + len(heading) + 2 :]
    end = rest.find("\n## ")
    return rest if end < 0 else rest[:end]


def _blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group("lang"), m.group("body")) for m in FENCE_RE.finditer(text)]


def _commands(body: str) -> list[list[str]]:
    """The command lines of a shell block, split as the shell would (comments dropped)."""
    out = []
    for line in body.splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            out.append(argv)
    return out


def quickstart() -> list[list[str]]:
    section = _section(_text(README), QUICKSTART_HEADING)
    blocks = [b for lang, b in _blocks(section) if lang in ("bash", "sh", "")]
    assert len(blocks) == 1, f"the quickstart must hold exactly one fenced shell block, found {len(blocks)}"
    return _commands(blocks[0])


def _compiles(argv: list[str]) -> bool:
    """Whether the command compiles a candidate for sm_90a (tens of seconds on 2 cores)."""
    return argv[1] in ("verify", "regress") or "--resume" in argv


def _quickstart_params():
    try:
        cmds = quickstart()
    except (AssertionError, OSError) as e:  # test_quickstart_is_one_block reports it
        return [pytest.param(None, id="unreadable", marks=pytest.mark.skip(reason=str(e)))]
    params = []
    for i, argv in enumerate(cmds):
        marks = [pytest.mark.slow, pytest.mark.compile] if _compiles(argv) else []
        params.append(
            pytest.param(argv, id=f"{i}-{'-'.join(a for a in argv[1:3] if not a.startswith('-'))}", marks=marks)
        )
    return params


# --------------------------------------------------------------------------- the pages


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_size(page: Path):
    size = len(page.read_bytes())
    assert size <= MAX_BYTES[page], f"{page.name} is {size} bytes, over its {MAX_BYTES[page]}-byte limit"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_exist(page: Path):
    bad = []
    for target in LINK_RE.findall(_text(page)):
        if re.match(r"[a-z][a-z+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the page
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT):
            bad.append(f"{target} (outside the repository)")
        elif not path.exists():
            bad.append(target)
    assert not bad, f"{page.name}: links to missing files: {bad}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_backticked_paths_exist(page: Path):
    bad = []
    for code in CODE_RE.findall(_text(page)):
        token = code.split()[0] if code.split() else ""
        if not token.startswith(TOP_LEVEL) or any(c in token for c in "<>*{}|"):
            continue
        if not (ROOT / token.rstrip(",.;:")).exists():
            bad.append(token)
    assert not bad, f"{page.name}: backticked paths that do not exist: {bad}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_machine_paths_or_history(page: Path):
    hits = [m.group(0) for m in FORBIDDEN.finditer(_text(page))]
    assert not hits, f"{page.name}: machine paths or history ({hits}); state rules, history goes to CHANGELOG.md"


def test_quickstart_is_one_block():
    cmds = quickstart()
    assert cmds, "the quickstart block holds no command"
    assert all(argv[0] == "coda-agent" for argv in cmds), [argv[0] for argv in cmds]


def test_apply_coda_one_liner():
    text = _text(README)
    assert "from coda_agent.kernels import apply_coda; model = apply_coda(model)" in text
    # the one-liner states its measured speedup and links the page that measured it
    assert "benchmarks/results/2026-12-02-nvidia-h200-hf-llama.md" in text
    assert (ROOT / "benchmarks/results/2026-12-02-nvidia-h200-hf-llama.md").is_file()
    import coda_agent.kernels

    assert callable(coda_agent.kernels.apply_coda)


def test_test_commands_and_markers():
    section = _section(_text(README), "## Run the tests")
    cmds = [c for _, b in _blocks(section) for c in _commands(b)]
    assert ["python", "-m", "pytest", "-n", "2"] in cmds, cmds
    assert ["python", "-m", "pytest", "-n", "2", "--compile"] in cmds, cmds
    assert ["python", "-m", "pytest", "-n", "2", "-m", "not slow"] in cmds, cmds
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest -q -n 2 --compile\n" in ci  # CI runs everything
    markers = {
        m.split(":")[0]
        for m in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    }
    assert {"slow", "compile", "gpu"} <= markers, markers
    pytest.importorskip("xdist", reason="-n 2 needs pytest-xdist (the dev extra)")


# --------------------------------------------------------------------------- the command line


def _cli(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coda_agent", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@functools.lru_cache(maxsize=None)
def _help(*sub: str) -> str:
    res = _cli(*sub, "--help")
    assert res.returncode == 0, f"coda-agent {' '.join(sub)} --help exited {res.returncode}: {res.stderr[-2000:]}"
    return res.stdout


def _subcommands() -> set[str]:
    text = _help()
    block = text.split("positional arguments:", 1)[1].split("options:", 1)[0]
    return {m.group(1) for m in re.finditer(r"^ {4}(\w+)\s", block, re.MULTILINE)}


def _help_of(argv: list[str]) -> str:
    """--help of the (sub)command ``argv`` names (``tricks add`` is two levels)."""
    sub = argv[1]
    if sub == "tricks":
        return _help("tricks", argv[2] if len(argv) > 2 and not argv[2].startswith("-") else "add")
    return _help(sub)


def _table_rows(section: str) -> list[list[str]]:
    rows = []
    for line in section.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows.append(cells)
    return rows[1:]  # the header


@pytest.mark.slow
def test_command_table_matches_the_cli():
    rows = _table_rows(_section(_text(README), COMMANDS_HEADING))
    assert rows, "the README's command table is empty"
    subs = _subcommands()
    listed = set()
    for cells in rows:
        assert len(cells) == 3, f"a command table row needs 3 cells (command | what it does | exit codes): {cells}"
        m = re.match(r"`([^`]+)`", cells[0])
        assert m, f"the first cell names the command in backticks: {cells[0]!r}"
        argv = ["coda-agent", *m.group(1).replace("\\|", "|").split()]
        assert argv[1] in subs, f"`{argv[1]}` is not a subcommand of coda-agent --help ({sorted(subs)})"
        listed.add(argv[1])
        help_text = _help_of(argv)
        for flag in FLAG_RE.findall(cells[0] + " " + cells[1]):
            assert flag in help_text, f"README command table: `{argv[1]}` has no {flag} (coda-agent {argv[1]} --help)"
        assert re.search(r"\b0\b", cells[2]), f"exit codes of `{argv[1]}` must include 0: {cells[2]!r}"
    assert listed == subs, f"commands missing from the README's table: {sorted(subs - listed)}"


def test_every_readme_command_parses():
    """Every fenced command of the README is runnable as written; the GPU and API-key ones are
    not run here, but their subcommand and flags must exist."""
    text = _text(README)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(pyproject["optional-dependencies"])
    checked = 0
    for lang, body in _blocks(text):
        if lang not in ("bash", "sh", ""):
            continue
        for argv in _commands(body):
            if argv[0] == "coda-agent":
                help_text = _help_of(argv)
                for flag in (a for a in argv if a.startswith("--")):
                    assert flag in help_text, f"README: `{shlex.join(argv)}`: coda-agent {argv[1]} has no {flag}"
                checked += 1
            elif argv[:3] == ["pip", "install", "-e"]:
                m = re.fullmatch(r"\.\[([a-z0-9,-]+)\]", argv[3])
                assert m, argv
                missing = set(m.group(1).split(",")) - extras
                assert not missing, f"README installs extras pyproject.toml does not define: {missing}"
            elif argv[:2] == ["pip", "install"] and argv[2].startswith("torch=="):
                version = tuple(int(x) for x in argv[2].split("==")[1].split(".")[:2])
                torch_req = next(d for d in pyproject["dependencies"] if d.startswith("torch"))
                low, high = re.findall(r"(\d+\.\d+)", torch_req)[:2]
                as_tuple = lambda s: tuple(int(x) for x in s.split("."))  # noqa: E731
                assert as_tuple(low) <= version < as_tuple(high), f"README's {argv[2]} is outside {torch_req}"
    assert checked >= 3, "the README's fenced blocks hold fewer coda-agent commands than expected"


def test_every_flag_the_readme_mentions_exists():
    """A flag named anywhere in the README (prose included) is a flag of some subcommand, or
    one that the test suite adds to pytest (tests/conftest.py)."""
    known = "".join(_help(sub) for sub in sorted(_subcommands())) + _help("tricks", "add")
    known += " ".join(re.findall(r'addoption\(\s*"(--[\w-]+)"', (ROOT / "tests" / "conftest.py").read_text()))
    lines = [ln for ln in _text(README).splitlines() if not ln.lstrip().startswith(("pip ", "python"))]
    missing = sorted({f for f in FLAG_RE.findall("\n".join(lines)) if f not in known})
    assert not missing, f"README mentions flags no coda-agent subcommand has: {missing}"


def test_python_m_coda_agent_is_the_command():
    res = _cli("--version")
    assert res.returncode == 0 and res.stdout.startswith("coda-agent"), (res.returncode, res.stdout, res.stderr)


# --------------------------------------------------------------------------- the quickstart, run


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A copy of the workspace the quickstart reads (specs, kernels, docs, tricks log)."""
    ws = tmp_path / "checkout"
    ws.mkdir()
    for name in WORKSPACE:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, ws / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, ws / name)
    return ws


def _env() -> dict[str, str]:
    """No GPU, no API key, the workspace found from the current folder."""
    env = {k: v for k, v in os.environ.items() if k not in ("CODA_ROOT", "ANTHROPIC_API_KEY")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _local(arg: str, ws: Path) -> str:
    """A README path under /tmp/ becomes one beside the test's workspace copy."""
    return str(ws.parent / arg.removeprefix("/tmp/")) if arg.startswith("/tmp/") else arg


def _run(argv: list[str], ws: Path) -> subprocess.CompletedProcess:
    assert argv[0] == "coda-agent", argv
    return _cli(*(_local(a, ws) for a in argv[1:]), cwd=ws, env=_env(), timeout=900)


def _answer(ws: Path, spec: str) -> str:
    """Answer the one waiting run with the spec's accepted kernel; return the run's name."""
    runs = sorted((ws / "runs").iterdir())
    assert len(runs) == 1, runs
    module = (ws / "generated_kernels" / spec / "kernel.py").read_text()
    (runs[0] / "attempt-1" / "response.md").write_text(f"```python\n{module}```\n")
    return runs[0].name


def _expect(argv: list[str], res: subprocess.CompletedProcess, ws: Path) -> None:
    """The exit code and a telling piece of output of one quickstart command."""
    shown = (
        f"`{shlex.join(argv)}` exited {res.returncode}\nstdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-3000:]}"
    )
    assert res.returncode == 0, shown
    sub = argv[1]
    if sub == "list":
        assert "swiglu_fwd" in res.stdout and "yes (" in res.stdout, shown
    elif sub == "prompt":
        out = ws / _local(argv[argv.index("--out") + 1], ws) if "--out" in argv else None
        text = out.read_text() if out is not None else res.stdout
        assert argv[2] in text and "tokens" in res.stderr, shown
    elif sub == "review":
        assert f"# Review: {argv[2]}" in res.stdout, shown
    elif sub == "verify":
        assert "passed the stages that ran" in res.stdout, shown
    elif sub == "generate" and "--resume" in argv:
        assert "passed-cpu-only" in res.stdout, shown
    elif sub == "generate":
        assert "waiting-for-answer" in res.stdout, shown
        assert list((ws / "runs").glob("*/attempt-1/prompt.md")), shown
    else:
        pytest.fail(f"no expectation for the quickstart command `{shlex.join(argv)}`: add one to {__file__}")


@pytest.mark.parametrize("argv", _quickstart_params())
def test_quickstart_command_runs(argv: list[str], workspace: Path):
    if "--resume" in argv:
        spec = argv[2]
        started = [a for a in quickstart() if a[1] == "generate" and a[2] == spec and "--resume" not in a]
        assert started, f"the quickstart resumes a {spec} run it never starts"
        _expect(started[0], _run(started[0], workspace), workspace)
        run = _answer(workspace, spec)
        assert RUN_PLACEHOLDER in argv, argv
        argv = [run if a == RUN_PLACEHOLDER else a for a in argv]
    _expect(argv, _run(argv, workspace), workspace)
