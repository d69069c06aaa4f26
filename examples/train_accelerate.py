"""Trains a tiny Hugging Face Llama (built from a config, no download) with a
training loop run by Accelerate on the CPU, checkpointed with zcc.accelerate.

    python3 train_accelerate.py --socket /tmp/zcc-example/zccd.sock \\
        --root /tmp/zcc-example/ckpt --steps 30 --save-every 10

Run again with the same arguments and it resumes from the newest checkpoint
(zccd's memory of a trainer that died, or disk): the model, AdamW, the
schedule, the random generators and the data loader's position, so that
every step after the resume has the loss the uninterrupted run had. Each step
prints "step=N loss=<float.hex()>".
"""

import signal
import sys
import warnings

import torch

import integration_common


def parse_args(argv):
    return integration_common.parser(__doc__.split("\n")[0], "accelerate").parse_args(argv)


def main(argv):
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, set_seed

    set_seed(0)
    # A stateful loader (its position is checkpointed) whose shuffle comes
    # from a seed of its own and the epoch, not from a draw of torch's
    # generator when an epoch's iterator is made: a resumed iterator must
    # shuffle as the interrupted one did.
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        use_stateful_dataloader=True, use_seedable_sampler=True))
    model = integration_common.tiny_llama()
    # 80 sequences of 17 tokens: 10 batches of 8 an epoch, shuffled, each
    # epoch as the seedable sampler's seed and the epoch say (a run killed
    # after step 17 resumes in the second epoch, a restart from step 10 at
    # the end of the first).
    tokens = torch.randint(0, 256, (80, 17), generator=torch.Generator().manual_seed(1))
    # Its own generator: a new iterator draws a seed for its workers from
    # the loader's generator, not from torch's, which the dropout draws from
    # (a resumed iterator is made at another step than the interrupted one).
    loader = torch.utils.data.DataLoader(tokens, batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + 0.05 * s))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    ckpt = None
    start = 1
    if not args.no_zcc:
        import zcc.accelerate
        ckpt = zcc.accelerate.Checkpointer(accelerator, model, optimizer, job_id=args.job,
                                           socket=args.socket, root=args.root,
                                           save_every=args.save_every, scheduler=scheduler,
                                           dataloader=loader, backpressure="block")
        restored = ckpt.restore()
        print("restored=%s from=%s" % (restored, ckpt.restored_from), flush=True)
        start = (restored or 0) + 1

    model.train()
    batches = None
    for step in range(start, args.steps + 1):
        batch = next(batches, None) if batches is not None else None
        while batch is None:  # the first batch, or a new epoch
            batches = iter(loader)
            batch = next(batches, None)
        loss = model(input_ids=batch[:, :-1], labels=batch[:, 1:]).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        result = ckpt.step(step) if ckpt is not None else "off"
        print("step=%d loss=%s batch=%d snapshot=%s" % (step, loss.item().hex(), int(batch.sum()),
                                                        result), flush=True)
        if step == args.pause_after:
            ckpt.flush()
            print("paused", flush=True)
            while True:
                signal.pause()  # the test kills this process here
    if ckpt is not None:
        ckpt.flush()
        ckpt.close()
    integration_common.finish()
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
