"""Fine-tuning past the original context: the training loop (:mod:`.finetune`), its evaluation past L
(:mod:`.long_eval`), LoRA (:mod:`.lora`), several processes (:mod:`.parallel`), resuming (:mod:`.resume`) and the
settings (:mod:`.settings`)."""
