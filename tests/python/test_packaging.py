"""What a Python user expects of the package: the project's version, real signatures and typed
stubs made from the node registry, and describe_state showing what `flowstate inspect` shows."""
import ast
import importlib.util
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys
import typing

import flowstate
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path(flowstate.__file__).resolve().parent


def project_version():
    m = re.search(r"project\(\s*flowstate\s+VERSION\s+([0-9.]+)",
                  (ROOT / "CMakeLists.txt").read_text())
    return m.group(1)


def nodes():
    """(spec, the generated callable) for every node type the builder generates."""
    for spec in flowstate.schema():
        if spec["source"]:
            yield spec, getattr(flowstate, spec["type"])
        elif spec["type"] not in ("map", "filter"):
            yield spec, getattr(flowstate.Builder, spec["type"])


# ---- the version ----

def test_version_is_the_projects():
    assert flowstate.__version__ == project_version()
    assert flowstate._flowstate.__version__ == flowstate.__version__


def test_the_command_prints_the_same_version(cli):
    out = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True).stdout
    assert out == f"flowstate {flowstate.__version__}\n"


# ---- signatures ----

def test_generated_functions_have_the_schemas_signature():
    for spec, fn in nodes():
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        if not spec["source"]:
            assert params[0].name == "self"
            params = params[1:]
        assert sorted(p.name for p in params) == sorted(p["name"] for p in spec["params"]), \
            spec["type"]
        assert sig.return_annotation is flowstate.Builder
        by_name = {p["name"]: p for p in spec["params"]}
        for p in params:
            schema = by_name[p.name]
            assert p.kind == p.KEYWORD_ONLY
            assert p.annotation is not typing.Any, (spec["type"], p.name)  # every kind is mapped
            if schema["required"]:
                assert p.default is p.empty, (spec["type"], p.name)
            else:
                assert p.default == schema["default"], (spec["type"], p.name)


def test_signatures_name_real_types_and_defaults():
    pack = inspect.signature(flowstate.Builder.pack).parameters
    assert pack["length"].annotation is int and pack["length"].default is inspect.Parameter.empty
    records = inspect.signature(flowstate.records).parameters
    assert records["record_bytes"].annotation is int
    assert records["paths"].annotation == typing.Union[str, list[str]]
    shuffle = inspect.signature(flowstate.Builder.shuffle).parameters
    mode = next(p for s in flowstate.schema() if s["type"] == "shuffle"
                for p in s["params"] if p["name"] == "mode")
    assert typing.get_args(shuffle["mode"].annotation) == tuple(mode["choices"])
    assert shuffle["mode"].default == mode["default"] == "global"
    # Bound: what completion shows on a builder.
    b = flowstate.records(paths="x", record_bytes=4)
    assert "self" not in inspect.signature(b.batch).parameters
    assert str(inspect.signature(b.batch)).startswith("(*, size: int")


def test_auto_and_none_are_typed_as_the_builder_takes_them(data_dir):
    rank = inspect.signature(flowstate.Builder.shard).parameters["rank"]
    assert rank.annotation == typing.Optional[int] and rank.default is None
    depth = inspect.signature(flowstate.Builder.prefetch).parameters["depth"]
    b = flowstate.records(paths=str(data_dir / "*.bin"), record_bytes=16).batch(size=8)
    if typing.Literal["auto"] in typing.get_args(depth.annotation):
        p = b.prefetch(depth="auto").build()
        assert next(iter(flowstate.Loader(p)))["data"].shape == (8, 16)
    else:  # the annotation says int: the word is refused from Python
        assert depth.annotation is int
        with pytest.raises(flowstate.ConfigError, match="depth"):
            b.prefetch(depth="auto").build()


# ---- stubs ----

