"""Serving engines that hf_posenc can run a saved checkpoint in: vLLM (:mod:`.vllm_engine`, the engine process and the
calls the evaluations make of it) and which checkpoints each computes as hf_posenc does (:mod:`.support`)."""
