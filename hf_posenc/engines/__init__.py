"""Serving engines that hf_posenc can run a saved checkpoint in, each behind the one scoring interface
(:mod:`.scorer`): vLLM (:mod:`.vllm_engine`, an engine process) and llama.cpp (:mod:`.llama_cpp_engine`, through
llama-cpp-python). What each computes as hf_posenc does is said by the method records (``MethodSpec.engines``)."""

ENGINES = ("vllm", "llama.cpp")  # the engines serve-check starts (the --engine and --serve-check values)
ENGINE_NAMES = {"vllm": "vLLM", "llama.cpp": "llama.cpp"}  # each as the method records and the cards name it
