# Over 600 lines: one check per language of README block, with the fixtures they run on.
"""Every fenced code block of README.md, checked by its language tag, so the front door cannot
go stale. Run by ctest (test `readme.blocks`, tests/readme/CMakeLists.txt) with the build's
paths in the environment; by hand:

    FLOWSTATE_BUILD_DIR=build/dev /usr/bin/python3 -m pytest -q tests/readme

What each language gets:

- ```python: executed by this interpreter in a fresh temporary directory, with PYTHONPATH at
  the build's python/ directory and the build's `flowstate` command first on PATH, as a script
  README.md.py whose line numbers are the README's (a traceback's line is the README's).
- ```cpp: compiled to an object file (c++ -std=c++20 -c) against the build tree's include
  layout, the installed one: <flowstate/...> resolves only through <build>/include/flowstate,
  and a quoted include ("examples/plugin/take.h") through the repository root (-iquote), as
  it would from a project's own root. The block's leading #include / using / comment lines stay
  at namespace scope and the rest becomes the body of a function `void readme_block_LINE()`;
  a block with its own `int main(` is a full program and is compiled as it is (none is today;
  such a block is compiled, not linked). `#line` directives make errors name README.md lines.
- ```yaml: written beside a `build/dev` link to the tested build tree (the README's plugin
  paths name the dev preset's tree, relative to the YAML file), then `flowstate validate
  --no-data`; with a data fixture, `flowstate validate` on the data (the first batch).
- ```sh: `bash -n` on the block, then each command is checked without running it: `bash
  SCRIPT ARGS` (the script exists, parses, and mentions each --option), `cmake --preset P`
  (a configure preset), `cmake --build|--install DIR` (a preset's binaryDir), `flowstate
  [--plugin P] COMMAND ...` (the command exists and its --help lists each --option; the plugin
  exists in the build), `mpirun -np N ...` (the command after it). Any other command fails:
  teach this file to check it, or mark the block.
- ```cmake: `find_package(flowstate VERSION ...)` is checked against the build's
  flowstateConfigVersion.cmake (cmake -P), and each `flowstate::NAME` against the targets the
  build exports. The find_package itself is exercised end to end by
  Package.AConsumerBuildsAgainstTheInstalledTree (tests/package/).
- untagged or ```text: a layout listing; every entry `dir/` at the start of a line must be a
  directory of the repository.
- any other tag: a failure (teach this file, or mark the block).

The convention: an HTML comment on the last non-blank line before a block's opening fence
(invisible on GitHub), with directives separated by `;`:

    <!-- readme-test: continues -->
        the block continues the previous block of its language (python: the same interpreter,
        namespace and directory; cpp: the same translation unit, after it, with its own
        function body). Only for python and cpp.
    <!-- readme-test: fixture=NAME[,NAME...] -->
        the harness prepares the block's directory (data, files) and/or gives it code: see
        FIXTURES below (a fixture may take an argument, `records:16`). Python gets a module's
        names (`from readme_fixtures import *`, only the names the fixture declares: a block
        that forgets `import torch` still fails); C++ gets code before its blocks. A chain
        gets the fixtures of all its blocks. Add a fixture here when a block needs one.
    <!-- readme-test: skip=REASON -->
        the block is not checked; REASON is required and reported. Nothing is skipped otherwise.

A marker that is not right before a block, an unknown directive or fixture, or a `continues`
with nothing to continue is a failure. The summary at the end of the run counts the blocks of
each language and what was done with them (also on success: `ctest -V -R readme`).
"""
import concurrent.futures
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SOURCE_DIR = Path(os.environ.get("FLOWSTATE_SOURCE_DIR", HERE.parent.parent)).resolve()
README = Path(os.environ.get("FLOWSTATE_README", SOURCE_DIR / "README.md")).resolve()
BUILD_DIR = Path(os.environ.get("FLOWSTATE_BUILD_DIR", SOURCE_DIR / "build" / "dev")).resolve()
CLI = Path(os.environ.get("FLOWSTATE_CLI", BUILD_DIR / "cli" / "flowstate"))
# Set by tests/readme/CMakeLists.txt; the fallbacks serve a run by hand on the dev tree.
PYTHONPATH = os.environ.get("FLOWSTATE_README_PYTHONPATH", str(BUILD_DIR / "python"))
CXX = os.environ.get("FLOWSTATE_README_CXX", "c++")
_includes = os.environ.get("FLOWSTATE_README_INCLUDES", str(BUILD_DIR / "include"))
INCLUDES = list(dict.fromkeys(p for p in _includes.split("|") if p))
DEFINES = [d for d in os.environ.get("FLOWSTATE_README_DEFINES", "").split("|") if d]
TIMEOUT_S = 60  # one chain of blocks

