"""The vLLM side of hf_posenc's engine bridge (:mod:`hf_posenc.engines.vllm_engine`), run as a script by the Python that
has vLLM: it imports nothing of hf_posenc, so that interpreter may be another environment with its own
transformers (vLLM pins its own).

``python vllm_worker.py``: reads the spec, one JSON line on standard input (never argv, which every user of the
machine can read: it may hold ``engine_args.hf_token``), starts one ``vllm.LLM`` on a checkpoint folder (token ids
in and out, no tokenizer), then answers requests, one JSON object per line on standard input, with one JSON line
each on the standard output it was started with; vLLM's own output goes to standard error. The first line it writes says
whether the engine started (``{"ready": true, "max_model_len": N, "version": V}``) or why not
(``{"error": "start", "message": ...}``). Requests:

- ``{"op": "score", "prompts": [[ids], ...], "top": bool}``: per prompt, ``logprobs`` (the log-probability of
  each token from the second on, given those before it) and, with ``top``, ``top`` (the most likely token at
  each of those positions) and ``next`` (the most likely token after the last).
- ``{"op": "generate", "prompts": [[ids], ...], "max_tokens": n, "stop": [ids]}``: per prompt, the greedy
  continuation's token ids (up to a stop token, which is kept).

A prompt the engine will not take (longer than its maximum model length, say) answers
``{"refused": message}``, the engine's own words; any other failure ``{"error": "request", "message": ...}``.
"""

import json
import os
import sys


def _message(err):
    return f"{type(err).__name__}: {err}"[:2000]


def _score(llm, req, SamplingParams):
    top = bool(req.get("top"))
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1 if top else 0, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in req["prompts"]], params, use_tqdm=False)
    answers = []
    for prompt, out in zip(req["prompts"], outs):
        entries = out.prompt_logprobs[1:]
        answer = {"logprobs": [entry[token].logprob for token, entry in zip(prompt[1:], entries)]}
        if top:
            answer["top"] = [next(t for t, lp in entry.items() if lp.rank == 1) for entry in entries]
            answer["next"] = out.outputs[0].token_ids[0]
        answers.append(answer)
    return {"results": answers}


def _generate(llm, req, SamplingParams):
    params = SamplingParams(max_tokens=int(req["max_tokens"]), temperature=0.0, detokenize=False,
                            stop_token_ids=list(req.get("stop") or []), ignore_eos=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in req["prompts"]], params, use_tqdm=False)
    return {"results": [list(out.outputs[0].token_ids) for out in outs]}


def _refused(llm, req):
    """The engine's own refusal of a prompt longer than its maximum model length, asked of the engine itself."""
    limit = llm.llm_engine.model_config.max_model_len
    longest = max(len(p) for p in req["prompts"])
    return longest > limit, limit


def _on_cpu():
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _in_process(kwargs):
    """One CPU engine runs in this process (unless the caller's environment or engine arguments say otherwise): vLLM
    would otherwise start an engine-core process and a worker process, each importing vLLM and torch again (~30 s
    of a 45 s start on 2 cores), and keep a core for this one, leaving the model a core fewer."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    kwargs["distributed_executor_backend"] = "uni"


def _layer_widths(text):
    """(key/value heads, head width) of each layer: the config's own, or its ``per_layer_config`` override (Gemma 4's
    full-attention layers: ``global_head_dim`` and their own head count)."""
    heads = text["num_attention_heads"]
    base = (text.get("num_key_value_heads") or heads, text.get("head_dim") or text["hidden_size"] // heads)
    per_layer = text.get("per_layer_config") or {}
    widths = []
    for i in range(text["num_hidden_layers"]):
        own = per_layer.get(str(i)) or per_layer.get(i) or {}
        widths.append((own.get("num_key_value_heads") or base[0], own.get("head_dim") or base[1]))
    return widths


def _cpu_kv_bytes(folder, max_model_len, dtype):
    """Twice the KV cache of one sequence of the longest length the engine takes (without ``max_model_len``: the
    positions the config states times its RoPE factor, as vLLM derives it for linear scaling), at least 256 MiB;
    each layer counted at its own width."""
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    text = config.get("text_config", config)
    per_token = 2 * sum(kv * width for kv, width in _layer_widths(text))
    factor = max(1.0, float((text.get("rope_parameters") or text.get("rope_scaling") or {}).get("factor") or 1.0))
    tokens = max_model_len or int((text.get("max_position_embeddings") or 32768) * factor)
    width = 4 if dtype in ("float32", "auto") else 2
    return max(256 << 20, 2 * per_token * width * tokens + (64 << 20))


def main():
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's prints (and its workers', which inherit the descriptors) go to standard error

    def send(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # vllm is vLLM, not a file beside this one
    spec = json.loads(sys.stdin.readline() or "{}")
    if "model" not in spec:
        send({"error": "start", "message": "no spec on standard input (a JSON line naming the model folder)"})
        return 2
    try:
        import vllm
        from vllm import LLM, SamplingParams
    except Exception as err:  # noqa: BLE001 -- any import failure is reported, not raised
        send({"error": "import", "message": _message(err)})
        return 3
    kwargs = dict(model=spec["model"], dtype=spec.get("dtype", "float32"), seed=int(spec.get("seed", 0)),
                  enforce_eager=bool(spec.get("enforce_eager", True)), skip_tokenizer_init=True,
                  enable_prefix_caching=False, tensor_parallel_size=int(spec.get("tensor_parallel_size", 1)))
    if spec.get("max_model_len"):
        kwargs["max_model_len"] = int(spec["max_model_len"])
    if _on_cpu():  # vLLM's CPU backend would reserve a share of all memory (0.92 by default): size the KV cache instead
        kwargs["kv_cache_memory_bytes"] = _cpu_kv_bytes(spec["model"], spec.get("max_model_len"), kwargs["dtype"])
        if kwargs["tensor_parallel_size"] == 1:
            _in_process(kwargs)
    kwargs.update(spec.get("engine_args") or {})
    try:
        llm = LLM(**kwargs)
    except Exception as err:  # noqa: BLE001
        send({"error": "start", "message": _message(err)})
        return 4
    send({"ready": True, "max_model_len": llm.llm_engine.model_config.max_model_len, "version": vllm.__version__})
    handlers = {"score": _score, "generate": _generate}
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            answer = handlers[req["op"]](llm, req, SamplingParams)
        except Exception as err:  # noqa: BLE001 -- said to the caller, who decides
            too_long, limit = _refused(llm, req)
            answer = ({"refused": _message(err), "max_model_len": limit} if too_long
                      else {"error": "request", "message": _message(err)})
        send(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
