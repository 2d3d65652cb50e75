"""`llmlaunch-bench --eval` (launcher/bench/evaluate.py): lm-eval against the OpenAI API of a real tritonserver
serving the default model (SmolLM2-135M-Instruct, float32, CPU, the hf engine), beside lm-eval's own `hf` backend on
the same weights and items: the same scores, and every item's log-likelihoods equal to 1e-4."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("lm_eval")

from launcher.bench import evaluate  # noqa: E402
from launcher.testing.serve import hf_server  # noqa: E402
from tests.integration.test_openai_api import api  # noqa: E402

pytestmark = [pytest.mark.triton, pytest.mark.timeout(900)]
LIMIT = 24


def _reference(model_dir, tasks_dir, out):
    """lm-eval's hf backend (transformers, float32) on the same items, started in the background (it runs beside the
    served side's start-up and eval: most of both is single-threaded Python); its `wait()` gives the scores."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "lm_eval", "run", "--model", "hf"]
    argv += ["--model_args", f"pretrained={model_dir},dtype=float32", "--device", "cpu", "--batch_size", "1"]
    argv += ["--tasks", ",".join(evaluate.PREFIX + t for t in evaluate.TASKS), "--include_path", str(tasks_dir)]
    argv += ["--output_path", str(out), "--log_samples", "--seed", "0", "--limit", str(LIMIT)]
    proc = subprocess.Popen(argv)

    def wait():
        assert proc.wait(600) == 0, "lm-eval's hf backend failed (its output is above)"
        return evaluate.read_results(str(out))

    return proc, wait


def _loglikelihoods(out) -> dict:
    """(doc_id, choice) -> log-likelihood of lm-eval's multiple-choice samples."""
    got = {}
    for s in evaluate.read_samples(str(out), evaluate.PREFIX + "arithmetic_choice"):
        for j, resp in enumerate(s["resps"]):
            got[(s["doc_id"], j)] = float(resp[0][0])
    return got


def test_eval_through_the_api_scores_as_lm_evals_own_hf_backend(smollm2_dir, tmp_path):
    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    for t in evaluate.TASKS:
        (tasks_dir / f"{t}.yaml").write_text(evaluate.task_yaml(t))
    reference, ref_scores = _reference(smollm2_dir, tasks_dir, tmp_path / "ref")
    try:
        with hf_server(
            str(smollm2_dir), tmp_path / "srv", {"device": "cpu", "max_num_seqs": 8, "dtype": "float32"}
        ) as srv:
            proc = api(srv.grpc_url, str(smollm2_dir))
            try:
                proc.wait_ready(120)
                argv = ["--eval", "--url", proc.cfg.url + "/v1", "--tokenizer", str(smollm2_dir)]
                argv += ["--limit", str(LIMIT), "--output-path", str(tmp_path / "api")]
                argv += ["--result-json", str(tmp_path / "scores.json")]
                assert evaluate.main(argv) == 0
            finally:
                proc.stop()
        ref = ref_scores()
    finally:
        reference.kill()
    got = json.loads((tmp_path / "scores.json").read_text())["tasks"]
    for name in evaluate.TASKS:
        assert got[name]["items"] == ref[name]["items"] == LIMIT
        assert got[name]["value"] == pytest.approx(ref[name]["value"]), (name, got[name], ref[name])
    assert got["arithmetic"]["answered"] == LIMIT
    mine, theirs = _loglikelihoods(tmp_path / "api"), _loglikelihoods(tmp_path / "ref")
    assert mine.keys() == theirs.keys() and len(mine) == 4 * LIMIT
    worst = max(abs(mine[k] - theirs[k]) for k in mine)
    assert worst < 1e-4 and all(math.isfinite(v) for v in mine.values()), worst


def test_a_server_that_answers_nothing_fails_the_eval(tmp_path):
    """The answer rate, not only the score: empty answers to every item are a failure, whatever they score."""
    out = tmp_path / "out" / "m"
    out.mkdir(parents=True)
    task = evaluate.PREFIX + "arithmetic"
    (out / "results_2026-01-01T00-00-00.json").write_text(json.dumps({"results": {task: {"exact_match,none": 0.0}}}))
    (out / f"samples_{task}_2026-01-01T00-00-00.jsonl").write_text(
        "\n".join(json.dumps({"doc_id": i, "resps": [[""]], "filtered_resps": [""]}) for i in range(3)) + "\n"
    )
    table = evaluate.read_results(str(tmp_path / "out"))
    assert table["arithmetic"] == {"metric": "exact_match", "value": 0.0, "items": 3, "answered": 0}
