"""A checkpoint that zcc.torch.Checkpointer took through a real zccd loads with
the `safetensors` package alone (never torch.load) into exactly the model's
state dict, the optimizer's state and zccd's EMA."""

import json
import os

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from zcc.torch import Checkpointer
from zccd_process import Zccd

STEPS = 6


def refuse_torch_load(*args, **kwargs):
    raise AssertionError("the interop check must not use torch.load")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.fc = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.out = torch.nn.Linear(8, 3, bias=False)
        self.bf16 = torch.nn.Parameter(torch.randn(4, 4).to(torch.bfloat16))

    def forward(self, ids):
        x = self.bn(torch.relu(self.fc(self.embed(ids))))
        return self.out(x) + self.bf16.float().sum()


def main():
    torch.load = refuse_torch_load
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with Zccd("interop") as d:
        ck = Checkpointer(model, opt, job_id="interop", socket=d.socket, root=d.root,
                          save_every=STEPS, ema_decay=0.75, backpressure="block")
        for step in range(1, STEPS + 1):
            loss = model(torch.randint(0, 10, (16,))).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            assert ck.step(step) == "enqueued"
        ck.flush()
        d.wait_latest("interop", STEPS)
        ema = ck.ema_state_dict(include_buffers=False)
        step_dir = os.path.join(d.job_dir("interop"), "step-%08d" % STEPS)

        with open(os.path.join(step_dir, "model.safetensors.index.json")) as f:
            index = json.load(f)
        weight_map = index["weight_map"]
        expected = model.state_dict()
        assert set(weight_map) == set(expected), (sorted(weight_map), sorted(expected))

        # safe_open(framework="pt"), shard by shard as the index says.
        loaded = {}
        for shard in sorted(set(weight_map.values())):
            with safe_open(os.path.join(step_dir, shard), framework="pt") as f:
                for name in f.keys():
                    if name in weight_map:
                        assert weight_map[name] == shard, name
                        loaded[name] = f.get_tensor(name)
        assert loaded.keys() == expected.keys()
        for name, t in expected.items():
            got = loaded[name]
            assert got.dtype == t.dtype and got.shape == t.shape, (name, got.dtype, got.shape)
            assert torch.equal(got, t), name
            assert got.view(-1).view(torch.uint8).numpy().tobytes() == \
                t.contiguous().view(-1).view(torch.uint8).numpy().tobytes(), name
        # load_state_dict accepts it as is.
        fresh = Net()
        fresh.load_state_dict(loaded)
        assert torch.equal(fresh.bn.running_var, model.bn.running_var)

        # The F32 tensors with the numpy framework too.
        with safe_open(os.path.join(step_dir, weight_map["fc.weight"]), framework="numpy") as f:
            assert np.array_equal(f.get_tensor("fc.weight"), model.fc.weight.detach().numpy())

        # Optimizer state and EMA shards are safetensors files as well.
        optim = load_file(os.path.join(step_dir, "optim-r00000.safetensors"))
        state = opt.state[model.fc.weight]
        assert torch.equal(optim["optimizer.state.fc.weight.exp_avg"], state["exp_avg"])
        assert torch.equal(optim["optimizer.state.fc.weight.exp_avg_sq"], state["exp_avg_sq"])
        assert torch.equal(optim["optimizer.state.fc.weight.step"], state["step"])
        ema_files = [n for n in os.listdir(step_dir) if n.startswith("ema-")]
        assert ema_files, os.listdir(step_dir)
        on_disk = load_file(os.path.join(step_dir, ema_files[0]))
        assert set(on_disk) == set(ema), (sorted(on_disk), sorted(ema))
        for name, t in ema.items():
            assert torch.equal(on_disk[name], t), name
        ck.close()
        assert d.stop() == 0, d.log()
    print("interop: %d model tensors, optimizer state and %d EMA tensors load with safetensors"
          % (len(expected), len(ema)))


if __name__ == "__main__":
    main()
