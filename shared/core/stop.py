"""When a sequence ends, decided after each sampled token (lifecycle step 11)."""
from __future__ import annotations

from shared.core.request import Request, RequestStatus


def check_stop(req: Request, token: int, max_model_len: int) -> RequestStatus | None:
    """The finished status ``token`` (just appended) puts ``req`` in, or None to go on.

    EOS and stop token ids count once min_tokens is reached; then the length limits; a
    constrained request also feeds the token to its grammar, which ends it with "stop" once it
    has accepted and allows nothing more (even on the last token max_tokens allows).
    """
    params = req.sampling_params
    if req.num_output_tokens >= params.min_tokens:
        if token == req.eos_token_id and not params.ignore_eos:
            return RequestStatus.FINISHED_STOPPED
        if token in params.stop_token_ids:
            req.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
    status = None
    if req.num_output_tokens >= req.max_output_tokens or req.num_tokens >= max_model_len:
        status = RequestStatus.FINISHED_LENGTH
    if req.grammar is not None:
        if not req.grammar.accept(token):   # the caller fails this request alone
            raise RuntimeError(f"grammar error: {req.grammar.error}")
        if req.grammar.is_stopped:
            return RequestStatus.FINISHED_STOPPED
    return status
