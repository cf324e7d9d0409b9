"""A real Hugging Face Trainer script in the style of transformers' run_clm.py: HfArgumentParser,
TrainingArguments(deepspeed=...), and "auto" batch values in the ds_config. A small GPT-2 is
built from a config (nothing is downloaded) and trained on generated tokens. Needs the [hf]
extra (transformers, accelerate).

With zerotune, which searches what ``ds_config_hf_trainer.json`` lists (ZeRO stages 1 and 2,
the micro-batch) at the global batch the arguments give (8 x 2 x 2 processes):

    zerotune tune --num-gpus 2 examples/hf_trainer.py --deepspeed examples/ds_config_hf_trainer.json \
        --output_dir hf_out --per_device_train_batch_size 8 --gradient_accumulation_steps 2 \
        --max_steps 200 --report_to none --save_strategy no

zerotune sees TrainingArguments and sets each trial's micro-batch and accumulation through
--per_device_train_batch_size and --gradient_accumulation_steps. Without it, plain DeepSpeed
trains on the config it chose, with the batch options it wrote (autotuning_results/cmd_optimal.txt
has the whole command):

    deepspeed --num_gpus 2 examples/hf_trainer.py --deepspeed autotuning_results/ds_config_optimal.json \
        --output_dir hf_out --per_device_train_batch_size 16 --gradient_accumulation_steps 1 \
        --max_steps 200 --report_to none --save_strategy no

On a machine without GPUs prefix either with ``DS_ACCELERATOR=cpu``. With ``--engines
deepspeed,fsdp`` after ``zerotune tune``, trials run PyTorch FSDP2 too (``--fsdp --fsdp_config``
in place of ``--deepspeed``), and the choice is made across both engines.
"""

from dataclasses import dataclass, field

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    n_layer: int = field(default=4, metadata={"help": "transformer blocks"})
    n_embd: int = field(default=256, metadata={"help": "hidden size"})
    n_head: int = field(default=4, metadata={"help": "attention heads"})
    vocab_size: int = field(default=4096, metadata={"help": "vocabulary size"})
    seq_len: int = field(default=128, metadata={"help": "tokens per sample"})
    num_samples: int = field(default=4096, metadata={"help": "samples in the generated data set"})


class GeneratedTokens(torch.utils.data.Dataset):
    """Deterministic pseudo-random token sequences: a stand-in for a tokenized corpus."""

    def __init__(self, n: int, seq_len: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        ids = self.data[i]
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    model_args, training_args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    config = GPT2Config(
        n_layer=model_args.n_layer,
        n_embd=model_args.n_embd,
        n_head=model_args.n_head,
        vocab_size=model_args.vocab_size,
        n_positions=model_args.seq_len,
    )
    torch.manual_seed(training_args.seed)
    model = GPT2LMHeadModel(config)
    data = GeneratedTokens(model_args.num_samples, model_args.seq_len, model_args.vocab_size)
    trainer = Trainer(model=model, args=training_args, train_dataset=data)
    result = trainer.train()
    if training_args.should_log:
        stage = trainer.model_wrapped.zero_optimization_stage() if training_args.deepspeed else None
        print(f"train_loss={result.training_loss:.4f} steps={result.global_step} zero_stage={stage}")
    if torch.distributed.is_initialized():
        # Ended here, not left to the interpreter's exit: there, gloo's threads can abort a rank
        # that has finished training ("terminate called without an active exception").
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
