"""A PyTorch training script written for torch.utils.data.DataLoader -- a map-style dataset of
(x, y) tuples, `for epoch in range(E): loader.set_epoch(epoch); for x, y in loader:`, gradient
accumulation, torch.save of model, optimizer and loader -- that runs on flowstate by changing
one import, and then resumes exactly after a crash, with any number of workers.

    PYTHONPATH=build/dev/python python3 examples/python/train_dataloader.py --ckpt t.pt
    # kill -9 it at any moment, run it again (also with another --workers): it continues
    # with exactly the batches, and so exactly the losses, of an uninterrupted run

tests/python/test_training.py kills it mid-epoch and compares the losses bit for bit.
"""
import argparse
import json
import os
import signal

import torch
from torch.utils.data import Dataset

from flowstate import DataLoader  # was: from torch.utils.data import DataLoader


class Regression(Dataset):
    """(x, y) pairs: y is a noisy linear function of x. The noise comes from torch's global
    generator, as an augmentation's would (flowstate seeds it per batch, so it is the same for
    any num_workers and after a resume)."""

    def __init__(self, n):
        self.n = n
        self.w = torch.linspace(-1.0, 1.0, 8)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.sin(torch.arange(8, dtype=torch.float32) * (i + 1) * 0.37)
        y = (x * self.w).sum().unsqueeze(0) + 0.01 * torch.randn(1)
        return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", required=True, help="the trainer's checkpoint file (torch.save)")
    ap.add_argument("--items", type=int, default=600)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--accumulate", type=int, default=3, help="batches per optimizer step")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--losses", help="write the run's losses here (JSON, float.hex)")
    ap.add_argument("--kill-after-saves", type=int, default=0,
                    help="test hook: SIGKILL this process right after its N-th checkpoint")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)  # bit-identical arithmetic from run to run
    loader = DataLoader(Regression(args.items), batch_size=args.batch, shuffle=True,
                        num_workers=args.workers, seed=1234)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start_epoch, in_epoch, losses = 0, 0, []
    if os.path.exists(args.ckpt):
        ck = torch.load(args.ckpt)
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        loader.load_state_dict(ck["loader"])
        start_epoch, in_epoch, losses = ck["epoch"], ck["in_epoch"], ck["losses"]
        print(f"resumed in epoch {start_epoch} after {in_epoch} batches")

    saves = 0
    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)
        for x, y in loader:
            in_epoch += 1
            last = in_epoch == len(loader)
            loss = torch.nn.functional.mse_loss(model(x), y)
            # The mean over the accumulation window (a short last window: its own length).
            start = (in_epoch - 1) // args.accumulate * args.accumulate
            (loss / min(args.accumulate, len(loader) - start)).backward()
            losses.append(loss.item())
            if in_epoch % args.accumulate == 0 or last:
                optimizer.step()
                optimizer.zero_grad()
                done = (epoch + 1, 0) if last else (epoch, in_epoch)
                tmp = args.ckpt + ".tmp"
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "loader": loader.state_dict(), "epoch": done[0], "in_epoch": done[1],
                            "losses": losses}, tmp)
                os.replace(tmp, args.ckpt)
                saves += 1
                if saves == args.kill_after_saves:
                    os.kill(os.getpid(), signal.SIGKILL)
        in_epoch = 0
    print(f"{len(losses)} batches, last loss {losses[-1]:.6f}")
    if args.losses:
        with open(args.losses, "w") as f:
            json.dump([float.hex(v) for v in losses], f)


if __name__ == "__main__":
    main()