LANGUAGES = {"python", "cpp", "yaml", "sh", "cmake", "text"}
CHAINING = {"python", "cpp"}  # the languages `continues` applies to


# ---- fixtures: what a marker's `fixture=NAME` prepares ----

def _gen_records(directory, arg):
    """records:R -- data/part-0000{0,1}.bin, 4096 records of R bytes (`flowstate gen records`),
    and pipeline.yaml over them: records -> shuffle (buffer, 256) -> batch (32), seed 1234."""
    if not arg or not arg.isdigit():
        raise ValueError("fixture records needs the record size: records:16")
    _check([str(CLI), "gen", "records", "--out", str(directory / "data"), "--records", "4096",
            "--record-bytes", arg, "--shards", "2"], cwd=directory)
    (directory / "pipeline.yaml").write_text(
        "seed: 1234\n"
        f"source: {{type: records, paths: \"data/*.bin\", record_bytes: {arg}}}\n"
        "nodes:\n  - shuffle: {mode: buffer, size: 256}\n  - batch: {size: 32}\n")


@dataclasses.dataclass
class Fixture:
    doc: str
    setup: object = None  # fn(directory, arg): prepares the block's directory
    code: dict = dataclasses.field(default_factory=dict)  # language -> code prepended
    names: tuple = ()  # python: the names the block sees (nothing else leaks, not `torch`)


FIXTURES = {
    "records": Fixture(doc=_gen_records.__doc__, setup=_gen_records),
    # The trainer's side of the README's Python loop: the names it leaves to the reader.
    "training": Fixture(
        doc="python: a tiny `model` (Linear(1, 1) on each row's mean), its `optimizer` (SGD) "
            "and `loss_fn(model, data, target=None)` (squared error to target, or to 0), for "
            "any batch shape",
        code={"python": (
            "import torch\n"
            "torch.manual_seed(0)\n"
            "model = torch.nn.Linear(1, 1)\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
            "def loss_fn(model, data, target=None):\n"
            "    x = torch.as_tensor(data).float().reshape(len(data), -1)\n"
            "    y = model(x.mean(dim=1, keepdim=True))\n"
            "    t = 0 if target is None else torch.as_tensor(target).float().reshape(y.shape)\n"
            "    return (y - t).pow(2).mean()\n")},
        names=("model", "optimizer", "loss_fn")),
    # A map-style dataset as torch's DataLoader takes one.
    "dataset": Fixture(
        doc="python: `dataset`, map-style (__len__/__getitem__): 256 tuples (x, y), x a float32 "
            "tensor [16] (i/256 everywhere), y the int label i % 10",
        code={"python": (
            "import torch\n"
            "class _Dataset:\n"
            "    def __len__(self):\n"
            "        return 256\n"
            "    def __getitem__(self, i):\n"
            "        if not 0 <= i < 256:\n"
            "            raise IndexError(i)\n"
            "        return torch.full((16,), i / 256), i % 10\n"
            "dataset = _Dataset()\n")},
        names=("dataset",)),
    # The trainer's side of the README's C++ loop.
    "trainer": Fixture(
        doc="cpp: the trainer's functions the README's loop calls: train_step(tensor), "
            "flush_accumulated_gradients(), log(...)",
        code={"cpp": (
            "template <class T> void train_step(const T&) {}\n"
            "inline void flush_accumulated_gradients() {}\n"
            "template <class... T> void log(const T&...) {}\n")}),
}


