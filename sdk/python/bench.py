"""Times monkeytree.save/load of a training state through a staging buffer in /dev/shm.

usage, at the checkout's root:

    MONKEYTREE_CRC32C_LIB=native/build/Release/monkeytree_crc32c.node PYTHONPATH=sdk/python \
        .venv/bin/python sdk/python/bench.py [MEGABYTES]

MEGABYTES (default 100) is the state: parameters plus Adam's two moments, each a third of it.
"""
import os
import sys
import time

import torch

import monkeytree


def main(megabytes=100):
    per_tensor = 1 << 20
    count = max(1, int(megabytes * 2**20 / 3 / 4 / per_tensor))
    params = [torch.nn.Parameter(torch.randn(per_tensor)) for _ in range(count)]
    optimizer = torch.optim.Adam(params, lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    state = {"model": {f"w{i}": p.detach() for i, p in enumerate(params)}, "optim": optimizer.state_dict(),
             "step": 1, "rng": monkeytree.rng_state()}
    name = f"monkeytree-bench-{os.getpid()}"
    path = f"/dev/shm/{name}"
    with open(path, "wb") as file:
        file.truncate(int(megabytes * 2**20 * 1.01) + (1 << 20))
    try:
        start = time.perf_counter()
        length = monkeytree.save(state, name)
        saved = time.perf_counter() - start
        target = {"model": {k: torch.empty_like(v) for k, v in state["model"].items()},
                  "optim": {"state": {k: {n: torch.empty_like(t) for n, t in v.items()}
                                      for k, v in state["optim"]["state"].items()},
                            "param_groups": None},
                  "step": 0, "rng": b""}
        start = time.perf_counter()
        monkeytree.load(target, name)
        loaded = time.perf_counter() - start
    finally:
        os.unlink(path)
    same = all(torch.equal(a, b) for a, b in zip(state["model"].values(), target["model"].values()))
    mb = length / 1e6
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s): {mb:.1f} MB checkpoint,"
          f" save {saved:.2f} s ({mb / saved:.0f} MB/s), load {loaded:.2f} s ({mb / loaded:.0f} MB/s),"
          f" restored identical: {same}")


if __name__ == "__main__":
    main(*(float(a) for a in sys.argv[1:]))
