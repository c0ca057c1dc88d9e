"""Pipelines from YAML, from a dict and from the builder; the schema; configuration errors."""
import os
import shutil
import subprocess

import flowstate
import pytest


def drain(loader):
    return [(b.info.step, b["data"].clone()) for b in loader]


def test_schema_lists_every_node_with_its_parameters():
    types = {s["type"]: s for s in flowstate.schema()}
    for t in ("records", "lines", "tar", "shuffle", "batch", "map", "prefetch", "device_copy"):
        assert t in types
    size = next(p for p in types["batch"]["params"] if p["name"] == "size")
    assert size["required"] and size["min"] == 1 and size["type"] == "an unsigned integer"
    assert types["records"]["source"] and not types["batch"]["source"]
    # Data parameters (a resume may continue over a change of them) are marked.
    mix = {p["name"]: p for p in types["mix"]["params"]}
    assert mix["weights"]["data"] and mix["inputs"]["data"] and not mix["stop"]["data"]
    assert not size["data"]


def test_builder_methods_are_generated_from_the_registry():
    for s in flowstate.schema():
        if s["source"]:
            assert callable(getattr(flowstate, s["type"]))
        else:
            assert callable(getattr(flowstate.Builder, s["type"]))
    assert "samples per batch" in flowstate.Builder.batch.__doc__


def test_yaml_dict_and_builder_make_the_same_pipeline(tmp_path, data_dir, records_doc):
    yaml = tmp_path / "p.yaml"
    yaml.write_text(f"""seed: 7
source: {{type: records, paths: "{data_dir}/*.bin", record_bytes: 16}}
nodes:
  - shuffle: {{mode: global}}
  - batch: {{size: 32}}
""")
    a = flowstate.Pipeline.from_yaml(yaml)
    b = flowstate.Pipeline.from_dict(records_doc)
    c = (flowstate.records(paths=str(data_dir / "*.bin"), record_bytes=16)
         .seed(7).shuffle(mode="global").batch(size=32).build())
    assert a.fingerprint == b.fingerprint == c.fingerprint
    ra, rc = drain(flowstate.Loader(a)), drain(flowstate.Loader(c))
    assert len(ra) == 63 and all(x[1].equal(y[1]) for x, y in zip(ra, rc))


def test_a_path_that_is_not_utf8_reads_back_as_os_fsdecode_makes_it(tmp_path, data_dir):
    # A directory named in Latin-1 ("d\xe9"): the pipeline runs, and canonical() and describe()
    # give the path as os.fsdecode does (surrogateescape), never a UnicodeDecodeError.
    d = os.path.join(os.fsencode(tmp_path), b"d\xe9")
    os.mkdir(d)
    shutil.copy(data_dir / "part-00000.bin", os.path.join(d, b"part-00000.bin"))
    yaml = os.path.join(os.fsencode(tmp_path), b"p.yaml")
    with open(yaml, "wb") as f:
        f.write(b'source: {type: records, paths: "' + d + b'/*.bin", record_bytes: 16}\n'
                b"nodes:\n  - batch: {size: 10}\n")
    p = flowstate.Pipeline.from_yaml(os.fsdecode(yaml))
    paths = [v for k, v in p.canonical() if k.endswith("paths")]
    assert [os.fsencode(v) for v in paths] == [d + b"/*.bin"]
    assert os.fsdecode(d) in p.describe()
    assert len(list(flowstate.Loader(p))) == 100


def test_overrides_change_a_value(records_doc):
    p = flowstate.Pipeline.from_dict(records_doc, overrides={"batch.size": 100})
    batches = list(flowstate.Loader(p))
    assert batches[0]["data"].shape == (100, 16) and len(batches) == 20


def test_config_error_carries_the_commands_message(tmp_path, data_dir, cli):
    yaml = tmp_path / "bad.yaml"
    yaml.write_text(f"""source: {{type: records, paths: "{data_dir}/*.bin", record_bytes: 16}}
nodes:
  - shuffle: {{mode: global}}
  - batch: {{size: 0}}
""")
    with pytest.raises(flowstate.ConfigError) as e:
        flowstate.Pipeline.from_yaml(yaml)
    assert e.value.key == "nodes[1].batch.size"
    assert str(e.value) == f"{yaml}:4:19: nodes[1].batch.size: 0 is out of range (must be at least 1)"
    run = subprocess.run([cli, "validate", "--no-data", str(yaml)], capture_output=True, text=True)
    assert run.returncode == 2
    assert str(e.value) in run.stderr


def test_builder_errors_name_the_node(data_dir):
    with pytest.raises(AttributeError, match="no node 'shufle'"):
        flowstate.records(paths=str(data_dir / "*.bin"), record_bytes=16).shufle
    with pytest.raises(flowstate.ConfigError, match="nodes\\[0\\].shuffle.size: 0 is out of range"):
        flowstate.records(paths=str(data_dir / "*.bin"), record_bytes=16).shuffle(
            mode="buffer", size=0).batch(size=4).build()
    with pytest.raises(flowstate.ConfigError, match="unknown node type 'shufle'"):
        flowstate.records(paths=str(data_dir / "*.bin"), record_bytes=16).add("shufle").build()


def test_missing_data_is_a_data_error(tmp_path):
    with pytest.raises(flowstate.Error) as e:
        flowstate.Loader(flowstate.Pipeline.from_dict({
            "source": {"type": "records", "paths": str(tmp_path / "none-*.bin"), "record_bytes": 16},
            "nodes": [{"batch": {"size": 4}}]}))
    assert isinstance(e.value, (flowstate.DataError, flowstate.ConfigError))
