"""Screen of the Conv-4 encoder as a plain classifier on Fashion-MNIST (docs/image-model.md).

Cross-entropy on a linear layer over the encoder's pooled features, the training
optimiser and schedule of ``hypsearch train`` (Adam, lr 4e-3 with warm-up and
cosine decay, weight decay 5e-4 on kernels, batch 256, bfloat16 autocast where the
CPU has it, one torch thread), all 60,000 training images; after every epoch the
test accuracy, and with the flip average (the logits of an image and its mirror
image summed). It tells what accuracy the encoder itself reaches in a budget,
apart from the hyperbolic head and its losses::

    python benchmarks/encoder_screen.py VARIANT EPOCHS [SEED]

VARIANT: ``base`` (the default Conv-4), ``ceil`` (2x2 pooling in ceil mode, which
keeps the last row and column of odd sizes), ``ceil_d34`` (a second convolution in
the last two blocks), ``ceil_w48`` (widths 48-96-192-192); ``+flip`` trains with
horizontal flips (e.g. ``base+flip``). Prints one JSON line an epoch.
"""

from __future__ import annotations

import json
import math
import sys
import time

import torch
from torch import nn

from models.images.datasets import load_fashion_mnist
from models.images.preprocess import Preprocess
from models.vision.encoders import _block

VARIANTS = {
    "base": dict(widths=[32, 64, 128, 128], depths=[1, 1, 1, 1], ceil=False),
    "ceil": dict(widths=[32, 64, 128, 128], depths=[1, 1, 1, 1], ceil=True),
    "ceil_d34": dict(widths=[32, 64, 128, 128], depths=[1, 1, 2, 2], ceil=True),
    "ceil_w48": dict(widths=[48, 96, 192, 192], depths=[1, 1, 1, 1], ceil=True),
}


def block(c_in: int, c_out: int, depth: int, ceil: bool) -> nn.Sequential:
    """The pool-first block of models.vision.encoders (conv, 2x2 max pool, BN, ReLU, then
    ``depth - 1`` more convolutions at the pooled size), its pooling in ceil mode
    where asked."""
    b = _block(c_in, c_out, depth, pool_first=True)
    for m in b:
        if isinstance(m, nn.MaxPool2d):
            m.ceil_mode = ceil
    return b


def main() -> int:
    variant, epochs = sys.argv[1], int(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    name, _, aug = variant.partition("+")
    if name not in VARIANTS or aug not in ("", "flip"):
        raise SystemExit(f"unknown variant {variant!r} ({', '.join(VARIANTS)}, optionally +flip)")
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    tr, te = load_fashion_mnist("train"), load_fashion_mnist("test")

    norm = Preprocess()  # Fashion-MNIST's mean and std, as training normalises

    def pixels(s):
        return (torch.tensor(s.images).float().div(255).unsqueeze(1) - norm.mean[0]) / norm.std[0]

    xtr, xte = pixels(tr), pixels(te)
    ytr, yte = torch.tensor(tr.targets), torch.tensor(te.targets)
    v = VARIANTS[name]
    chans = [1, *v["widths"]]
    body = nn.Sequential(
        *[block(chans[i], chans[i + 1], v["depths"][i], v["ceil"]) for i in range(4)]
    )
    fc = nn.Linear(chans[-1], 10)
    net = nn.Sequential(body, nn.AdaptiveAvgPool2d(1), nn.Flatten(), fc)
    net = net.to(memory_format=torch.channels_last)
    params = list(net.parameters())
    opt = torch.optim.Adam(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 5e-4},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=4e-3,
    )
    bs, n = 256, len(xtr)
    steps, it, warm, lr, min_lr = epochs * math.ceil(n / bs), 0, 100, 4e-3, 4e-5
    t0 = time.perf_counter()
    for epoch in range(epochs):
        net.train()
        order = torch.randperm(n)
        for s in range(0, n, bs):
            rows = order[s : s + bs]
            x = xtr[rows]
            if aug == "flip":
                flip = torch.rand(len(rows)) < 0.5
                x[flip] = x[flip].flip(-1)
            ratio = (it - warm) / max(1, steps - warm)
            now = (
                lr * (it + 1) / warm
                if it < warm
                else min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (lr - min_lr)
            )
            for g in opt.param_groups:
                g["lr"] = now
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = net(x.contiguous(memory_format=torch.channels_last))
            loss = nn.functional.cross_entropy(out.float(), ytr[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
            it += 1
        seconds = time.perf_counter() - t0
        net.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits = torch.cat([net(xte[s : s + 1000]).float() for s in range(0, len(xte), 1000)])
            mirror = torch.cat(
                [net(xte[s : s + 1000].flip(-1)).float() for s in range(0, len(xte), 1000)]
            )
        acc = float((logits.argmax(1) == yte).float().mean())
        both = float(((logits + mirror).argmax(1) == yte).float().mean())
        row = {"variant": variant, "epoch": epoch + 1, "seconds": round(seconds, 1)}
        print(json.dumps(row | {"test_acc": round(acc, 4), "flip_average_acc": round(both, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