def load_generator():
    spec = importlib.util.spec_from_file_location("gen_stubs", ROOT / "python" / "gen_stubs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stub_tree():
    stub = PACKAGE / "__init__.pyi"
    assert stub.exists(), "the build writes flowstate/__init__.pyi (python/gen_stubs.py)"
    return stub.read_text(), ast.parse(stub.read_text())


def test_package_ships_stubs_and_py_typed():
    assert (PACKAGE / "py.typed").exists()
    text, _ = stub_tree()
    # The stubs are the package as it is now: generated again, they are the same.
    assert load_generator().Writer(flowstate).write() == text, \
        "stale stubs: a build of flowstate_python writes them"


def defs(body):
    return {n.name: n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def test_stubs_name_every_nodes_parameters_with_types():
    text, tree = stub_tree()
    top = defs(tree.body)
    builder = defs(top["Builder"].body)
    for spec, _ in nodes():
        fn = top[spec["type"]] if spec["source"] else builder[spec["type"]]
        kw = {a.arg: a for a in fn.args.kwonlyargs}
        assert set(kw) == {p["name"] for p in spec["params"]}, spec["type"]
        assert all(a.annotation is not None for a in kw.values()), spec["type"]
        assert ast.unparse(fn.returns) == "Builder"
    length = {a.arg: a for a in builder["pack"].args.kwonlyargs}["length"]
    assert ast.unparse(length.annotation) == "int"
    assert "def records(*, " in text and "record_bytes: int" in text


def test_stubs_cover_the_hand_written_api():
    text, tree = stub_tree()
    top = defs(tree.body)
    names = ["Pipeline", "Builder", "Loader", "Batch", "BatchInfo", "GradientAccumulator",
             "from_sequence", "from_iterable", "default_collate", "schema", "describe_state",
             "Error", "ConfigError", "DataError", "CheckpointError"]
    if hasattr(flowstate, "DataLoader"):
        names.append("DataLoader")
    for name in names:
        assert name in top, name
    loader = defs(top["Loader"].body)
    for method in ("__init__", "__iter__", "__next__", "__len__", "state_dict",
                   "load_state_dict", "save_checkpoint", "restore"):
        assert method in loader, method
    assert [a.arg for a in defs(top["Pipeline"].body)["from_yaml"].args.args] == \
        ["cls", "path", "overrides"]
    assert {n.target.id for n in top["BatchInfo"].body if isinstance(n, ast.AnnAssign)} == \
        set(flowstate.BatchInfo._fields)
    assert "class ConfigError(Error, ValueError):\n    def __getattr__(self, name: str)" in text
    assert "__version__: str" in text
    assert "def describe_state(state: bytes | collections.abc.Mapping[str, typing.Any], " \
           "json: bool = False) -> str | dict" in text


# ---- describe_state ----

@pytest.fixture
def run_state(records_doc):
    """A loader 5 batches into the first epoch, and its state."""
    records_doc["nodes"][0] = {"shuffle": {"mode": "buffer", "size": 64}}
    loader = flowstate.Loader(flowstate.Pipeline.from_dict(records_doc), epochs=2)
    for _ in range(5):
        next(loader)
    return loader


def test_describe_state_shows_what_inspect_shows(run_state, tmp_path, cli):
    state = run_state.state()
    text = flowstate.describe_state(state)
    assert text.startswith(f"state: {len(state)} bytes\n"
                           "step: 5 (batches consumed; the next batch is step 5)\n"
                           "last delivered: step 4, epoch 0\n"
                           "format version: 1\n"
                           f"fingerprint: {run_state.fingerprint:016x}\n"), text
    assert "  shuffle.size = 64\n" in text and "\nnode states:\n  records (records): " in text

    d = flowstate.describe_state(state, json=True)
    assert d["source"] == "bytes" and d["path"] is None and d["bytes"] == len(state)
    assert (d["step"], d["last_step"], d["last_epoch"]) == (5, 4, 0)
    assert [n["name"] for n in d["nodes"]] == ["records", "shuffle", "batch"]
    assert d["nodes"][2]["state"]["next_step"] == 5

    # The command on the same state, as a file and as a checkpoint: the same description.
    (tmp_path / "loader.state").write_bytes(state)
    out = subprocess.run([cli, "inspect", str(tmp_path / "loader.state")], capture_output=True,
                         text=True, check=True).stdout
    assert out == f"state file: {tmp_path / 'loader.state'}\n" + text.split("\n", 1)[1]
    run_state.save_checkpoint(tmp_path / "ck")
    got = json.loads(subprocess.run([cli, "inspect", str(tmp_path / "ck"), "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    assert got["source"] == "checkpoint" and got["step"] == 5
    for key in ("format_version", "fingerprint", "last_step", "last_epoch", "pipeline",
                "skipped_steps", "nodes"):
        assert got[key] == d[key], key


def test_describe_state_takes_a_state_dict_and_shows_its_fields(run_state):
    sd = run_state.state_dict()
    sd["epoch"] = 3  # a field a DataLoader's dict carries too
    text = flowstate.describe_state(sd)
    assert "\nstate_dict: version 1, step 5, epoch 3, fingerprint " in text
    d = flowstate.describe_state(sd, json=True)
    assert d["state_dict"]["epoch"] == 3 and d["state_dict"]["step"] == 5 and d["step"] == 5
    assert d["nodes"] == flowstate.describe_state(sd["state"], json=True)["nodes"]


def test_describe_state_refuses_what_is_not_a_state(tmp_path, cli):
    with pytest.raises(flowstate.CheckpointError, match="not a flowstate state"):
        flowstate.describe_state(b"not a state at all")
    with pytest.raises(flowstate.CheckpointError, match="no 'state'"):
        flowstate.describe_state({"model": 1})
    with pytest.raises(flowstate.CheckpointError, match="got int"):
        flowstate.describe_state(7)
    (tmp_path / "junk").write_bytes(b"not a state at all")
    r = subprocess.run([cli, "inspect", str(tmp_path / "junk")], capture_output=True, text=True)
    assert r.returncode == 4 and "not a flowstate state" in r.stderr, r.stderr


def test_inspect_points_a_torch_file_at_describe_state(run_state, tmp_path, cli):
    torch = pytest.importorskip("torch")
    torch.save({"loader": run_state.state_dict()}, tmp_path / "train.pt")
    r = subprocess.run([cli, "inspect", str(tmp_path / "train.pt")], capture_output=True,
                       text=True)
    assert r.returncode == 4, r.stdout
    assert "torch.save" in r.stderr and "flowstate.describe_state" in r.stderr, r.stderr
    # ... where it is shown.
    text = flowstate.describe_state(torch.load(tmp_path / "train.pt")["loader"])
    assert "step: 5 (batches consumed" in text


def test_a_type_checker_reads_the_stubs(tmp_path):
    """mypy (Debian's python3-mypy, when installed) on a user's script: right calls pass, and
    a mistyped value, a missing or misspelt argument and a wrong choice are reported."""
    pytest.importorskip("mypy", reason="needs mypy (python3-mypy)")
    (tmp_path / "good.py").write_text(
        "import flowstate\n"
        "b = flowstate.records(paths='d/*.bin', record_bytes=16).shuffle(mode='buffer')\n"
        "p: flowstate.Pipeline = b.pack(length=128).batch(size=8).build()\n"
        "loader = flowstate.Loader(p, epochs=1)\n"
        "text = flowstate.describe_state(loader.state_dict())\n"
        "v: str = flowstate.__version__\n"
        "try:\n    pass\nexcept flowstate.ConfigError as e:\n    print(e.key)\n")
    (tmp_path / "bad.py").write_text(
        "import flowstate\n"
        "flowstate.records(paths='x', record_bytes='16')\n"
        "flowstate.records(paths='x')\n"
        "flowstate.records(paths='x', record_bytes=1).shuffle(mode='bufer')\n"
        "flowstate.records(paths='x', record_bytes=1).pack(lenght=3)\n")

    env = dict(os.environ)
    if "site-packages" not in PACKAGE.parts:  # the build tree's; an installed one is found
        env["MYPYPATH"] = str(PACKAGE.parent)  # through its py.typed (PEP 561)

    def mypy(name):
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull,
             "--no-error-summary", name], cwd=tmp_path, capture_output=True, text=True, env=env)

    good = mypy("good.py")
    assert good.returncode == 0, good.stdout
    bad = mypy("bad.py")
    errors = [line for line in bad.stdout.splitlines() if ": error: " in line]
    assert [e.split(":")[1] for e in errors] == ["2", "3", "4", "5"], bad.stdout
    assert 'Argument "record_bytes" to "records" has incompatible type "str"; expected "int"' \
        in errors[0]
    assert 'Missing named argument "record_bytes"' in errors[1]
    assert 'Argument "mode" to "shuffle" of "Builder"' in errors[2] and "'bufer'" in errors[2]
    assert 'Unexpected keyword argument "lenght" for "pack" of "Builder"' in errors[3]


def test_describe_state_takes_a_dataloaders_state_dict():
    if not hasattr(flowstate, "DataLoader"):
        pytest.skip("no flowstate.DataLoader in this build")
    loader = flowstate.DataLoader(list(range(100)), batch_size=4)
    it = iter(loader)
    for _ in range(3):
        next(it)
    sd = loader.state_dict()
    d = flowstate.describe_state(sd, json=True)
    assert (d["step"], d["last_step"]) == (3, 2)
    assert d["state_dict"]["epoch"] == sd["epoch"]
    assert d["nodes"][-1]["state"]["next_step"] == 3
    assert "\nstate_dict: " in flowstate.describe_state(sd)