# ---- the README's blocks ----

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!--\s*readme-test:(?P<body>.*?)-->\s*$")


@dataclasses.dataclass
class Block:
    lang: str
    line: int  # README line of the block's first line of code
    text: str
    section: str
    continues: bool = False
    skip: str = None
    fixtures: list = dataclasses.field(default_factory=list)

    @property
    def id(self):
        return f"{self.lang}-L{self.line}"


def parse_marker(body, line, problems):
    """The directives of one marker: (continues, skip reason, fixtures)."""
    continues, skip, fixtures = False, None, []
    for item in (i.strip() for i in body.split(";")):
        if not item:
            continue
        key, _, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if key == "continues" and not value:
            continues = True
        elif key == "skip" and value:
            skip = value
        elif key == "fixture" and value:
            for f in (f.strip() for f in value.split(",")):
                if f.partition(":")[0] not in FIXTURES:
                    problems.append(f"README.md:{line}: unknown fixture '{f}' "
                                    f"(known: {', '.join(sorted(FIXTURES))})")
                fixtures.append(f)
        else:
            problems.append(f"README.md:{line}: unknown or incomplete directive '{item}' "
                            "(continues | skip=REASON | fixture=NAME[,NAME])")
    return continues, skip, fixtures


def parse_readme(text):
    """(blocks, problems) of a Markdown text."""
    blocks, problems = [], []
    lines = text.split("\n")
    headings = {}
    marker = None  # (line, directives) waiting for its block
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if not m:
            mm = MARKER.match(line)
            if mm:
                if marker:
                    problems.append(f"README.md:{marker[0]}: marker not followed by a code block")
                marker = (i + 1, parse_marker(mm.group("body"), i + 1, problems))
            elif line.strip():
                if marker:
                    problems.append(f"README.md:{marker[0]}: marker not followed by a code block")
                    marker = None
                h = re.match(r"^(#{1,6})\s+(.*)$", line)
                if h:
                    level = len(h.group(1))
                    headings = {k: v for k, v in headings.items() if k < level}
                    headings[level] = h.group(2).strip()
            i += 1
            continue
        indent, fence = len(m.group("indent")), m.group("fence")
        info = m.group("info").strip()
        lang = info.split()[0].lower() if info else "text"
        close = re.compile(r"^ *" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
        body, j = [], i + 1
        while j < len(lines) and not close.match(lines[j]):
            raw = lines[j]
            strip = len(raw) - len(raw.lstrip(" "))
            body.append(raw[min(strip, indent):])
            j += 1
        if j == len(lines):
            problems.append(f"README.md:{i + 1}: code block never closed")
        continues, skip, fixtures = marker[1] if marker else (False, None, [])
        marker = None
        blocks.append(Block(lang=lang, line=i + 2, text="\n".join(body) + "\n",
                            section=" > ".join(headings[k] for k in sorted(headings)),
                            continues=continues, skip=skip, fixtures=fixtures))
        i = j + 1
    if marker:
        problems.append(f"README.md:{marker[0]}: marker not followed by a code block")
    return blocks, problems


def chains(blocks, problems):
    """The blocks to check, in groups run together: a block and those that continue it."""
    groups, last = [], {}
    for b in blocks:
        if b.lang not in LANGUAGES and not b.skip:
            problems.append(f"README.md:{b.line}: no check for ```{b.lang} blocks: teach "
                            "tests/readme/test_readme.py, or mark it skip=REASON")
        if b.continues:
            prev = last.get(b.lang)
            if b.lang not in CHAINING:
                problems.append(f"README.md:{b.line}: `continues` applies to python and cpp only")
            elif prev is None:
                problems.append(f"README.md:{b.line}: `continues`, but no earlier {b.lang} block")
            elif prev[0].skip and not b.skip:
                problems.append(f"README.md:{b.line}: continues a skipped block; skip it too")
            else:
                prev.append(b)
                continue
        groups.append([b])
        last[b.lang] = groups[-1]
    return groups


# ---- running things ----

class BlockFailure(Exception):
    pass


def _check(cmd, cwd=None, env=None, timeout=TIMEOUT_S, what=None):
    """Runs cmd; its output, or a BlockFailure with the output when it fails."""
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    except subprocess.TimeoutExpired as e:
        raise BlockFailure(f"{what or cmd[0]}: timed out after {timeout} s\n{e.output or ''}")
    if p.returncode != 0:
        raise BlockFailure(f"{what or shlex.join(map(str, cmd))}: exit status {p.returncode}\n"
                           f"{p.stdout}")
    return p.stdout


def _prepare(chain, directory, lang):
    """Runs the chain's fixtures' setup in directory; the code they prepend, for lang."""
    prelude, names = [], []
    seen = set()
    for name in (f for b in chain for f in b.fixtures):
        if name in seen:
            continue
        seen.add(name)
        base, _, arg = name.partition(":")
        fixture = FIXTURES[base]
        if fixture.setup:
            fixture.setup(directory, arg)
        if lang in fixture.code:
            prelude.append((base, fixture.code[lang]))
            names += fixture.names
        elif not fixture.setup:
            raise BlockFailure(f"fixture '{base}' has nothing for {lang} blocks")
    if lang == "python" and prelude:
        prelude.append(("names", f"__all__ = {names!r}\n"))
    return prelude


def python_script(chain, prelude):
    """The script run for a chain of python blocks: each block at its README line numbers
    (blank lines between), so that tracebacks name README lines, as a real main script (so
    that multiprocessing and pickle find the functions it defines). The fixtures' code is a
    module of its own, imported on line 1."""
    lines = ["from readme_fixtures import *  # tests/readme/test_readme.py's fixtures" if prelude
             else "# generated by tests/readme/test_readme.py from README.md"]
    for b in chain:
        lines += [""] * (b.line - 1 - len(lines))
        lines += b.text.rstrip("\n").split("\n")
    return "\n".join(lines) + "\n"


def run_python(chain, directory):
    if not (Path(PYTHONPATH) / "flowstate").is_dir():
        raise BlockFailure(f"the flowstate Python package is not built ({PYTHONPATH}/flowstate "
                           "is missing): build with FLOWSTATE_WITH_PYTHON (python3-dev, "
                           "pybind11-dev) to check the README's Python")
    prelude = _prepare(chain, directory, "python")
    if prelude:
        (directory / "readme_fixtures.py").write_text(
            "".join(f"# fixture {name}\n{code}" for name, code in prelude))
    (directory / "README.md.py").write_text(python_script(chain, prelude))
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, PYTHONDONTWRITEBYTECODE="1",
               PATH=f"{CLI.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    out = _check([sys.executable, "README.md.py"], cwd=directory, env=env, what="python")
    return "ran", out


HEADER_LINE = re.compile(r"^\s*($|//|#|using\s.*;\s*(//.*)?$|namespace\s+\w+\s*=.*;)")


def cpp_translation_unit(chain, prelude):
    """The source compiled for a chain of cpp blocks."""
    out = ["// generated by tests/readme/test_readme.py from README.md"]
    for name, code in prelude:
        out += [f'#line 1 "<fixture {name}>"', code]
    readme = str(README).replace("\\", "\\\\").replace('"', '\\"')
    for b in chain:
        lines = b.text.rstrip("\n").split("\n")
        if re.search(r"\bint\s+main\s*\(", b.text):
            out += [f'#line {b.line} "{readme}"', *lines]
            continue
        n = 0
        while n < len(lines) and HEADER_LINE.match(lines[n]):
            n += 1
        out += [f'#line {b.line} "{readme}"', *lines[:n]]
        out += [f"void readme_block_{b.line}() {{", f'#line {b.line + n} "{readme}"',
                *lines[n:], "}"]
    return "\n".join(out) + "\n"


def compile_cpp(chain, directory):
    source = directory / "readme.cpp"
    source.write_text(cpp_translation_unit(chain, _prepare(chain, directory, "cpp")))
    cmd = [CXX, "-std=c++20", "-c", "-o", str(directory / "readme.o")]
    cmd += [f"-I{d}" for d in INCLUDES] + [f"-D{d}" for d in DEFINES]
    cmd += ["-iquote", str(SOURCE_DIR), str(source)]
    _check(cmd, cwd=directory, what="c++")
    if not (directory / "readme.o").is_file():
        raise BlockFailure("c++ exited 0 without an object file")
    return "compiled", ""


def validate_yaml(chain, directory):
    (block,) = chain
    _prepare(chain, directory, "yaml")
    (directory / "build").mkdir()
    (directory / "build" / "dev").symlink_to(BUILD_DIR, target_is_directory=True)
    name = f"readme-L{block.line}.yaml"
    (directory / name).write_text(block.text)
    with_data = bool(block.fixtures)
    cmd = [str(CLI), "validate", name] + ([] if with_data else ["--no-data"])
    out = _check(cmd, cwd=directory, what="flowstate validate")
    return "validated" + (" (with data)" if with_data else " (--no-data)"), out


def _presets():
    doc = json.loads((SOURCE_DIR / "CMakePresets.json").read_text())
    configure = {p["name"]: p.get("binaryDir", "") for p in doc.get("configurePresets", [])}
    return configure, {d.replace("${sourceDir}/", "") for d in configure.values()}


def _cli_help(command):
    return _check([str(CLI), command, "--help"], what=f"flowstate {command} --help")


def _options(words):
    return [w.split("=", 1)[0] for w in words if w.startswith("--")]


def _check_command(words, notes):
    """Checks one simple command of an sh block without running it."""
    if not words:
        return
    cmd, args = words[0], words[1:]
    if cmd == "mpirun":  # mpirun -np N COMMAND ...
        k = 0
        while k < len(args) and args[k].startswith("-"):
            k += 2 if args[k] in ("-np", "-n", "--np") else 1
        return _check_command(args[k:], notes)
    if cmd == "bash":
        if not args:
            raise BlockFailure("`bash` without a script")
        script = SOURCE_DIR / args[0]
        if not script.is_file():
            raise BlockFailure(f"`bash {args[0]}`: no such script in the repository")
        _check(["bash", "-n", str(script)], what=f"bash -n {args[0]}")
        text = script.read_text()
        for opt in _options(args[1:]):
            if opt not in text:
                raise BlockFailure(f"`bash {args[0]}`: the script never mentions {opt}")
        notes.append(f"{args[0]} parses")
        return
    if cmd == "cmake":
        configure, binary_dirs = _presets()
        for k, w in enumerate(args[:-1]):
            if w == "--preset" and args[k + 1] not in configure:
                raise BlockFailure(f"`cmake --preset {args[k + 1]}`: no such configure preset "
                                   f"(CMakePresets.json: {', '.join(configure)})")
            if w in ("--build", "--install") and args[k + 1] not in binary_dirs:
                raise BlockFailure(f"`cmake {w} {args[k + 1]}`: not a preset's binaryDir "
                                   f"({', '.join(sorted(binary_dirs))})")
        notes.append(shlex.join(words[:3]))
        return
    if cmd == "flowstate":
        k = 0
        while k < len(args) and args[k].startswith("--plugin"):
            path = args[k].partition("=")[2] or (args[k + 1] if k + 1 < len(args) else "")
            k += 1 if "=" in args[k] else 2
            resolved = BUILD_DIR / path[len("build/dev/"):] if path.startswith("build/dev/") \
                else SOURCE_DIR / path
            if not resolved.is_file():
                raise BlockFailure(f"`--plugin {path}`: not in the build ({resolved})")
        if k >= len(args):
            raise BlockFailure("`flowstate` without a command")
        command, rest = args[k], args[k + 1:]
        help_text = _cli_help(command)
        for opt in _options(rest):
            if not re.search(re.escape(opt) + r"(?![\w-])", help_text):
                raise BlockFailure(f"`flowstate {command}`: its --help does not list {opt}")
        notes.append(f"flowstate {command} {' '.join(_options(rest))}".strip())
        return
    raise BlockFailure(f"no check for the command `{cmd}`: teach tests/readme/test_readme.py, "
                       "or mark the block skip=REASON")


def check_sh(chain, directory):
    (block,) = chain
    (directory / "block.sh").write_text(block.text)
    _check(["bash", "-n", str(directory / "block.sh")], what="bash -n")
    notes = []
    for line in re.sub(r"\\\n", " ", block.text).split("\n"):
        words = shlex.split(line, comments=True)
        current = []
        for w in words + [";"]:
            if w in ("&&", "||", ";", "|"):
                _check_command(current, notes)
                current = []
            else:
                current.append(w)
    if not notes:
        raise BlockFailure("no command found to check")
    return "checked", "; ".join(notes)


def check_cmake(chain, directory):
    (block,) = chain
    text = re.sub(r"#.*", "", block.text)
    calls = re.findall(r"(\w+)\s*\(([^)]*)\)", text)
    if not calls:
        raise BlockFailure("no command found to check")
    exports = list(BUILD_DIR.glob("CMakeFiles/Export/*/flowstateTargets.cmake"))
    if not exports:
        raise BlockFailure(f"no flowstateTargets.cmake under {BUILD_DIR}/CMakeFiles/Export")
    exported = set(re.findall(r"add_library\((flowstate::\w+)", exports[0].read_text()))
    notes = []
    for name, args in calls:
        words = args.split()
        if name == "find_package":
            if not words or words[0] != "flowstate":
                raise BlockFailure(f"find_package of {words[:1]}, not flowstate")
            version = next((w for w in words[1:] if re.fullmatch(r"\d+(\.\d+)*", w)), None)
            if version:
                parts = version.split(".") + ["0"] * 4
                script = directory / "version.cmake"
                defs = "".join(f"set(PACKAGE_FIND_VERSION_{k} {v})\n" for k, v in
                               zip(("MAJOR", "MINOR", "PATCH", "TWEAK"), parts))
                script.write_text(
                    f"set(PACKAGE_FIND_NAME flowstate)\nset(PACKAGE_FIND_VERSION {version})\n"
                    f"set(PACKAGE_FIND_VERSION_COUNT {len(version.split('.'))})\n{defs}"
                    f'include("{BUILD_DIR}/flowstateConfigVersion.cmake")\n'
                    "if(NOT PACKAGE_VERSION_COMPATIBLE)\n"
                    '  message(FATAL_ERROR "flowstate ${PACKAGE_VERSION} does not satisfy "\n'
                    f'          "find_package(flowstate {version})")\nendif()\n')
                _check(["cmake", "-P", str(script)], what="the package's version file")
            notes.append(f"find_package(flowstate {version or ''}) satisfied by the build")
        elif name == "target_link_libraries":
            for t in (w for w in words if w.startswith("flowstate::")):
                if t not in exported:
                    raise BlockFailure(f"{t} is not an exported target "
                                       f"({', '.join(sorted(exported))})")
                notes.append(f"{t} exported")
        else:
            raise BlockFailure(f"no check for the CMake command {name}(): teach "
                               "tests/readme/test_readme.py, or mark the block skip=REASON")
    return "checked", "; ".join(notes)


def check_text(chain, directory):
    (block,) = chain
    entries = re.findall(r"^([\w.-]+/)\s", block.text, flags=re.M)
    if not entries:
        raise BlockFailure("not a layout listing (no `dir/` entries): mark it skip=REASON, or "
                           "give it a language")
    missing = [e for e in entries if not (SOURCE_DIR / e).is_dir()]
    if missing:
        raise BlockFailure(f"the layout lists directories the repository lacks: {missing}")
    return "checked", f"{len(entries)} directories exist"


CHECKERS = {"python": run_python, "cpp": compile_cpp, "yaml": validate_yaml, "sh": check_sh,
            "cmake": check_cmake, "text": check_text}


@dataclasses.dataclass
class Outcome:
    status: str  # ran, compiled, validated ..., checked, skipped, failed
    detail: str = ""


def check_chain(chain):
    """The outcome of every block of a chain."""
    first = chain[0]
    if first.skip:
        return {b.id: Outcome("skipped", b.skip or first.skip) for b in chain}
    with tempfile.TemporaryDirectory(prefix=f"readme-{first.id}-") as d:
        try:
            status, detail = CHECKERS[first.lang](chain, Path(d))
            return {b.id: Outcome(status, detail) for b in chain}
        except BlockFailure as e:
            return {b.id: Outcome("failed", str(e)) for b in chain}
        except Exception as e:  # a fixture's own failure, say
            return {b.id: Outcome("failed", f"{type(e).__name__}: {e}") for b in chain}


def check_all(groups):
    outcomes = {}
    # Longest first: the C++ compiles and the Python runs overlap on the cores.
    order = sorted(groups, key=lambda g: {"cpp": 0, "python": 1}.get(g[0].lang, 2))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        checked = [g for g in order if g[0].skip or g[0].lang in CHECKERS]
        for result in pool.map(check_chain, checked):
            outcomes.update(result)
    return outcomes


# ---- the tests ----

BLOCKS, PROBLEMS = parse_readme(README.read_text())
GROUPS = chains(BLOCKS, PROBLEMS)


@pytest.fixture(scope="session")
def outcomes(request):
    result = check_all(GROUPS)
    request.config._readme_summary = (BLOCKS, result)
    return result


def test_markers_and_languages_are_understood():
    assert BLOCKS, "README.md has no code blocks?"
    assert not PROBLEMS, "\n".join(PROBLEMS)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block(block, outcomes):
    outcome = outcomes.get(block.id)
    assert outcome is not None, f"README.md:{block.line}: not checked (see the other failures)"
    assert outcome.status != "failed", (
        f"README.md:{block.line} ({block.section}), a {block.lang} block:\n{outcome.detail}")


# ---- the harness fails when a block is wrong ----

def _outcome(markdown):
    blocks, problems = parse_readme(markdown)
    assert not problems, problems
    result = check_all(chains(blocks, problems))
    return [result[b.id] for b in blocks]


def test_the_parser_reads_markers_indents_and_chains():
    md = ("# A\n\n<!-- readme-test: fixture=records:16, training -->\n```python\nx = 1\n```\n\n"
          "- item\n\n  <!-- readme-test: continues -->\n\n  ```python\n  print(x)\n  ```\n"
          "<!-- readme-test: skip=shows a shell session -->\n```console\n$ ls\n```\n```\nx/\n```\n")
    blocks, problems = parse_readme(md)
    assert not problems
    assert [(b.lang, b.line, b.text) for b in blocks] == [
        ("python", 5, "x = 1\n"), ("python", 13, "print(x)\n"), ("console", 17, "$ ls\n"),
        ("text", 20, "x/\n")]
    assert blocks[0].fixtures == ["records:16", "training"] and blocks[1].continues
    assert blocks[2].skip == "shows a shell session"
    groups = chains(blocks, problems)
    assert [len(g) for g in groups] == [2, 1, 1] and not problems


def test_bad_markers_are_reported():
    for md, expected in [
            ("<!-- readme-test: skip -->\n```sh\nls\n```\n", "incomplete directive 'skip'"),
            ("<!-- readme-test: fixture=nope -->\n```sh\nls\n```\n", "unknown fixture"),
            ("<!-- readme-test: continues -->\n\ntext\n```sh\nls\n```\n", "not followed by"),
            ("```python\nx\n", "never closed")]:
        _, problems = parse_readme(md)
        assert any(expected in p for p in problems), (md, problems)
    for md, expected in [
            ("<!-- readme-test: continues -->\n```python\nx\n```\n", "no earlier python block"),
            ("```yaml\na: 1\n```\n<!-- readme-test: continues -->\n```yaml\nb: 1\n```\n",
             "python and cpp only"),
            ("```rust\nfn main() {}\n```\n", "no check for ```rust")]:
        blocks, problems = parse_readme(md)
        chains(blocks, problems)
        assert any(expected in p for p in problems), (md, problems)


def test_a_wrong_block_of_each_language_fails():
    md = ("```python\nimport os\nos.exit_please()\n```\n"
          "```cpp\n#include <flowstate/core/error.h>\nflowstate::NoSuchThing x;\n```\n"
          "```cpp\n#include <core/error.h>  // not the installed layout\n```\n"
          "```yaml\nsource: {type: records, paths: \"x/*.bin\", record_bytes: 0}\n```\n"
          "```sh\nbash scripts/no-such-script.sh\n```\n"
          "```sh\nflowstate run p.yaml --chekpoint-dir ck\n```\n"
          "```sh\ncmake --preset no-such-preset\n```\n"
          "```sh\nrm -rf build\n```\n"
          "```cmake\nfind_package(flowstate 9.0 CONFIG REQUIRED)\n```\n"
          "```cmake\ntarget_link_libraries(app PRIVATE flowstate::no_such_layer)\n```\n"
          "```\nno_such_dir/  lists nothing\n```\n"
          "<!-- readme-test: fixture=training -->\n```python\nprint(torch.zeros(1))\n```\n")
    outcomes = _outcome(md)
    assert [o.status for o in outcomes] == ["failed"] * len(outcomes), outcomes
    assert 'README.md.py", line 3' in outcomes[0].detail and "exit_please" in outcomes[0].detail
    assert "NoSuchThing" in outcomes[1].detail and "README.md:" in outcomes[1].detail
    assert "core/error.h" in outcomes[2].detail
    assert "record_bytes" in outcomes[3].detail
    assert "no such script" in outcomes[4].detail
    assert "--chekpoint-dir" in outcomes[5].detail
    assert "no-such-preset" in outcomes[6].detail
    assert "no check for the command `rm`" in outcomes[7].detail
    assert "9.0" in outcomes[8].detail
    assert "no_such_layer" in outcomes[9].detail
    assert "no_such_dir/" in outcomes[10].detail
    assert "name 'torch' is not defined" in outcomes[11].detail  # a fixture leaks only its names


def test_a_right_block_of_each_language_passes_and_fragments_chain():
    md = ("<!-- readme-test: fixture=records:16 -->\n```python\nimport flowstate\n"
          "p = flowstate.Pipeline.from_yaml('pipeline.yaml')\n```\n"
          "<!-- readme-test: continues; fixture=training -->\n```python\n"
          "import torch\nassert len(list(flowstate.Loader(p))) == 128\n"
          "loss_fn(model, torch.zeros(4, 16, dtype=torch.uint8)).backward()\n"
          "optimizer.step()\n```\n"
          "<!-- readme-test: fixture=trainer -->\n```cpp\n"
          "#include <flowstate/core/tensor.h>\nflowstate::Tensor t;\ntrain_step(t);\n```\n"
          "<!-- readme-test: continues -->\n```cpp\n"
          "flowstate::Tensor t;  // a body of its own\n```\n"
          "<!-- readme-test: fixture=records:16 -->\n```yaml\n"
          "source: {type: records, paths: \"data/*.bin\", record_bytes: 16}\n"
          "nodes: [{batch: {size: 8}}]\n```\n"
          "```sh\nmpirun -np 2 flowstate run p.yaml --checkpoint-dir ck  # a comment\n```\n"
          "<!-- readme-test: fixture=dataset,training -->\n```python\n"
          "for i in range(0, 256, 64):\n"
          "    x, y = zip(*(dataset[j] for j in range(i, i + 64)))\n"
          "    loss_fn(model, x[0].unsqueeze(0), y[0]).backward()\n```\n"
          "<!-- readme-test: skip=a console session -->\n```console\n$ rm -rf /\n```\n")
    outcomes = _outcome(md)
    assert [o.status for o in outcomes] == ["ran", "ran", "compiled", "compiled",
                                            "validated (with data)", "checked", "ran",
                                            "skipped"], outcomes
    assert outcomes[-1].detail == "a console session"
