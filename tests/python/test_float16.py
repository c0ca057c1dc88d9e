"""float16 and bfloat16 from Python: normalize_image's 16-bit outputs and `cast` against numpy's
astype(float16) and torch's .to(bfloat16), the tensors reaching torch as torch.float16 /
torch.bfloat16 (the native Loader, Python maps, flowstate.DataLoader's worker processes)."""
import os
import subprocess

import flowstate
import numpy as np
import pytest
import torch


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    cli = os.environ.get("FLOWSTATE_CLI")
    if not cli or not os.path.exists(cli):
        pytest.skip("FLOWSTATE_CLI does not name the flowstate command")
    d = tmp_path_factory.mktemp("images")
    subprocess.run([cli, "gen", "images", "--out", str(d), "--samples", "12",
                    "--min-side", "30", "--max-side", "60", "--seed", "3"],
                   check=True, capture_output=True)
    return d / "images-00000.tar"


def normalized(tar, dtype=None, batch=4, python_map=None):
    extra = {} if dtype is None else {"dtype": dtype}
    p = (flowstate.tar(paths=str(tar), fields=["jpg"]).seed(5)
         .shuffle(mode="global")
         .decode_image(min_size=24)
         .map("random_resized_crop", size=[24, 32])
         .map("flip")
         .map("normalize_image", **extra))
    if python_map is not None:
        p = p.map(python_map)
    return p.batch(size=batch)


def bits(t):
    """A 16-bit float tensor's bits, as a numpy uint16 array."""
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def test_normalize_image_float16_is_numpys_astype_of_the_float32_output(images):
    full = list(flowstate.Loader(normalized(images).build(), epochs=1, workers=2))
    half = list(flowstate.Loader(normalized(images, "float16").build(), epochs=1, workers=2))
    brain = list(flowstate.Loader(normalized(images, "bfloat16").build(), epochs=1, workers=1))
    assert len(full) == len(half) == len(brain) == 3
    for f, h, b in zip(full, half, brain):
        x32, x16, xbf = f["jpg"], h["jpg"], b["jpg"]
        assert x16.dtype == torch.float16 and xbf.dtype == torch.bfloat16
        assert x16.shape == x32.shape == (4, 3, 24, 32)
        want = x32.numpy().astype(np.float16)
        assert x16.numpy().dtype == np.float16
        assert np.array_equal(x16.numpy().view(np.uint16), want.view(np.uint16))
        assert np.array_equal(bits(xbf), bits(x32.to(torch.bfloat16)))


def test_normalize_image_float16_resumes_exactly_across_worker_counts(images):
    whole = [b["jpg"].clone() for b in
             flowstate.Loader(normalized(images, "float16").build(), epochs=1, workers=1)]
    a = flowstate.Loader(normalized(images, "float16").build(), epochs=1, workers=2)
    first = [next(iter(a))["jpg"].clone()]
    b = flowstate.Loader(normalized(images, "float16").build(), epochs=1, workers=1)
    b.load_state(a.state())
    got = first + [x["jpg"].clone() for x in b]
    assert len(got) == len(whole)
    assert all(np.array_equal(bits(g), bits(w)) for g, w in zip(got, whole))


