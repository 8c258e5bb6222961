"""Triton kernels for the CUDA path, one op per module, each with its pure-torch reference beside it.

    store_kv        write this step's K/V into the paged cache at ``slot_mapping``
    paged_decode    one query token per sequence, split over the context (flash-decoding) + reduce
    paged_prefill   variable-length causal attention of prompt chunks over cached + new keys
    rms_norm        RMSNorm with an optional fused residual add

Importing this package imports no Triton; each op module imports it when present (see
``_triton.py``), so the references work anywhere and the launchers raise a clear error without it.
"""
