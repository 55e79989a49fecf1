"""An FA1-style attention forward in Triton: the contrast that shows what FlashAttention-2 changed.

FlashAttention (v1, Dao et al. 2022, Algorithm 1) and its CUDA kernel differ from FA2 in three ways
that this kernel keeps on purpose:
  1. The grid covers batch x heads only; one program walks the whole query sequence (FA2 adds the
     query tiles to the grid).  `q_rows_per_program` < seqlen_q gives the sequence-parallel grid of
     FA2 while keeping everything else FA1 (backend "fa1-triton-seqpar"), so the two isolate
     change 1.
  2. Key/value blocks are the OUTER loop and query blocks the inner one, so the running output O
     and the row statistics (m, l) live in HBM: each inner step loads O_i, m_i, l_i, rescales O_i
     and stores it back (FA2 keeps them in registers and divides by l once at the end).
  3. Warps split along the keys: 16 query rows per step (FA1's STEP) and 4 warps, so Triton's
     mma layout puts the 4 warps side by side along the key block (its TTGIR for sm_90, d 64/128/256:
     mma.sync (MMA v2) with warpsPerCTA [1, 4]; 13 bar.sync in the PTX).  Row max
     and row sum then reduce across warps through shared memory, and P crosses shared memory on
     its way to the P V product (FA2 stacks warps along query rows: quad shuffles, no smem).
Forward only, no dropout/window/softcap: it exists to be timed, not to be used.
"""
import math

import torch
import triton
import triton.language as tl

BLOCK_M = 16  # FA1's query step: one mma M tile, so the 4 warps can only split the keys
NUM_WARPS = 4


def key_block(head_dim):
    """Keys per outer step.  K_j and V_j stay on chip for the whole inner loop; 64 x d128 x 2 B
    x 2 tensors = 32 KB, the same budget at d256 with 32 keys."""
    return 64 if head_dim <= 128 else 32


