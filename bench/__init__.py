"""tileattn's benchmark CLI: the FlashAttention-2 lecture's measurements as one command.

    python3 -m bench sweep    TFLOP/s, GB/s and fraction of peak per shape and backend (CSV + PNG)
    python3 -m bench memory   peak memory of SDPA math / SDPA flash / tileattn, forward + backward
    python3 -m bench varlen   a ragged batch: padded vs packed (flash_attn_varlen_func)
    python3 -m bench profile  Nsight Compute counters of tileattn's forward (tensor-core
                              instructions, DRAM bytes) against a materialized S
    python3 -m bench readme   rewrite README.md's results block from a sweep CSV
    python3 -m bench ring     ring attention's weak scaling, 1 -> N GPUs over NCCL

Each subcommand takes --help.  Backends are a registry (bench/backends.py) that other code can
extend with --plugin MODULE.
"""
