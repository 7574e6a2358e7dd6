"""The trainer: GRPO on reward-complete groups from ``rb.batches``, publishing versions to ``rb.resources``.

Modules (import what you need; this package imports nothing heavy by itself):

* ``trainer.grpo``          — the objective as pure tensor functions (ratio, clipping, aggregation, k3 KL)
* ``trainer.tokenizer``     — the project's char tokenizer with chat markers
* ``trainer.model``         — ``build_tiny``, ``save_policy``, ``load_policy``, ``generate``/``generate_batch``
* ``trainer.sft``           — supervised fine-tuning on (prompt, response) pairs
* ``trainer.torch_backend`` — one micro-batched GRPO optimiser step on ``GroupBatch`` records
* ``trainer.checkpoint``    — atomic checkpoints with offsets and versions
* ``trainer.loop``          — the Kafka training loop (``rolloutbus train``), crash-safe
* ``trainer.serve``         — the OpenAI-compatible server with hot reload (``rolloutbus serve``)
* ``trainer.vllm_serve``    — ``rolloutbus serve --engine vllm``: vLLM's server behind a version gate
  (its venv: ``trainer.vllm_venv``; its worker extension: ``trainer.vllm_worker``)
* ``trainer.verl_losses``   — verl's policy losses under ``verl:<name>`` (its estimators: ``streams.verl_estimators``)
"""