@triton.jit
def _fa1_forward_kernel(
    Q, K, V, O_acc, Row_max, Row_sum,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    num_heads, heads_per_kv, seqlen_q, seqlen_k, head_dim, q_rows_per_program, scale_log2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
):
    bh = tl.program_id(0)
    batch = bh // num_heads
    head = bh % num_heads
    kv_head = head // heads_per_kv
    q_begin = tl.program_id(1) * q_rows_per_program
    q_end = tl.minimum(q_begin + q_rows_per_program, seqlen_q)
    diagonal = seqlen_k - seqlen_q  # causal is bottom-right aligned: row i sees keys j <= i + diagonal

    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < head_dim
    q_base = Q + batch * stride_qb + head * stride_qh
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    o_base = O_acc + batch * stride_ob + head * stride_oh
    stat_base = bh * seqlen_q  # Row_max / Row_sum are (batch * heads, seqlen_q)

    # Outer loop: key/value blocks (Algorithm 1, line 5).
    for n0 in range(0, seqlen_k, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        key_ok = keys < seqlen_k
        k = tl.load(k_base + keys[:, None] * stride_ks + cols[None, :], mask=key_ok[:, None] & col_ok[None, :], other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vs + cols[None, :], mask=key_ok[:, None] & col_ok[None, :], other=0.0)
        m_first = q_begin
        if CAUSAL:
            # Rows before n0 - diagonal see none of this block's keys.
            first_row = tl.maximum(n0 - diagonal, 0)
            m_first = tl.maximum(q_begin, (first_row // BLOCK_M) * BLOCK_M)
        # Inner loop: query blocks (line 7), each a round trip of O_i, m_i, l_i through HBM.
        for m0 in range(m_first, q_end, BLOCK_M):
            rows = m0 + tl.arange(0, BLOCK_M)
            row_ok = rows < q_end
            tile_ok = row_ok[:, None] & col_ok[None, :]
            q = tl.load(q_base + rows[:, None] * stride_qs + cols[None, :], mask=tile_ok, other=0.0)
            o = tl.load(o_base + rows[:, None] * stride_os + cols[None, :], mask=tile_ok, other=0.0)
            m_old = tl.load(Row_max + stat_base + rows, mask=row_ok, other=float("-inf"))
            l_old = tl.load(Row_sum + stat_base + rows, mask=row_ok, other=0.0)

            # S_ij = Q_i K_j^T, in log2 units (line 9).
            s = tl.dot(q, tl.trans(k)) * scale_log2
            visible = key_ok[None, :]
            if CAUSAL:
                visible = visible & (keys[None, :] <= rows[:, None] + diagonal)
            s = tl.where(visible, s, float("-inf"))

            # m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij)   (line 10)
            # A row with no visible key so far keeps m = -inf; 0 stands in as its offset so that
            # exp2(-inf - 0) = 0 and never -inf - -inf = NaN.
            m_tile = tl.max(s, 1)
            m_tile_safe = tl.where(m_tile == float("-inf"), 0.0, m_tile)
            p = tl.math.exp2(s - m_tile_safe[:, None])
            l_tile = tl.sum(p, 1)

            # m_new = max(m_i, m~_ij),  l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij   (line 11)
            m_new = tl.maximum(m_old, m_tile)
            m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m_old - m_new_safe)
            beta = tl.math.exp2(m_tile_safe - m_new_safe)
            l_new = alpha * l_old + beta * l_tile

            # O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)   (line 12)
            pv = tl.dot(p.to(v.dtype), v)
            # A row with l_new = 0 has O = 0 and P V = 0 so far: divide it by 1, not 0.
            l_safe = tl.where(l_new > 0.0, l_new, 1.0)
            o = (o * (l_old * alpha)[:, None] + pv * beta[:, None]) / l_safe[:, None]

            # Write O_i, l_i, m_i back to HBM (line 13).
            tl.store(o_base + rows[:, None] * stride_os + cols[None, :], o, mask=tile_ok)
            tl.store(Row_max + stat_base + rows, m_new, mask=row_ok)
            tl.store(Row_sum + stat_base + rows, l_new, mask=row_ok)
        # The next key block re-reads these rows, possibly in other threads: make the stores
        # visible across the program's warps first.
        tl.debug_barrier()


def fa1_attention(q, k, v, causal=False, softmax_scale=None, q_rows_per_program=None):
    """q: (batch, seqlen_q, heads, d); k, v: (batch, seqlen_k, heads_k, d), heads % heads_k == 0.
    Returns O in q's dtype, (batch, seqlen_q, heads, d).  q_rows_per_program=None is FA1's grid
    (batch x heads); a multiple of 16 also splits the query sequence across programs."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"fa1_attention: {name} must be (batch, seqlen, heads, headdim), got {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"fa1_attention: {name} must have a contiguous last dimension")
        if t.dtype != q.dtype:
            raise ValueError(f"fa1_attention: {name} has dtype {t.dtype}, q has {q.dtype}")
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_k = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"fa1_attention: k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)}")
    if heads % heads_k:
        raise ValueError(f"fa1_attention: heads of q ({heads}) must be a multiple of heads of k ({heads_k})")
    if head_dim > 256:
        raise ValueError(f"fa1_attention: head dim {head_dim} > 256")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    rows_per_program = seqlen_q if q_rows_per_program is None else q_rows_per_program
    rows_per_program = max(BLOCK_M, triton.cdiv(rows_per_program, BLOCK_M) * BLOCK_M)

    # O, m and l start as 0, -inf and 0 in HBM (Algorithm 1, line 2); O is kept in float32 so the
    # per-step round trips add no rounding of their own.
    o_acc = torch.zeros(batch, seqlen_q, heads, head_dim, device=q.device, dtype=torch.float32)
    row_max = torch.full((batch * heads, seqlen_q), float("-inf"), device=q.device, dtype=torch.float32)
    row_sum = torch.zeros(batch * heads, seqlen_q, device=q.device, dtype=torch.float32)
    grid = (batch * heads, triton.cdiv(max(seqlen_q, 1), rows_per_program))
    if seqlen_q > 0 and seqlen_k > 0 and batch * heads > 0:
        _fa1_forward_kernel[grid](
            q, k, v, o_acc, row_max, row_sum,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            o_acc.stride(0), o_acc.stride(1), o_acc.stride(2),
            heads, heads // heads_k, seqlen_q, seqlen_k, head_dim, rows_per_program,
            scale * math.log2(math.e),
            BLOCK_M=BLOCK_M, BLOCK_N=key_block(head_dim), BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
            CAUSAL=causal, num_warps=NUM_WARPS, num_stages=1,
        )
    return o_acc.to(q.dtype)
