"""flowstate.Loader(..., process_group=...) over torch.distributed (gloo): ranks spawned with
torch.multiprocessing, a collective checkpoint mid-epoch (one step-N holding every rank's
part), and a collective restore that continues every rank exactly."""
import json
import os

import pytest

torch = pytest.importorskip("torch")
flowstate = pytest.importorskip("flowstate")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

WORLD = 3
CUT = 7


def _rank_main(rank, doc, work):
    dist.init_process_group("gloo", init_method=f"file://{work}/rendezvous", rank=rank,
                            world_size=WORLD)
    try:
        doc = dict(doc)
        doc["nodes"] = [{"shard": {"rank": rank, "world": WORLD}},
                        {"shuffle": {"mode": "global"}}, {"batch": {"size": 16}}]
        pipeline = flowstate.Pipeline.from_dict(doc)

        def ids(batch):  # each record starts with its index, a little-endian uint32
            d = batch["data"][:, :4].to(torch.int64)
            return (d[:, 0] | d[:, 1] << 8 | d[:, 2] << 16 | d[:, 3] << 24).tolist()

        full = [ids(b) for b in flowstate.Loader(pipeline, epochs=2)]
        loader = flowstate.Loader(pipeline, epochs=2, process_group=dist.group.WORLD)
        before = [ids(next(loader)) for _ in range(CUT)]
        loader.save_checkpoint(f"{work}/ck")  # collective
        del loader
        resumed = flowstate.Loader(pipeline, epochs=2, process_group=dist.group.WORLD)
        found = resumed.restore(f"{work}/ck")  # collective: every rank takes the same step
        after = [ids(b) for b in resumed]
        with open(f"{work}/rank-{rank}.json", "w") as f:
            json.dump({"full": full, "before": before, "after": after,
                       "found": str(found)}, f)
    finally:
        dist.destroy_process_group()


def test_a_process_group_checkpoints_and_restores_all_ranks_at_one_step(tmp_path, records_doc):
    mp.spawn(_rank_main, args=(records_doc, str(tmp_path)), nprocs=WORLD, join=True)
    step = tmp_path / "ck" / f"step-{CUT:012d}"
    assert sorted(p.name for p in step.iterdir()) == sorted(
        ["MANIFEST.json"] + [f"rank-{r:05d}.bin" for r in range(WORLD)])
    manifest = json.loads((step / "MANIFEST.json").read_text())
    assert manifest["world"] == WORLD and manifest["step"] == CUT
    seen = set()
    for rank in range(WORLD):
        r = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert r["before"] + r["after"] == r["full"], f"rank {rank}"
        assert len(r["full"]) == len(json.loads((tmp_path / "rank-0.json").read_text())["full"])
        seen |= {i for batch in r["full"] for i in batch}
    assert seen == set(range(2000))  # the ranks together read every record
