"""A real training loop (examples/python/train.py), killed with SIGKILL mid-epoch right after
a checkpoint and resumed from it, produces the uninterrupted run's losses bit for bit."""
import json
import os
import pathlib
import signal
import subprocess
import sys

TRAIN = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "train.py"


def train(tmp_path, data_dir, ckpt, kill_after=0):
    out = tmp_path / f"losses-{ckpt.name}-{kill_after}.json"
    run = subprocess.run([sys.executable, str(TRAIN), "--data", str(data_dir), "--ckpt", str(ckpt),
                          "--losses", str(out), "--kill-after-saves", str(kill_after)],
                         capture_output=True, text=True, env=os.environ.copy(), timeout=300)
    return run, out


def test_sigkill_mid_epoch_then_resume_gives_the_same_losses(tmp_path, data_dir):
    run, out = train(tmp_path, data_dir, tmp_path / "straight.pt")
    assert run.returncode == 0, run.stderr
    reference = json.loads(out.read_text())
    assert len(reference) == 2 * 63  # 2000 records, batch 32, 2 epochs

    ckpt = tmp_path / "killed.pt"
    run, out = train(tmp_path, data_dir, ckpt, kill_after=7)  # 21 batches into epoch 0
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert ckpt.exists() and not out.exists()
    run, out = train(tmp_path, data_dir, ckpt)
    assert run.returncode == 0, run.stderr
    assert "resumed at step 21" in run.stdout
    assert json.loads(out.read_text()) == reference


TRAIN_DATALOADER = TRAIN.parent / "train_dataloader.py"


def train_dataloader(tmp_path, ckpt, workers, kill_after=0):
    out = tmp_path / f"dl-losses-{ckpt.name}-{workers}-{kill_after}.json"
    run = subprocess.run([sys.executable, str(TRAIN_DATALOADER), "--ckpt", str(ckpt),
                          "--workers", str(workers), "--losses", str(out),
                          "--kill-after-saves", str(kill_after)],
                         capture_output=True, text=True, env=os.environ.copy(), timeout=300)
    return run, out


def test_a_torch_dataloader_script_on_flowstate_resumes_with_other_workers_bit_for_bit(tmp_path):
    """The issue's done-when: a script written for torch.utils.data.DataLoader (tuples,
    set_epoch, gradient accumulation) with its import changed to flowstate, SIGKILLed mid-epoch
    right after a torch.save, resumed with a different num_workers: the same losses."""
    run, out = train_dataloader(tmp_path, tmp_path / "straight.pt", workers=2)
    assert run.returncode == 0, run.stderr
    reference = json.loads(out.read_text())
    assert len(reference) == 3 * 38  # 600 items, batch 16, 3 epochs

    ckpt = tmp_path / "killed.pt"
    run, out = train_dataloader(tmp_path, ckpt, workers=2, kill_after=17)  # 51 batches: epoch 1
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert ckpt.exists() and not out.exists()
    run, out = train_dataloader(tmp_path, ckpt, workers=0)
    assert run.returncode == 0, run.stderr
    assert "resumed in epoch 1 after 12 batches" in run.stdout
    assert json.loads(out.read_text()) == reference
