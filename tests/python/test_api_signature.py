"""The public functions keep flash-attn 2.x's names, argument order and defaults, so code written
for flash_attn runs unchanged after `from tileattn import ...`."""

import inspect

import pytest

import tileattn

OPTIONS = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
           ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
           ("deterministic", False), ("return_attn_probs", False)]
REQUIRED = inspect.Parameter.empty

# flash-attn 2.x (flash_attn/flash_attn_interface.py), parameter by parameter.
FLASH_ATTN_2 = {
    "flash_attn_qkvpacked_func": [("qkv", REQUIRED)] + OPTIONS,
    "flash_attn_kvpacked_func": [("q", REQUIRED), ("kv", REQUIRED)] + OPTIONS,
    "flash_attn_func": [("q", REQUIRED), ("k", REQUIRED), ("v", REQUIRED)] + OPTIONS,
    "flash_attn_varlen_qkvpacked_func":
        [("qkv", REQUIRED), ("cu_seqlens", REQUIRED), ("max_seqlen", REQUIRED)] + OPTIONS,
    "flash_attn_varlen_kvpacked_func":
        [("q", REQUIRED), ("kv", REQUIRED), ("cu_seqlens_q", REQUIRED), ("cu_seqlens_k", REQUIRED),
         ("max_seqlen_q", REQUIRED), ("max_seqlen_k", REQUIRED)] + OPTIONS,
    "flash_attn_varlen_func":
        [("q", REQUIRED), ("k", REQUIRED), ("v", REQUIRED), ("cu_seqlens_q", REQUIRED),
         ("cu_seqlens_k", REQUIRED), ("max_seqlen_q", REQUIRED), ("max_seqlen_k", REQUIRED)]
        + OPTIONS + [("block_table", None)],
    "flash_attn_with_kvcache":
        [("q", REQUIRED), ("k_cache", REQUIRED), ("v_cache", REQUIRED), ("k", None), ("v", None),
         ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
         ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
         ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
         ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
         ("return_softmax_lse", False)],
}


@pytest.mark.parametrize("name", list(FLASH_ATTN_2))
def test_flash_attn_signature(name):
    parameters = inspect.signature(getattr(tileattn, name)).parameters.values()
    positional = [(p.name, p.default) for p in parameters if p.kind != p.KEYWORD_ONLY]
    assert positional == FLASH_ATTN_2[name]
    # Extras are keyword-only, after flash-attn's own parameters.
    extras = [p for p in parameters if p.kind == p.KEYWORD_ONLY]
    assert all(p.default is not REQUIRED for p in extras)


# flash-attn 2.x's flash_attn/bert_padding.py, as tileattn.bert_padding (its index_first_axis and
# index_put_first_axis are autograd Functions' apply, called positionally).
BERT_PADDING = {
    "index_first_axis": [("x", REQUIRED), ("indices", REQUIRED)],
    "index_put_first_axis": [("values", REQUIRED), ("indices", REQUIRED), ("first_axis_dim", REQUIRED)],
    "unpad_input": [("hidden_states", REQUIRED), ("attention_mask", REQUIRED), ("unused_mask", None)],
    "pad_input": [("hidden_states", REQUIRED), ("indices", REQUIRED), ("batch", REQUIRED),
                  ("seqlen", REQUIRED)],
}


@pytest.mark.parametrize("name", list(BERT_PADDING))
def test_bert_padding_signature(name):
    from tileattn import bert_padding

    parameters = inspect.signature(getattr(bert_padding, name)).parameters.values()
    assert [(p.name, p.default) for p in parameters] == BERT_PADDING[name]
