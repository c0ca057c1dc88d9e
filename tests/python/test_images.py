"""decode_image and the image transforms from Python: the pixel check against PIL (the same
JPEG or PNG decoded by both), the builder form, and resume across worker counts."""
import io
import os
import signal
import subprocess
import sys
import tarfile

import flowstate
import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image", reason="needs PIL (python3-pil)")


def write_tar(path, members):
    """A WebDataset tar of (name, bytes) members, in order."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def decoded(tar, field, n, **decode):
    """The uint8 HWC arrays flowstate's decode_image makes of the first n samples, in order."""
    p = (flowstate.tar(paths=str(tar), fields=[field])
         .decode_image(field=field, **decode).batch(size=1).build())
    out = []
    for b in flowstate.Loader(p, epochs=1):
        out.append(b[field][0].numpy().copy())
    assert len(out) == n
    return out


def pil_rgb(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_gen_images_jpegs_decode_exactly_as_pil_decodes_them(tmp_path, cli):
    subprocess.run([cli, "gen", "images", "--out", str(tmp_path), "--samples", "12",
                    "--min-side", "40", "--max-side", "120", "--seed", "5"],
                   check=True, capture_output=True)
    tar = tmp_path / "images-00000.tar"
    with tarfile.open(tar) as t:
        jpegs = [t.extractfile(m).read() for m in t.getmembers() if m.name.endswith(".jpg")]
    ours = decoded(tar, "jpg", len(jpegs))
    for data, x in zip(jpegs, ours):
        ref = pil_rgb(data)
        assert x.shape == ref.shape
        # Measured: 0 — libjpeg-turbo's accurate integer IDCT and fancy upsampling, which PIL
        # uses too (docs/DECISIONS.md, "Images").
        assert np.abs(x.astype(int) - ref.astype(int)).max() == 0


def test_jpeg_variants_and_png_modes_decode_as_pil_converts_them_to_rgb(tmp_path):
    rng = np.random.default_rng(3)
    rgb = Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8))
    members = []

    def add(img, fmt, **kw):
        buf = io.BytesIO()
        img.save(buf, format=fmt, **kw)
        members.append((f"{len(members):04d}.img", buf.getvalue()))

    add(rgb, "JPEG", quality=85)                    # 4:2:0
    add(rgb, "JPEG", quality=95, subsampling=0)     # 4:4:4
    add(rgb, "JPEG", quality=90, progressive=True)  # progressive
    add(rgb.convert("L"), "JPEG")                   # grayscale
    add(rgb, "PNG")
    add(rgb.convert("L"), "PNG")
    add(rgb.convert("P"), "PNG")                    # palette
    add(rgb.convert("RGBA"), "PNG")                 # alpha: dropped, as convert("RGB") does
    add(rgb.convert("LA"), "PNG")
    add(rgb.convert("1"), "PNG")                    # 1 bit
    add(rgb, "PNG", optimize=True)
    tar = tmp_path / "mixed.tar"
    write_tar(tar, members)
    ours = decoded(tar, "img", len(members))
    for (name, data), x in zip(members, ours):
        ref = pil_rgb(data)
        assert x.shape == ref.shape, name
        assert np.array_equal(x, ref), (name, np.abs(x.astype(int) - ref.astype(int)).max())


