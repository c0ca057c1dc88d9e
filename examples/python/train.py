"""A real training loop over a flowstate pipeline: a small torch.nn model trained with SGD and
gradient accumulation, checkpointed with torch.save({model, optimizer, loader.state_dict()})
after every optimizer step, and resumed from that file after a crash — with exactly the
batches, and so exactly the losses, of an uninterrupted run.

    flowstate gen records --out data --records 65536 --record-bytes 16 --shards 2
    PYTHONPATH=build/dev/python python3 examples/python/train.py --data data --ckpt train.pt
    # kill it at any moment (kill -9), run the same command again: it continues exactly

Each 16-byte record is a sample: the first 8 bytes are the input, the mean of the last 8 the
target (tests/python/test_training.py runs this script, kills it and compares the losses).
"""
import argparse
import json
import os
import signal

import torch

import flowstate


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="directory of .bin record files (16 bytes each)")
    ap.add_argument("--ckpt", required=True, help="the trainer's checkpoint file (torch.save)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--accumulate", type=int, default=3, help="batches per optimizer step")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--losses", help="write the run's losses here (JSON, float.hex)")
    ap.add_argument("--kill-after-saves", type=int, default=0,
                    help="test hook: SIGKILL this process right after its N-th checkpoint")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)  # bit-identical arithmetic from run to run
    pipeline = (flowstate.records(paths=os.path.join(args.data, "*.bin"), record_bytes=16)
                .seed(1234).shuffle(mode="buffer", size=256).batch(size=args.batch).build())
    loader = flowstate.Loader(pipeline, workers=args.workers)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    acc = flowstate.GradientAccumulator(steps=args.accumulate, batch_size=args.batch)
    losses = []

    if os.path.exists(args.ckpt):
        ck = torch.load(args.ckpt)
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        loader.load_state_dict(ck["loader"])
        losses = ck["losses"]
        print(f"resumed at step {ck['loader']['step']}")

    saves = 0
    for epoch in range(loader.epoch, args.epochs):  # each pass over the loader is one epoch
        for batch in loader:
            data = batch["data"].float() / 255.0  # uint8 [B, 16], shared with flowstate (DLPack)
            x, y = data[:, :8], data[:, 8:].mean(dim=1, keepdim=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            (loss * acc.loss_scale(batch)).backward()
            losses.append(loss.item())
            if acc.sync_gradients(batch):  # every N-th batch, and the epoch's last
                for p in model.parameters():
                    p.grad.mul_(acc.step_scale(batch))
                optimizer.step()
                optimizer.zero_grad()
                tmp = args.ckpt + ".tmp"
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "loader": loader.state_dict(), "losses": losses}, tmp)
                os.replace(tmp, args.ckpt)
                saves += 1
                if saves == args.kill_after_saves:
                    os.kill(os.getpid(), signal.SIGKILL)
    print(f"{len(losses)} batches, last loss {losses[-1]:.6f}")
    if args.losses:
        with open(args.losses, "w") as f:
            json.dump([float.hex(v) for v in losses], f)


if __name__ == "__main__":
    main()
