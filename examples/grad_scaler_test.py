"""The fp16 loss scaler is part of each integration's zcc state, and comes
back with the step (a resumed run otherwise starts again from the initial
scale): zcc.accelerate (the accelerator's scaler, through the loss-scaling
optimizer step, which must still fence), zcc.hf (the Trainer's
AcceleratedOptimizer's) and zcc.lightning (the precision plugin's). A CPU
gives Accelerate and the Trainer no fp16 scaler of their own, so a real torch
GradScaler on the CPU stands where a GPU run has theirs; Lightning takes it
as its "16-mixed" plugin's and trains with it."""

import warnings

import torch

from zccd_process import Zccd


def scaled(init_scale):
    return torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1)


def check_accelerate(d):
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    import zcc.accelerate

    def build():
        acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
            use_stateful_dataloader=True))
        acc.scaler = scaled(1024.0)
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)
        model, opt, loader = acc.prepare(model, opt, loader)
        ck = zcc.accelerate.Checkpointer(acc, model, opt, job_id="scaler-acc", socket=d.socket,
                                         root=d.root, save_every=2, dataloader=loader,
                                         backpressure="block")
        return acc, model, opt, loader, ck

    acc, model, opt, loader, ck = build()
    assert ck.state["grad_scaler"] is acc.scaler, ck.state
    fences = []
    fence = ck.fence
    ck.fence = lambda: (fences.append(1), fence())
    for step, batch in enumerate(loader, 1):
        acc.backward(model(batch).pow(2).mean())
        opt.step()  # the scaler's step: its patch, then the method it saved
        opt.zero_grad()
        ck.step(step)
        if step == 2:
            break
    assert len(fences) == 2, fences
    # growth_interval=1: each step without an overflow doubled the scale.
    assert acc.scaler.get_scale() == 4096.0, acc.scaler.state_dict()
    ck.flush()
    ck.close()
    d.wait_latest("scaler-acc", 2)
    acc, model, opt, loader, ck = build()
    assert ck.restore() == 2
    assert acc.scaler.get_scale() == 4096.0, acc.scaler.state_dict()
    ck.close()


def check_hf(d):
    from accelerate.optimizer import AcceleratedOptimizer
    from zcc.hf import ZccCallback

    model = torch.nn.Linear(4, 2)
    scaler = scaled(512.0)
    opt = AcceleratedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               device_placement=False, scaler=scaler)
    cb = ZccCallback(job_id="scaler-hf")
    cb._save_every = 0  # (as on_train_begin sets it from the Trainer's arguments)
    ck = cb._make_checkpointer(model, opt, None, None, {"socket": d.socket, "root": d.root})
    assert ck.state["grad_scaler"] is scaler, ck.state
    assert ck.optimizer is opt.optimizer
    ck.close()


def check_lightning(d):
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.precision import MixedPrecision
    from zcc.lightning import ZccCallback

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Seen(pl.Callback):
        scale = None

        def on_fit_start(self, trainer, pl_module):  # (after ZccCallback's restore)
            Seen.scale = trainer.precision_plugin.scaler.get_scale()

    def fit(init_scale, steps):
        torch.manual_seed(0)
        scaler = scaled(init_scale)
        zcb = ZccCallback(job_id="scaler-pl", save_every=1, socket=d.socket, root=d.root,
                          backpressure="block")
        trainer = pl.Trainer(accelerator="cpu", max_steps=steps, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False,
                             plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
                             callbacks=[zcb, Seen()])
        trainer.fit(Tiny(), torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4))
        return scaler, zcb

    scaler, zcb = fit(256.0, 3)
    assert zcb.restored_step is None
    saved = scaler.get_scale()
    assert saved != 256.0, scaler.state_dict()
    d.wait_latest("scaler-pl", 3)
    _, zcb = fit(1.0, 3)
    assert zcb.restored_step == 3, zcb.restored_step
    assert Seen.scale == saved, (Seen.scale, saved)


def main():
    warnings.filterwarnings("ignore")
    with Zccd("scaler") as d:
        for check in (check_accelerate, check_hf, check_lightning):
            check(d)
            print("ok %s" % check.__name__, flush=True)
        assert d.stop() == 0, d.log()
    print("grad_scaler_test: OK")


if __name__ == "__main__":
    main()
