"""An Accelerate training script in the style of transformers' run_clm_no_trainer.py: an
Accelerator, a DeepSpeed plugin from the Accelerate config, the micro-batch from the DataLoader
and accumulation from the Accelerator. The model is the GPT of gpt.py on generated tokens. Needs
the [hf] extra (accelerate).

    zerotune tune accelerate launch --config_file examples/accelerate_deepspeed.yaml \
        examples/accelerate_train.py --per_device_train_batch_size 8 --gradient_accumulation_steps 2

(the ds_config its Accelerate config names lists stages 0-2 and an "auto" micro-batch to search);
then, without zerotune, train with the command it wrote (autotuning_results/cmd_optimal.txt),
its Accelerate config pointing at the chosen ds_config:

    accelerate launch --config_file autotuning_results/accelerate_config_optimal.yaml \
        examples/accelerate_train.py --per_device_train_batch_size 16 --gradient_accumulation_steps 1

With ``--engines deepspeed,fsdp --fsdp-wrap Block`` after ``zerotune tune``, trials run PyTorch
FSDP2 too (each ``Block`` a unit), and the Accelerate config written is the winner's.
"""

import argparse

import torch
from accelerate import Accelerator
from gpt import GPT, MODELS, SyntheticTokens  # beside this script: its folder is on sys.path
from torch.utils.data import DataLoader


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--learning_rate", type=float, default=1e-3)
    p.add_argument("--max_train_steps", type=int, default=100)
    p.add_argument("--model", choices=sorted(MODELS), default="small")
    args = p.parse_args()

    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    vocab, d_model, layers, heads, seq_len = MODELS[args.model]
    torch.manual_seed(0)
    model = GPT(vocab, d_model, layers, heads, seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    data = DataLoader(SyntheticTokens(vocab, seq_len), batch_size=args.per_device_train_batch_size)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    step, loss = 0, None
    model.train()
    for tokens in data:
        with accelerator.accumulate(model):
            loss = model(tokens)  # the next-token loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            step += 1
            if step >= args.max_train_steps:
                break
    if accelerator.is_main_process:
        # accelerate.prepare returns DeepSpeed's engine under a DeepSpeed plugin, the sharded model under FSDP.
        engine = "deepspeed" if hasattr(model, "zero_optimization_stage") else accelerator.distributed_type.value
        stage = model.zero_optimization_stage() if engine == "deepspeed" else None
        print(
            f"loss={loss.item():.4f} steps={step} engine={engine} zero_stage={stage} "
            f"micro_batch={args.per_device_train_batch_size} accumulation={accelerator.gradient_accumulation_steps}",
            flush=True,
        )
    accelerator.end_training()  # ends the process group too, before the interpreter's exit


if __name__ == "__main__":
    main()
