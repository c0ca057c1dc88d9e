"""The tokenize node from Python: its ids equal python3-sentencepiece's `encode` on the same model
and text, record by record (the model trained here with spm_train on `flowstate gen text`'s
corpus); the builder's `.tokenize(...)`; an exact resume with another worker count; errors."""
import json
import os
import shutil
import subprocess

import flowstate
import pytest

torch = pytest.importorskip("torch")
spm = pytest.importorskip("sentencepiece", reason="needs python3-sentencepiece")

SPM_TRAIN = shutil.which("spm_train") or "/usr/bin/spm_train"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(directory, model path, the documents' texts in order): 300 documents of ~80 words in two
    files (`flowstate gen text`), and a 500-piece model trained on them."""
    cli = os.environ.get("FLOWSTATE_CLI")
    if not cli or not os.path.exists(cli):
        pytest.skip("FLOWSTATE_CLI does not name the flowstate command")
    d = tmp_path_factory.mktemp("text")
    subprocess.run([cli, "gen", "text", "--out", str(d), "--docs", "300", "--words", "80",
                    "--shards", "2"], check=True, capture_output=True)
    texts = []
    for f in sorted(d.glob("text-*.jsonl")):
        texts += [json.loads(line)["text"] for line in f.read_text(encoding="utf-8").splitlines()]
    assert len(texts) == 300
    (d / "corpus.txt").write_text("\n".join(t.replace("\n", " ") for t in texts) + "\n",
                                  encoding="utf-8")
    subprocess.run([SPM_TRAIN, f"--input={d / 'corpus.txt'}", f"--model_prefix={d / 'm'}",
                    "--vocab_size=500", "--minloglevel=2", "--num_threads=1"],
                   check=True, capture_output=True)
    return d, d / "m.model", texts


def lines(d):
    return flowstate.lines(paths=str(d / "text-*.jsonl"), format="jsonl", json_fields=["text"])


@pytest.mark.parametrize("options", [
    {},
    {"bos": True, "eos": True, "dtype": "uint16"},
    {"eos": True, "max_length": 30, "truncation": "start", "dtype": "uint32"},
])
def test_ids_equal_python_sentencepiece_record_by_record(corpus, options):
    d, model, texts = corpus
    sp = spm.SentencePieceProcessor(model_file=str(model))
    p = lines(d).tokenize(model=str(model), **options).batch(size=1).build()
    got = [b["tokens"][0].tolist() for b in flowstate.Loader(p, epochs=1)]
    assert len(got) == len(texts)
    for i, (ids, text) in enumerate(zip(got, texts)):
        want = sp.encode(text)
        if options.get("max_length"):
            room = options["max_length"] - options.get("bos", False) - options.get("eos", False)
            want = want[-room:] if options.get("truncation") == "start" else want[:room]
        want = ([sp.bos_id()] if options.get("bos") else []) + want + \
               ([sp.eos_id()] if options.get("eos") else [])
        assert ids == want, f"record {i}"


def test_packed_pipeline_resumes_exactly_with_another_worker_count(corpus):
    d, model, _ = corpus
    p = (lines(d).shuffle(mode="global").tokenize(model=str(model), eos=True, dtype="uint16")
         .pack(length=256).batch(size=4).build())
    assert "tokenize.model" in dict(p.canonical())
    reference = [b["tokens"].clone() for b in flowstate.Loader(p, epochs=1, workers=2)]
    assert len(reference) > 10
    first = flowstate.Loader(p, epochs=1, workers=2)
    head = [next(first)["tokens"].clone() for _ in range(5)]
    sd = first.state_dict()
    del first
    second = flowstate.Loader(p, epochs=1, workers=1)
    second.load_state_dict(sd)
    rest = [b["tokens"].clone() for b in second]
    assert len(head) + len(rest) == len(reference)
    assert all(torch.equal(a, b) for a, b in zip(head + rest, reference))


def test_a_changed_model_is_refused_on_resume(corpus, tmp_path):
    d, model, _ = corpus
    changed = tmp_path / "m.model"
    # One piece appended (protobuf merges repeated fields): the same model but for one piece.
    piece = b"\x0a\x04\xe2\x96\x81z\x15\x00\x00\xc8\xc2\x18\x01"
    changed.write_bytes(model.read_bytes() + b"\x0a" + bytes([len(piece)]) + piece)
    build = lambda m: lines(d).tokenize(model=str(m)).pack(length=64).batch(size=2).build()
    loader = flowstate.Loader(build(model))
    next(loader)
    with pytest.raises(flowstate.CheckpointError, match="tokenize.model"):
        flowstate.Loader(build(changed)).load_state_dict(loader.state_dict())


def test_errors_name_the_model_and_the_record(corpus, tmp_path):
    d, model, _ = corpus
    with pytest.raises(flowstate.ConfigError, match="cannot read the SentencePiece model"):
        lines(d).tokenize(model=str(tmp_path / "none.model")).batch(size=1).build()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": [1, 2]}\n')
    p = (flowstate.lines(paths=str(bad), format="jsonl", json_fields=["text"])
         .tokenize(model=str(model)).batch(size=1).build())
    with pytest.raises(flowstate.DataError, match=r"bad.jsonl' line 2 \(byte 17\): field 'text' "
                                                  r"is int64 \[2\], not text"):
        list(flowstate.Loader(p, epochs=1))
