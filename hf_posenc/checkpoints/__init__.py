"""Where models come from and how they load: model sources and aliases (:mod:`.models`), loading a checkpoint with
its record (:mod:`.loading`), the runtime that loads model and tokenizer (:mod:`.runtime`), weights
(:mod:`.weights`), the context a checkpoint was trained for (:mod:`.context`) and transformers' renamed internals
(:mod:`.compat`)."""
