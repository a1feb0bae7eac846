//! Pretrained models against their references, in one test binary: the GGUF container and
//! block formats (`gguf_read`), tokenizers and chat templates from GGUF metadata
//! (`gguf_tokenizer`), tiny LLaMAs saved by `transformers` (`llama_fixture`) and converted
//! to GGUF the llama.cpp way (`llama_gguf`), SmolLM2-135M-Instruct (`smollm2`), and models
//! exported and loaded back (`export`). Each module states its oracle and tolerances.

#[path = "../support/mod.rs"]
mod support;

mod export;
mod gguf_read;
mod gguf_tokenizer;
mod llama_fixture;
mod llama_gguf;
mod smollm2;