def test_bad_images_are_errors_naming_record_and_field_or_skipped(tmp_path):
    rng = np.random.default_rng(4)
    good = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(good, format="JPEG")
    good = good.getvalue()
    members = [(f"{i:04d}.jpg", good) for i in range(6)]
    members[2] = ("0002.jpg", good[: len(good) // 2])  # truncated
    members[4] = ("0004.jpg", b"GIF89a...")            # not a JPEG or PNG
    tar = tmp_path / "bad.tar"
    write_tar(tar, members)
    with pytest.raises(flowstate.DataError, match=r"field 'jpg' of record 0:2: (bad|not a valid) JPEG"):
        decoded(tar, "jpg", 6)
    assert len(decoded(tar, "jpg", 4, on_error="skip")) == 4
    with pytest.raises(flowstate.ConfigError, match="on_error"):
        decoded(tar, "jpg", 4, on_error="ignore")


def augmented(tar):
    return (flowstate.tar(paths=str(tar), fields=["jpg", "cls"]).seed(9)
            .shuffle(mode="global")
            .decode_image(min_size=24, on_error="skip")
            .map("random_resized_crop", size=[24, 32])
            .map("flip")
            .map("normalize_image")
            .map("parse_int", field="cls")
            .batch(size=5))


def test_augmented_batches_resume_exactly_across_worker_counts(tmp_path, cli):
    subprocess.run([cli, "gen", "images", "--out", str(tmp_path), "--samples", "23",
                    "--min-side", "30", "--max-side", "60"], check=True, capture_output=True)
    tar = tmp_path / "images-00000.tar"

    def run(loader, limit=None):
        out = []
        for b in loader:
            out.append((b.info.step, b["jpg"].clone(), b["cls"].clone()))
            if limit is not None and len(out) == limit:
                break
        return out

    whole = run(flowstate.Loader(augmented(tar).build(), epochs=1, workers=1))
    assert len(whole) == 5 and whole[0][1].shape == (5, 3, 24, 32)
    assert str(whole[0][1].dtype) == "torch.float32" and str(whole[0][2].dtype) == "torch.int64"
    a = flowstate.Loader(augmented(tar).build(), epochs=1, workers=2)
    first = run(a, limit=2)
    state = a.state()
    b = flowstate.Loader(augmented(tar).build(), epochs=1, workers=1)
    b.load_state(state)
    rest = run(b)
    got = first + rest
    assert [g[0] for g in got] == [w[0] for w in whole]
    assert all(g[1].equal(w[1]) and g[2].equal(w[2]) for g, w in zip(got, whole))


EXAMPLE = (os.path.dirname(os.path.abspath(__file__))
           + "/../../examples/pipelines/image_classification.yaml")

# A training-loop stand-in over the image example: a digest line per batch, the loader's state
# saved after every batch from --save-from on, and a SIGKILL one batch after the save numbered
# --kill-after (so the resumed run repeats that batch).
KILLED_LOADER = r"""
import hashlib, os, signal, sys
import flowstate
yaml, workers, digests, state, kill_after = sys.argv[1:6]
workers, kill_after = int(workers), int(kill_after)
loader = flowstate.Loader(flowstate.Pipeline.from_yaml(yaml, overrides={"batch.size": 8}),
                          epochs=1, workers=workers)
if os.path.exists(state):
    with open(state, "rb") as f:
        loader.load_state(f.read())
saves = 0
with open(digests, "a") as out:
    for b in loader:
        h = hashlib.sha256(b["jpg"].numpy().tobytes() + b["cls"].numpy().tobytes()).hexdigest()
        out.write(f"{b.info.step} {h}\n")
        out.flush()
        if saves == kill_after and kill_after > 0:
            os.kill(os.getpid(), signal.SIGKILL)
        if kill_after > 0:
            with open(state + ".tmp", "wb") as f:
                f.write(loader.state())
            os.replace(state + ".tmp", state)
            saves += 1
"""


def test_the_image_example_resumes_after_sigkill_with_another_worker_count(tmp_path, cli):
    subprocess.run([cli, "gen", "images", "--out", str(tmp_path / "data"), "--samples", "60",
                    "--shards", "2", "--min-side", "200", "--max-side", "400"], check=True,
                   capture_output=True)
    yaml = tmp_path / "image_classification.yaml"
    yaml.write_text(open(EXAMPLE).read())
    script = tmp_path / "loop.py"
    script.write_text(KILLED_LOADER)

    env = os.environ.copy()  # the flowstate package this test imported, from any directory
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(flowstate.__file__)))]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))

    def loop(workers, digests, kill_after, state="state.bin"):
        return subprocess.run([sys.executable, str(script), str(yaml), str(workers),
                               str(tmp_path / digests), str(tmp_path / state), str(kill_after)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    run = loop(2, "whole.txt", 0, "none.bin")
    assert run.returncode == 0, run.stderr
    whole = (tmp_path / "whole.txt").read_text().splitlines()
    assert len(whole) == 8  # 60 images, batches of 8 (the last of 4)
    run = loop(2, "killed.txt", 3)  # killed mid-epoch, one batch after the 3rd save
    assert run.returncode == -signal.SIGKILL, run.stderr
    killed = (tmp_path / "killed.txt").read_text().splitlines()
    assert len(killed) == 4
    run = loop(1, "killed.txt", 0)  # resumed from the 3rd save with 1 worker, to the end
    assert run.returncode == 0, run.stderr
    got = (tmp_path / "killed.txt").read_text().splitlines()
    assert got[3] == got[4]  # the batch after the last save, made again
    assert got[:4] + got[5:] == whole