def edge_floats():
    """float32 values around every float16 rounding boundary, and a large random sample."""
    f16 = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)
    lo, hi = f16[:-1], f16[1:]
    mids = (lo + hi) / 2  # exact in float32: the ties
    edges = np.concatenate([
        f16, mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(1e9)),
        np.float32([65504, 65519.996, 65520, 1e9, 2.0 ** -25, 2.0 ** -24, 1.5 * 2.0 ** -24, 0,
                    np.inf, np.nan])])
    edges = np.concatenate([edges, -edges])
    rng = np.random.default_rng(16)
    sample = rng.integers(0, 2 ** 32, 400_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([edges, sample]).astype(np.float32)
    pad = (-len(x)) % 1024
    return np.concatenate([x, np.zeros(pad, np.float32)])


def cast_through_flowstate(path, record_bytes, source_dtype, dtype):
    p = (flowstate.records(paths=str(path), record_bytes=record_bytes)
         .map("decode", dtype=source_dtype)
         .map("cast", dtype=dtype)
         .batch(size=64).build())
    return torch.cat([b["data"].flatten() for b in flowstate.Loader(p, epochs=1)])


def same_bits_or_both_nan(got, want):
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    return np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's own overflow to inf, NaN
def test_cast_to_float16_equals_numpy_over_every_boundary_and_a_random_sample(tmp_path):
    x = edge_floats()
    path = tmp_path / "f32.bin"
    x.tofile(path)
    got = cast_through_flowstate(path, 4096, "float32", "float16")
    assert got.dtype == torch.float16 and got.numel() == len(x)
    assert same_bits_or_both_nan(got.numpy(), x.astype(np.float16))
    # float64 goes to float16 in one rounding, as numpy's astype does.
    d = np.concatenate([x.astype(np.float64),
                        np.float64([1 + 2.0 ** -11 + 2.0 ** -40, 65519.99999999])])
    d = np.concatenate([d, np.zeros((-len(d)) % 512)])
    d.tofile(tmp_path / "f64.bin")
    got = cast_through_flowstate(tmp_path / "f64.bin", 4096, "float64", "float16")
    assert same_bits_or_both_nan(got.numpy(), d.astype(np.float16))
    # float16 back to float32 is exact.
    x.astype(np.float16).tofile(tmp_path / "f16.bin")
    back = cast_through_flowstate(tmp_path / "f16.bin", 2048, "float16", "float32").numpy()
    want = x.astype(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(back[~nan], want[~nan]) and np.isnan(back[nan]).all()
    # bfloat16 as torch rounds it.
    got = cast_through_flowstate(path, 4096, "float32", "bfloat16")
    assert got.dtype == torch.bfloat16
    want = torch.from_numpy(x).to(torch.bfloat16)
    nan = torch.isnan(want).numpy()
    assert np.array_equal(torch.isnan(got).numpy(), nan)
    assert np.array_equal(bits(got)[~nan], bits(want)[~nan])


def test_python_maps_see_float16_as_numpy_float16_and_may_return_it(images):
    seen = []

    def halve(sample):
        x = sample["jpg"]
        seen.append(x.dtype)
        return {"jpg": (x / np.float16(2)).astype(np.float16)}

    p = normalized(images, "float16", python_map=halve)
    got = list(flowstate.Loader(p.build(), epochs=1))
    assert set(seen) == {np.dtype(np.float16)}
    whole = list(flowstate.Loader(normalized(images, "float16").build(), epochs=1))
    for g, w in zip(got, whole):
        assert g["jpg"].dtype == torch.float16
        assert np.array_equal(g["jpg"].numpy(), (w["jpg"].numpy() / np.float16(2)))

    p = normalized(images, "bfloat16", python_map=halve)
    with pytest.raises(flowstate.Error, match=r"field 'jpg' of record .* is bfloat16, which "
                                              r"numpy has no type for"):
        list(flowstate.Loader(p.build(), epochs=1))


class Float16Images(torch.utils.data.Dataset):
    """Normalized float16 images made by flowstate (normalize_image, dtype float16), one per
    index, with their labels."""

    def __init__(self, tar):
        p = normalized(tar, "float16", batch=1)
        self.items = [b["jpg"][0].numpy().copy() for b in flowstate.Loader(p.build(), epochs=1)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i], i


@pytest.mark.parametrize("workers", [1, 2])
def test_float16_batches_reach_torch_through_the_dataloaders_worker_processes(images, workers):
    ds = Float16Images(images)
    base = [(x.clone(), y.clone()) for x, y in
            flowstate.DataLoader(ds, batch_size=5, shuffle=True, seed=2)]
    loader = flowstate.DataLoader(ds, batch_size=5, shuffle=True, seed=2, num_workers=workers)
    it = iter(loader)
    x, y = next(it)
    assert x.dtype == torch.float16 and x.shape == (5, 3, 24, 32)
    state = loader.state_dict()
    rest = flowstate.DataLoader(ds, batch_size=5, shuffle=True, seed=2, num_workers=workers)
    rest.load_state_dict(state)
    got = [(x, y)] + list(rest)
    assert len(got) == len(base) == 3
    for (gx, gy), (bx, by) in zip(got, base):
        assert gx.dtype == torch.float16
        assert torch.equal(gy, by) and np.array_equal(bits(gx), bits(bx))
        for row, i in zip(gx, gy):
            assert np.array_equal(bits(row), ds.items[int(i)].view(np.uint16))
