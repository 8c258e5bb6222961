"""The 13 steps of the request lifecycle: one enum, the single source of the lifecycle map.

Every trace event names its step with a ``Step``; the lifecycle tables in the README and in
``docs/DESIGN.md`` are ``lifecycle_table()``'s output (a test keeps them equal), so the map a
reader learns and the events a live trace reports cannot drift apart.
"""
from __future__ import annotations

from enum import IntEnum


class Step(IntEnum):
    HTTP_RECEIVED = 1
    VALIDATED = 2
    TOKENIZED = 3
    SUBMITTED = 4
    QUEUED = 5
    SCHEDULED = 6
    KV_ALLOCATED = 7
    INPUTS_PREPARED = 8
    FORWARD = 9
    ATTENTION = 10
    SAMPLED = 11
    DETOKENIZED = 12
    STREAMED = 13

    @property
    def label(self) -> str:
        """What happens at this step (the map's middle column)."""
        return _MAP[self][0]

    @property
    def where(self) -> str:
        """The files and functions that do it (the map's right column, Markdown)."""
        return _MAP[self][1]


_MAP: dict[Step, tuple[str, str]] = {
    Step.HTTP_RECEIVED: ("HTTP request reaches a Starlette route",
                         "`shared/api/server.py` (`build_app`), `shared/api/serving.py` "
                         "(`Serving.__call__`)"),
    Step.VALIDATED: ("request body validated (output constraints too), chat template rendered",
                     "`shared/api/protocol.py` (`decode_body`), `shared/api/requests.py` "
                     "(`render_chat`), `shared/api/structured.py` (`structured_spec`), "
                     "`shared/api/serving_completion.py` "
                     "(`CompletionServing.prepare`), `shared/frontend/tokenizer.py`"),
    Step.TOKENIZED: ("prompt tokenized",
                     "`shared/frontend/tokenizer.py` (`Tokenizer.encode`), called from "
                     "`shared/api/requests.py` (`render_chat`, `prepare_completion`)"),
    Step.SUBMITTED: ("`EngineCoreRequest` handed to the engine",
                     "v0: `engine_v0/async_engine.py` (`AsyncEngine._submit`, direct call); "
                     "v1: `engine_v1/client.py` (`AsyncLLM._submit`, ZMQ PUSH, `engine_v1/wire.py`), "
                     "`engine_v1/core_proc.py` (`EngineCoreProc._input_loop`)"),
    Step.QUEUED: ("request enters the waiting queue",
                  "`shared/core/scheduler.py` (`Scheduler.add_request`; v1: after the core's "
                  "input thread decodes it)"),
    Step.SCHEDULED: ("`Scheduler.schedule()` picks this step's batch under a token budget",
                     "`shared/core/scheduler.py` (`Scheduler.schedule`)"),
    Step.KV_ALLOCATED: ("KV blocks allocated (prefix-cache hits reused)",
                        "`shared/core/kv_cache.py` (`KVCacheManager.allocate_slots`), "
                        "`shared/core/block_pool.py`"),
    Step.INPUTS_PREPARED: ("batch turned into tensors, forward launched",
                           "`shared/worker/step_inputs.py` (`flatten_step`), "
                           "`shared/worker/model_runner.py` (`ModelRunner.prepare_inputs`; "
                           "`ModelRunner.forward` broadcasts the step to tensor-parallel ranks), "
                           "`shared/worker/distributed/worker.py` (`serve_steps`: the other ranks), "
                           "`shared/engine_core.py` (`EngineCore.begin_step`)"),
    Step.FORWARD: ("model forward",
                   "`shared/worker/models/llama.py` (tensor parallel: one all-reduce after "
                   "each attention and MLP, `shared/worker/distributed/group.py`), run by "
                   "`shared/engine_core.py` (`EngineCore.run_forward`)"),
    Step.ATTENTION: ("attention reads K/V through block tables",
                     "`shared/worker/native/decode.py` (`FusedDecode.run`: CPU decode steps of "
                     "up to 64 rows; with quantized weights every step up to the token budget), "
                     "`shared/worker/attention/native_backend.py` "
                     "(`NativeAttention.forward`, CPU), `shared/worker/attention/torch_backend.py` "
                     "(`TorchAttention.forward`, fallback), `shared/worker/attention/triton_backend.py` "
                     "(`TritonAttention.forward`, `kernels/`, CUDA)"),
    Step.SAMPLED: ("next token sampled (grammar masks applied); scheduler updates state, "
                   "advances grammars, checks EOS / max tokens / grammar end, frees blocks",
                   "`shared/worker/sampler.py`, `shared/structured/bitmask.py`, "
                   "`shared/core/scheduler.py` (`Scheduler.update_from_output`)"),
    Step.DETOKENIZED: ("token detokenized incrementally, stop strings checked",
                       "`shared/frontend/output_processor.py`, `shared/frontend/detokenizer.py`, "
                       "driven by `shared/frontend/base.py` (`EngineFrontend.process_engine_outputs`)"),
    Step.STREAMED: ("SSE chunk streamed to the client",
                    "`shared/api/serving.py` (`Serving._events`; a JSON response: "
                    "`Serving.__call__`)"),
}


def lifecycle_table() -> str:
    """The lifecycle map as a Markdown table (README and docs/DESIGN.md embed it verbatim)."""
    rows = ["| # | what happens | where |", "|---|---|---|"]
    rows += [f"| {s.value} | {s.label} | {s.where} |" for s in Step]
    return "\n".join(rows)


if __name__ == "__main__":
    print(lifecycle_table())
