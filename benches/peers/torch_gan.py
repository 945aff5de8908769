"""PyTorch's equivalent of examples/gan/fashion-{dcgan,wgan,wgan-gp}.toml: the same networks layer
for layer (generator: linear z(100) -> 128x7x7, batch norm, ReLU, ConvTranspose 4x4/2 to 64
maps, batch norm, ReLU, ConvTranspose 4x4/2 to the image, tanh; discriminator: Conv 4x4/2 to
64 maps, LeakyReLU(0.2), Conv 4x4/2 to 128, batch norm, LeakyReLU, linear to one logit),
N(0, 0.02) initialisation, and the same updates: DCGAN (Adam lr 2e-4, betas (0.5, 0.999),
batch 128, the critic then the generator every batch, non-saturating loss) or WGAN
(RMSprop lr 5e-5, batch 64, weights clipped to 0.01, a generator update every 5 critic
updates) or WGAN-GP (Adam lr 1e-4, betas (0, 0.9), batch 64, no batch norm in the critic
(a bias on its second convolution instead), the gradient penalty with weight 10 at random
interpolations through torch.autograd.grad(create_graph=True), a generator update every 5
critic updates). Runs on `batches` batches of the Fashion-MNIST training images (pixels scaled
to [-1, 1]); only the time is compared with Trident, not the samples.

Prints seconds and images per second of the training pass, like benches/gan_epochs.sh
reads Trident's metrics.jsonl. Threads: TORCH_THREADS (default 2); COMPILE=1 compiles
both networks with torch.compile; PRECISION=bf16 runs the batches under
torch.autocast("cpu", dtype=torch.bfloat16) (as Trident's `precision = "bf16"`).

    python3 benches/peers/torch_gan.py dcgan|wgan|wgan-gp [batches]
"""

import gzip
import os
import sys
import time

import numpy as np
import torch
from torch import nn


def images(path):
    raw = gzip.open(path).read()
    n, h, w = (int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(3))
    return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, 1, h, w).astype(np.float32) / 127.5 - 1.0


def init(m):
    if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
        nn.init.normal_(m.weight, 0.0, 0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def networks(z=100, w=64, critic_bn=True):
    g = nn.Sequential(
        nn.Linear(z, 2 * w * 7 * 7), nn.Unflatten(1, (2 * w, 7, 7)), nn.BatchNorm2d(2 * w), nn.ReLU(),
        nn.ConvTranspose2d(2 * w, w, 4, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
        nn.ConvTranspose2d(w, 1, 4, 2, 1), nn.Tanh(),
    )
    d = nn.Sequential(
        nn.Conv2d(1, w, 4, 2, 1), nn.LeakyReLU(0.2),
        *((nn.Conv2d(w, 2 * w, 4, 2, 1, bias=False), nn.BatchNorm2d(2 * w)) if critic_bn
          else (nn.Conv2d(w, 2 * w, 4, 2, 1),)),
        nn.LeakyReLU(0.2),
        nn.Flatten(), nn.Linear(2 * w * 7 * 7, 1),
    )
    g.apply(init)
    d.apply(init)
    return g, d


def main():
    kind = sys.argv[1]
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "2")))
    torch.manual_seed(0)
    x = torch.from_numpy(images("data/fashion-mnist/train-images-idx3-ubyte.gz")[:54000].copy())
    gp = kind == "wgan-gp"
    g, d = networks(critic_bn=not gp)
    wgan = kind in ("wgan", "wgan-gp")
    bs, critic_steps = (64, 5) if wgan else (128, 1)
    if gp:
        og, od = (torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.0, 0.9)) for m in (g, d))
    elif wgan:
        og, od = (torch.optim.RMSprop(m.parameters(), lr=5e-5) for m in (g, d))
    else:
        og, od = (torch.optim.Adam(m.parameters(), lr=2e-4, betas=(0.5, 0.999)) for m in (g, d))
    if gp and os.environ.get("COMPILE") == "1":
        # Measured 2026-12-06 with PyTorch 2.15: the gradient penalty differentiates the
        # critic's compiled backward again (create_graph=True), which AOTAutograd refuses
        # ("does not currently support double backward"), with donated buffers off too.
        sys.exit("torch_gan.py: torch.compile cannot train wgan-gp (no double backward); run it without COMPILE=1")
    gs, ds = (torch.compile(g), torch.compile(d)) if os.environ.get("COMPILE") == "1" else (g, d)
    sp = nn.functional.softplus
    order = torch.randperm(len(x))

    def run(n):
        for t in range(n):
            real = x[order[(t * bs) % len(x):(t * bs) % len(x) + bs]]
            fake = gs(torch.randn(len(real), 100)).detach()
            sr, sf = ds(real), ds(fake)
            loss = (sf.mean() - sr.mean()) if wgan else (sp(-sr).mean() + sp(sf).mean())
            if gp:
                eps = torch.rand(len(real), 1, 1, 1)
                mixed = (eps * real + (1 - eps) * fake).requires_grad_(True)
                (grad,) = torch.autograd.grad(ds(mixed).sum(), mixed, create_graph=True)
                loss = loss + 10.0 * ((grad.flatten(1).norm(dim=1) - 1) ** 2).mean()
            od.zero_grad()
            loss.backward()
            od.step()
            if wgan and not gp:
                for p in d.parameters():
                    p.data.clamp_(-0.01, 0.01)
            if (t + 1) % critic_steps == 0:
                s = ds(gs(torch.randn(len(real), 100)))
                gl = -s.mean() if wgan else sp(-s).mean()
                og.zero_grad()
                gl.backward()
                og.step()

    bf16 = os.environ.get("PRECISION") == "bf16"
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        run(5)  # warm-up (and compilation)
        t0 = time.perf_counter()
        run(batches)
        secs = time.perf_counter() - t0
    print(f"{kind:7s} pytorch {torch.__version__}{' compiled' if os.environ.get('COMPILE') == '1' else ''}"
          f"{' bf16' if bf16 else ''}  "
          f"{batches} batches of {bs}  {secs:.2f} s  {batches * bs / secs:,.0f} ex/s")


if __name__ == "__main__":
    main()
