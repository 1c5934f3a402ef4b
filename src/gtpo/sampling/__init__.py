"""Sampling: the policy forward (``policy``), the rollout entry point (``rollout``), gtpo's decoding loop
(``decode``, ``shared_prefix``, ``padding``), LoRA merging for generation (``lora_merge``) and the vLLM engine
(``vllm_engine``).
"""
