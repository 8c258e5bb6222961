"""lm-evaluation-harness against twinserve: its local-completions model must score a local
multiple-choice task as its hf backend does on the same weights (`make bench-lmeval`).

local-completions asks each (question, choice) pair as a completion with ``echo``,
``logprobs: 1`` and ``max_tokens: 1`` and sums the choice's prompt-token logprobs; the hf
backend computes the same log-likelihood with transformers. Both run the fetched default model
in float32; twinserve serves it with ``--dtype float32 --quantization none``. The task
(``compare/data/lmeval_mc.jsonl``, 24 everyday questions written for this benchmark) is
loaded from a local file, so nothing is downloaded. lm-eval is not a test dependency: the
Makefile target installs it.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from shared.cli.server_process import ServerProcess
from shared.worker.model_fetch import resolve_model

DATA = Path(__file__).parent / "data" / "lmeval_mc.jsonl"
TASK = "twinserve_mc"
TOLERANCE = 1e-2


def write_task(folder: Path) -> None:
    """The task's YAML, pointing at the local data file (lm-eval's include_path format)."""
    folder.joinpath(f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {DATA.resolve()}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n")


def evaluate(model: str, model_args: str, task_dir: Path) -> tuple[float, list[list[float]]]:
    """(accuracy, per document the log-likelihood of each choice)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[TASK],
                                  task_manager=TaskManager(include_path=str(task_dir)),
                                  log_samples=True, batch_size=1)
    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    lls = [[float(r[0][0]) for r in s["resps"]] for s in samples]
    return float(out["results"][TASK]["acc,none"]), lls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="v1", choices=["v0", "v1"])
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    model_dir = resolve_model(None)
    with tempfile.TemporaryDirectory(prefix="twinserve-lmeval-") as tmp:
        task_dir = Path(tmp)
        write_task(task_dir)
        flags = ["--dtype", "float32", "--quantization", "none", "--served-model-name", "smollm2"]
        with ServerProcess(args.engine, flags, task_dir / "server.log") as server:
            server.start()
            served = evaluate("local-completions",
                              f"model=smollm2,base_url={server.base_url}/v1/completions,"
                              f"tokenizer_backend=huggingface,tokenizer={model_dir},"
                              "num_concurrent=1,max_retries=1", task_dir)
        hf = evaluate("hf", f"pretrained={model_dir},dtype=float32,device=cpu", task_dir)
    diffs = [abs(a - b) for da, db in zip(served[1], hf[1]) for a, b in zip(da, db)]
    report = {"engine": args.engine, "documents": len(hf[1]), "choices": len(diffs),
              "acc_twinserve": served[0], "acc_hf": hf[0], "max_abs_diff": max(diffs),
              "mean_abs_diff": sum(diffs) / len(diffs), "tolerance": TOLERANCE}
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if report["max_abs_diff"] <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
