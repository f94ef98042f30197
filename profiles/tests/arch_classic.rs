//! The non-Llama `config.json` importers (GPT-2, GPTBigCode, Phi, Falcon, OPT, BLOOM, T5, BERT,
//! XLNet) against published parameter counts and closed forms written out here from each
//! config's numbers, plus the module names, ties, buffers and errors a device map depends on.

use vramplan_profiles::model::{ImportOptions, ModelDescription, Naming, StackKind, TensorKind, hf};
use vramplan_profiles::{DType, InputError, Location};

fn import(json: &str) -> ModelDescription {
    try_import(json, Naming::V5).unwrap_or_else(|e| panic!("import failed: {e}"))
}

fn import_v4(json: &str) -> ModelDescription {
    try_import(json, Naming::V4).unwrap_or_else(|e| panic!("import failed: {e}"))
}

fn try_import(json: &str, naming: Naming) -> Result<ModelDescription, InputError> {
    hf::from_config_text(json, "config.json", ImportOptions { naming })
}

fn shared_config(model: &str) -> String {
    let path = format!("{}/../fixtures/published/models/{model}/config.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn shape(model: &ModelDescription, path: &str) -> Vec<u64> {
    model.root.tensor(path).unwrap_or_else(|| panic!("no tensor `{path}`")).shape.clone()
}

fn has_module(model: &ModelDescription, path: &str) -> bool {
    model.root.find(path).is_some_and(|m| m.path == path)
}

/// `nn.Linear` / `Conv1D` parameters: weight plus optional bias.
fn linear(inputs: u64, outputs: u64, bias: bool) -> u64 {
    inputs * outputs + if bias { outputs } else { 0 }
}

/// A LayerNorm with weight and bias.
fn layer_norm(width: u64) -> u64 {
    2 * width
}

fn assert_key_error(result: Result<ModelDescription, InputError>, key: &str) {
    match result {
        Ok(_) => panic!("expected an error at key `{key}`"),
        Err(e) => assert_eq!(e.location, Some(Location::Key(key.to_string())), "{e}"),
    }
}

// ---------------------------------------------------------------- GPT-2

const GPT2: &str = r#"{
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
  "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
  "vocab_size": 50257
}"#;

#[test]
fn gpt2_matches_published_count_and_closed_form() {
    let model = import(GPT2);
    let (h, layers, vocab, positions) = (768, 12, 50257, 1024);
    let block = layer_norm(h)
        + linear(h, 3 * h, true)
        + linear(h, h, true)
        + layer_norm(h)
        + linear(h, 4 * h, true)
        + linear(4 * h, h, true);
    let closed = vocab * h + positions * h + layers * block + layer_norm(h);
    assert_eq!(closed, 124_439_808);
    assert_eq!(model.params(), 124_439_808);
    assert_eq!(model.facts.layers.len(), 12);
    assert_eq!(model.facts.no_split_classes, vec!["GPT2Block".to_string()]);
}

#[test]
fn gpt2_uses_conv1d_layout_and_ties_lm_head() {
    let model = import(GPT2);
    // Conv1D stores its weight [in, out].
    assert_eq!(shape(&model, "transformer.h.0.attn.c_attn.weight"), vec![768, 2304]);
    assert_eq!(shape(&model, "transformer.h.11.mlp.c_proj.weight"), vec![3072, 768]);
    assert_eq!(model.root.find("transformer.h.0.attn.c_attn").map(|m| m.class.as_str()), Some("Conv1D"));
    assert_eq!(
        model.tied_groups(),
        vec![vec!["transformer.wte.weight".to_string(), "lm_head.weight".to_string()]]
    );
}

#[test]
fn gpt2_causal_mask_buffers_exist_only_in_transformers_4() {
    let v5 = import(GPT2);
    let v4 = import_v4(GPT2);
    assert_eq!(v4.params(), v5.params());
    assert_eq!(v5.root.buffer_bytes(), 0);
    // 4.x: attn.bias [1, 1, 1024, 1024] bool plus the fp32 scalar attn.masked_bias, per layer.
    assert_eq!(v4.root.buffer_bytes(), 12 * (1024 * 1024 + 4));
    assert_eq!(v4.bytes(), 124_439_808 * 4 + 12 * (1024 * 1024 + 4));
    let mask = v4.root.tensor("transformer.h.3.attn.bias").expect("mask buffer");
    assert_eq!(mask.kind, TensorKind::Buffer { persistent: false });
    assert_eq!(mask.dtype, DType::Bool);
}

#[test]
fn gpt2_cross_attention_adds_a_block_of_its_own() {
    let json = GPT2.replace("\"vocab_size\"", "\"add_cross_attention\": true, \"vocab_size\"");
    let model = import(&json);
    let h = 768;
    let cross = linear(h, 2 * h, true) + linear(h, h, true) + linear(h, h, true) + layer_norm(h);
    assert_eq!(model.params(), 124_439_808 + 12 * cross);
    assert!(model.facts.layers.iter().all(|l| l.cross_attention));
    assert_eq!(shape(&model, "transformer.h.0.crossattention.q_attn.weight"), vec![768, 768]);
}

// ---------------------------------------------------------------- GPTBigCode

const OCTOCODER: &str = r#"{
  "activation_function": "gelu_pytorch_tanh", "architectures": ["GPTBigCodeForCausalLM"],
  "model_type": "gpt_bigcode", "multi_query": true, "n_embd": 6144, "n_head": 48,
  "n_inner": 24576, "n_layer": 40, "n_positions": 8192, "torch_dtype": "bfloat16",
  "vocab_size": 49152
}"#;

#[test]
fn starcoder_multi_query_closed_form() {
    let model = import(OCTOCODER);
    let (h, layers, heads, inner, vocab, positions) = (6144, 40, 48, 24576, 49152, 8192);
    let head_dim = h / heads;
    let block = layer_norm(h)
        + linear(h, h + 2 * head_dim, true)
        + linear(h, h, true)
        + layer_norm(h)
        + linear(h, inner, true)
        + linear(inner, h, true);
    let closed = vocab * h + positions * h + layers * block + layer_norm(h);
    assert_eq!(model.params(), closed);
    // StarCoder is published as a 15.5B-parameter model.
    assert!((15_400_000_000..15_600_000_000).contains(&closed), "{closed}");
    assert_eq!(model.facts.num_kv_heads, 1);
    assert_eq!(shape(&model, "transformer.h.0.attn.c_attn.weight"), vec![h + 2 * head_dim, h]);
    assert_eq!(model.root.find("transformer.h.0.attn.c_attn").map(|m| m.class.as_str()), Some("Linear"));
    // One [8192, 8192] bool causal mask on the model, in 4.x and 5.x alike.
    assert_eq!(model.root.buffer_bytes(), positions * positions);
    assert_eq!(import_v4(OCTOCODER).root.buffer_bytes(), positions * positions);
    assert_eq!(model.bytes(), closed * 2 + positions * positions);
}

#[test]
fn gpt_bigcode_without_multi_query_has_full_kv() {
    let json = OCTOCODER.replace("\"multi_query\": true", "\"multi_query\": false");
    let model = import(&json);
    assert_eq!(shape(&model, "transformer.h.0.attn.c_attn.weight"), vec![3 * 6144, 6144]);
    assert_eq!(model.facts.num_kv_heads, 48);
    let extra_per_layer = (3 * 6144 - (6144 + 2 * 128)) * (6144 + 1);
    assert_eq!(model.params(), import(OCTOCODER).params() + 40 * extra_per_layer);
}

// ---------------------------------------------------------------- Phi

fn phi_config(hidden: u64, layers: u64, intermediate: u64, rotary: f64) -> String {
    format!(
        r#"{{"architectures": ["PhiForCausalLM"], "model_type": "phi", "hidden_act": "gelu_new",
        "hidden_size": {hidden}, "intermediate_size": {intermediate}, "max_position_embeddings": 2048,
        "num_attention_heads": 32, "num_hidden_layers": {layers}, "num_key_value_heads": null,
        "partial_rotary_factor": {rotary}, "qk_layernorm": false, "tie_word_embeddings": false,
        "torch_dtype": "float16", "vocab_size": 51200}}"#
    )
}

fn phi_closed_form(h: u64, layers: u64, inner: u64, vocab: u64) -> u64 {
    let block = 4 * linear(h, h, true) + linear(h, inner, true) + linear(inner, h, true) + layer_norm(h);
    vocab * h + layers * block + layer_norm(h) + linear(h, vocab, true)
}

#[test]
fn phi_2_and_phi_1_5_closed_forms() {
    let phi2 = import(&phi_config(2560, 32, 10240, 0.4));
    let closed2 = phi_closed_form(2560, 32, 10240, 51200);
    assert_eq!(phi2.params(), closed2);
    assert_eq!(closed2 / 10_000_000, 277, "phi-2 is published as 2.78B: {closed2}");
    let phi15 = import(&phi_config(2048, 24, 8192, 0.5));
    let closed15 = phi_closed_form(2048, 24, 8192, 51200);
    assert_eq!(phi15.params(), closed15);
    assert_eq!(closed15 / 10_000_000, 141, "phi-1.5 is published as 1.42B: {closed15}");
    assert_eq!(phi2.dtype, DType::F16);
}

#[test]
fn phi_partial_rotary_and_names() {
    let phi2 = import(&phi_config(2560, 32, 10240, 0.4));
    // head_dim 80, 40 % rotated = 32 dimensions, 16 inverse frequencies (fp32).
    assert_eq!(shape(&phi2, "model.rotary_emb.inv_freq"), vec![16]);
    assert_eq!(shape(&phi2, "lm_head.bias"), vec![51200]);
    assert_eq!(shape(&phi2, "model.layers.31.self_attn.dense.bias"), vec![2560]);
    assert!(has_module(&phi2, "model.final_layernorm"));
    assert!(phi2.tied_groups().is_empty());
    // 5.x keeps original_inv_freq beside inv_freq; 4.x only inv_freq.
    assert_eq!(phi2.root.buffer_bytes(), 2 * 16 * 4);
    assert_eq!(import_v4(&phi_config(2560, 32, 10240, 0.4)).root.buffer_bytes(), 16 * 4);
}

#[test]
fn phi_bad_values_name_the_key() {
    assert_key_error(try_import(&phi_config(2560, 32, 10240, 1.5), Naming::V5), "partial_rotary_factor");
    let json = phi_config(2560, 32, 10240, 0.4)
        .replace("\"num_key_value_heads\": null", "\"num_key_value_heads\": 5");
    assert_key_error(try_import(&json, Naming::V5), "num_key_value_heads");
    let json =
        phi_config(2560, 32, 10240, 0.4).replace("\"num_hidden_layers\": 32", "\"num_hidden_layers\": 0");
    assert_key_error(try_import(&json, Naming::V5), "num_hidden_layers");
}

// ---------------------------------------------------------------- Falcon

const FALCON_7B: &str = r#"{
  "alibi": false, "architectures": ["FalconForCausalLM"], "bias": false, "hidden_size": 4544,
  "model_type": "falcon", "multi_query": true, "new_decoder_architecture": false,
  "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": true,
  "torch_dtype": "bfloat16", "vocab_size": 65024
}"#;

/// The same model as its original remote-code config spelled it.
const RW_7B: &str = r#"{
  "alibi": false, "architectures": ["RWForCausalLM"], "bias": false, "hidden_size": 4544,
  "model_type": "RefinedWebModel", "multi_query": true, "n_head": 71, "n_layer": 32,
  "parallel_attn": true, "torch_dtype": "bfloat16", "vocab_size": 65024
}"#;

const FALCON_40B_RW: &str = r#"{
  "alibi": false, "architectures": ["RWForCausalLM"], "bias": false, "hidden_size": 8192,
  "model_type": "RefinedWeb", "n_head": 128, "n_head_kv": 8, "n_layer": 60,
  "new_decoder_architecture": true, "parallel_attn": true, "torch_dtype": "bfloat16",
  "vocab_size": 65024
}"#;

#[test]
fn falcon_7b_closed_form() {
    let model = import(FALCON_7B);
    let (h, layers, heads, vocab) = (4544, 32, 71, 65024);
    let head_dim = h / heads;
    // Multi-query fused QKV, no biases, one LayerNorm per parallel block, lm_head tied.
    let block = linear(h, h + 2 * head_dim, false)
        + linear(h, h, false)
        + linear(h, 4 * h, false)
        + linear(4 * h, h, false)
        + layer_norm(h);
    let closed = vocab * h + layers * block + layer_norm(h);
    assert_eq!(model.params(), closed);
    assert_eq!(closed / 10_000_000, 692, "Falcon-7B is published as 6.92B: {closed}");
    assert!(has_module(&model, "transformer.h.0.input_layernorm"));
    assert!(!has_module(&model, "transformer.h.0.ln_attn"));
    assert!(!has_module(&model, "transformer.h.0.post_attention_layernorm"));
    assert_eq!(model.facts.num_kv_heads, 1);
    assert_eq!(
        model.tied_groups(),
        vec![vec!["transformer.word_embeddings.weight".to_string(), "lm_head.weight".to_string()]]
    );
}

#[test]
fn falcon_old_keys_build_the_same_model() {
    let new = import(FALCON_7B);
    let old = import(RW_7B);
    assert_eq!(old.architecture, "FalconForCausalLM");
    assert_eq!(old.params(), new.params());
    let names = |m: &ModelDescription| m.tensors().into_iter().map(|(p, _)| p).collect::<Vec<_>>();
    assert_eq!(names(&old), names(&new));
}

#[test]
fn falcon_40b_new_decoder_layout() {
    let model = import(FALCON_40B_RW);
    let (h, layers, heads, kv, vocab) = (8192, 60, 128, 8, 65024);
    let head_dim = h / heads;
    let block = linear(h, (2 * kv + heads) * head_dim, false)
        + linear(h, h, false)
        + linear(h, 4 * h, false)
        + linear(4 * h, h, false)
        + 2 * layer_norm(h);
    assert_eq!(model.params(), vocab * h + layers * block + layer_norm(h));
    assert!(has_module(&model, "transformer.h.59.ln_attn"));
    assert!(has_module(&model, "transformer.h.59.ln_mlp"));
    assert!(!has_module(&model, "transformer.h.59.input_layernorm"));
    assert_eq!(shape(&model, "transformer.h.0.self_attention.query_key_value.weight"), vec![9216, 8192]);
    assert_eq!(model.facts.num_kv_heads, 8);
}

#[test]
fn falcon_sequential_blocks_have_two_norms() {
    let json = FALCON_7B.replace("\"parallel_attn\": true", "\"parallel_attn\": false");
    let model = import(&json);
    assert!(has_module(&model, "transformer.h.0.input_layernorm"));
    assert!(has_module(&model, "transformer.h.0.post_attention_layernorm"));
    assert_eq!(model.params(), import(FALCON_7B).params() + 32 * layer_norm(4544));
}

#[test]
fn falcon_bad_values_name_the_key() {
    assert_key_error(try_import(&RW_7B.replace("\"n_layer\": 32", "\"n_layer\": 0"), Naming::V5), "n_layer");
    assert_key_error(try_import(&RW_7B.replace("\"n_head\": 71", "\"n_head\": 7"), Naming::V5), "n_head");
    assert_key_error(
        try_import(&FALCON_40B_RW.replace("\"n_head_kv\": 8", "\"n_head_kv\": 6"), Naming::V5),
        "n_head_kv",
    );
    assert_key_error(
        try_import(&FALCON_7B.replace("\"num_hidden_layers\": 32", "\"num_hidden_layers\": 0"), Naming::V5),
        "num_hidden_layers",
    );
}

// ---------------------------------------------------------------- OPT

const OPT_125M: &str = r#"{
  "_remove_final_layer_norm": false, "activation_function": "relu", "architectures": ["OPTForCausalLM"],
  "do_layer_norm_before": true, "ffn_dim": 3072, "hidden_size": 768, "max_position_embeddings": 2048,
  "model_type": "opt", "num_attention_heads": 12, "num_hidden_layers": 12, "torch_dtype": "float16",
  "vocab_size": 50272, "word_embed_proj_dim": 768
}"#;

const OPT_350M: &str = r#"{
  "_remove_final_layer_norm": false, "activation_function": "relu", "architectures": ["OPTForCausalLM"],
  "do_layer_norm_before": false, "ffn_dim": 4096, "hidden_size": 1024, "max_position_embeddings": 2048,
  "model_type": "opt", "num_attention_heads": 16, "num_hidden_layers": 24, "torch_dtype": "float16",
  "vocab_size": 50272, "word_embed_proj_dim": 512
}"#;

fn opt_block(h: u64, ffn: u64) -> u64 {
    4 * linear(h, h, true) + layer_norm(h) + linear(h, ffn, true) + linear(ffn, h, true) + layer_norm(h)
}

#[test]
fn opt_125m_matches_published_count() {
    let model = import(OPT_125M);
    // Learned positions carry 2 extra rows (position ids are offset by 2).
    let closed = 50272 * 768 + (2048 + 2) * 768 + 12 * opt_block(768, 3072) + layer_norm(768);
    assert_eq!(closed, 125_239_296);
    assert_eq!(model.params(), 125_239_296);
    assert_eq!(shape(&model, "model.decoder.embed_positions.weight"), vec![2050, 768]);
    assert!(has_module(&model, "model.decoder.final_layer_norm"));
    assert!(has_module(&model, "model.decoder.layers.11.self_attn.out_proj"));
    assert_eq!(
        model.tied_groups(),
        vec![vec!["model.decoder.embed_tokens.weight".to_string(), "lm_head.weight".to_string()]]
    );
}

#[test]
fn opt_350m_projects_embeddings_and_drops_final_norm() {
    let model = import(OPT_350M);
    let (h, word) = (1024, 512);
    let closed = 50272 * word
        + (2048 + 2) * h
        + linear(h, word, false)
        + linear(word, h, false)
        + 24 * opt_block(h, 4096);
    assert_eq!(model.params(), closed);
    assert!(has_module(&model, "model.decoder.project_in"));
    assert!(has_module(&model, "model.decoder.project_out"));
    assert!(!has_module(&model, "model.decoder.final_layer_norm"));
    assert_eq!(shape(&model, "model.decoder.project_in.weight"), vec![h, word]);
    assert_eq!(shape(&model, "lm_head.weight"), vec![50272, word]);
}

// ---------------------------------------------------------------- BLOOM

const BLOOM_560M: &str = r#"{
  "architectures": ["BloomForCausalLM"], "model_type": "bloom", "n_embed": 1024, "n_inner": null,
  "n_layer": 24, "num_attention_heads": 16, "vocab_size": 250880
}"#;

#[test]
fn bloom_560m_matches_published_count() {
    let model = import(BLOOM_560M);
    let h = 1024;
    let block = layer_norm(h)
        + linear(h, 3 * h, true)
        + linear(h, h, true)
        + layer_norm(h)
        + linear(h, 4 * h, true)
        + linear(4 * h, h, true);
    let closed = 250880 * h + layer_norm(h) + 24 * block + layer_norm(h);
    assert_eq!(closed, 559_214_592);
    assert_eq!(model.params(), 559_214_592);
    assert!(has_module(&model, "transformer.word_embeddings_layernorm"));
    assert!(has_module(&model, "transformer.h.23.self_attention.query_key_value"));
    // ALiBi: no position embeddings and no buffers.
    assert_eq!(model.root.buffer_bytes(), 0);
    assert_eq!(model.facts.no_split_classes, vec!["BloomBlock".to_string()]);
}

// ---------------------------------------------------------------- T5

fn t5_config(d_model: u64, d_ff: u64, layers: u64, heads: u64, extra: &str) -> String {
    format!(
        r#"{{"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_ff": {d_ff},
        "d_kv": 64, "d_model": {d_model}, "n_positions": 512, "num_heads": {heads},
        "num_layers": {layers}, "relative_attention_num_buckets": 32, {extra} "vocab_size": 32128}}"#
    )
}

/// T5 with a tied head: shared embedding, encoder (self-attn + FF), decoder (self-attn, cross-attn,
/// FF), one relative bias table per stack, RMS norms with weight only.
fn t5_closed_form(d: u64, ff: u64, layers: u64, heads: u64, gated: bool, tied: bool) -> u64 {
    let vocab = 32128;
    let inner = heads * 64;
    let attention = 3 * d * inner + inner * d + d;
    let feed_forward = if gated { 3 * d * ff } else { 2 * d * ff } + d;
    let relative_bias = 32 * heads;
    let encoder = layers * (attention + feed_forward) + relative_bias + d;
    let decoder = layers * (2 * attention + feed_forward) + relative_bias + d;
    vocab * d + encoder + decoder + if tied { 0 } else { d * vocab }
}

#[test]
fn t5_small_and_base_match_published_counts() {
    let small = import(&t5_config(512, 2048, 6, 8, ""));
    assert_eq!(t5_closed_form(512, 2048, 6, 8, false, true), 60_506_624);
    assert_eq!(small.params(), 60_506_624);
    let base = import(&t5_config(768, 3072, 12, 12, ""));
    assert_eq!(t5_closed_form(768, 3072, 12, 12, false, true), 222_903_552);
    assert_eq!(base.params(), 222_903_552);
    let groups = base.tied_groups();
    assert_eq!(
        groups,
        vec![vec![
            "shared.weight".to_string(),
            "decoder.embed_tokens.weight".to_string(),
            "encoder.embed_tokens.weight".to_string(),
            "lm_head.weight".to_string(),
        ]]
    );
}

#[test]
fn t5_module_names_and_layer_facts() {
    let model = import(&t5_config(512, 2048, 6, 8, ""));
    assert_eq!(
        shape(&model, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
        vec![32, 8]
    );
    assert_eq!(
        shape(&model, "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
        vec![32, 8]
    );
    assert!(!has_module(&model, "encoder.block.1.layer.0.SelfAttention.relative_attention_bias"));
    assert!(!has_module(&model, "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias"));
    assert!(has_module(&model, "decoder.block.5.layer.1.EncDecAttention.o"));
    assert!(has_module(&model, "decoder.block.5.layer.2.DenseReluDense.wi"));
    assert!(has_module(&model, "encoder.block.5.layer.1.DenseReluDense.wo"));
    assert!(!has_module(&model, "encoder.block.0.layer.2"));
    assert_eq!(shape(&model, "encoder.final_layer_norm.weight"), vec![512]);
    assert!(model.root.tensor("encoder.final_layer_norm.bias").is_none());
    let facts = &model.facts.layers;
    assert_eq!(facts.len(), 12);
    assert!(facts[..6].iter().all(|l| l.stack == StackKind::Encoder && !l.cross_attention));
    assert!(facts[6..].iter().all(|l| l.stack == StackKind::Decoder && l.cross_attention));
    assert_eq!(facts[6].path, "decoder.block.0");
    assert_eq!(model.facts.no_split_classes, vec!["T5Block".to_string()]);
}

#[test]
fn flan_t5_gated_untied_closed_form() {
    // google/flan-t5-base: gated-gelu, separate lm_head.
    let json =
        t5_config(768, 2048, 12, 12, r#""feed_forward_proj": "gated-gelu", "tie_word_embeddings": false,"#);
    let model = import_v4(&json);
    assert_eq!(model.params(), t5_closed_form(768, 2048, 12, 12, true, false));
    assert!(has_module(&model, "decoder.block.11.layer.2.DenseReluDense.wi_1"));
    assert!(model.facts.gated_mlp);
    assert_eq!(model.facts.activation, "gelu_new");
    assert_eq!(model.tied_groups()[0].len(), 3, "lm_head stays untied in 4.x");
    // Flan-T5-base is published as a 248M model (counted with its own lm_head).
    assert_eq!(model.params() / 1_000_000, 247);
    // transformers 5.x ties lm_head to `shared` in every T5 (`T5Config` forces
    // `tie_word_embeddings = True`): fixtures/reference/models/v5/t0-3b.json lists
    // `lm_head.weight` in the tied group and 65,798,144 parameters fewer than v4/t0-3b.json.
    let v5 = import(&json);
    assert_eq!(v5.params(), t5_closed_form(768, 2048, 12, 12, true, true));
    assert_eq!(v5.tied_groups()[0].len(), 4, "5.x ties lm_head");
    assert!(v5.notes.iter().any(|n| n.contains("ties `lm_head`")), "{:?}", v5.notes);
}

#[test]
fn t5_rejects_malformed_feed_forward_proj() {
    let json = t5_config(512, 2048, 6, 8, r#""feed_forward_proj": "gated-gelu-new","#);
    assert_key_error(try_import(&json, Naming::V5), "feed_forward_proj");
}

// ---------------------------------------------------------------- BERT

const BERT_LARGE_MODEL: &str = r#"{
  "architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu", "hidden_size": 1024,
  "intermediate_size": 4096, "max_position_embeddings": 512, "num_attention_heads": 16,
  "num_hidden_layers": 24, "type_vocab_size": 2, "vocab_size": 30522
}"#;

fn bert_base_model(h: u64, layers: u64, inner: u64) -> u64 {
    let embeddings = 30522 * h + 512 * h + 2 * h + layer_norm(h);
    let layer = 3 * linear(h, h, true)
        + linear(h, h, true)
        + layer_norm(h)
        + linear(h, inner, true)
        + linear(inner, h, true)
        + layer_norm(h);
    embeddings + layers * layer
}

#[test]
fn bert_model_matches_published_counts() {
    let base_config = shared_config("google-bert__bert-base-uncased").replace("BertForMaskedLM", "BertModel");
    let base = import(&base_config);
    let pooler = linear(768, 768, true);
    assert_eq!(bert_base_model(768, 12, 3072) + pooler, 109_482_240);
    assert_eq!(base.params(), 109_482_240);
    let large = import(BERT_LARGE_MODEL);
    assert_eq!(bert_base_model(1024, 24, 4096) + linear(1024, 1024, true), 335_141_888);
    assert_eq!(large.params(), 335_141_888);
    // BertModel is the root: no `bert.` prefix.
    assert!(has_module(&base, "embeddings.word_embeddings"));
    assert!(has_module(&base, "encoder.layer.11.attention.self.query"));
    assert!(has_module(&base, "pooler.dense"));
    // position_ids and token_type_ids: int64 [1, 512], not saved.
    assert_eq!(base.root.buffer_bytes(), 2 * 512 * 8);
    assert_eq!(base.facts.no_split_classes, vec!["BertEmbeddings".to_string(), "BertLayer".to_string()]);
}

#[test]
fn bert_masked_lm_from_the_real_config() {
    let model = import(&shared_config("google-bert__bert-base-uncased"));
    let head = linear(768, 768, true) + layer_norm(768) + 30522;
    assert_eq!(model.params(), bert_base_model(768, 12, 3072) + head);
    assert!(!has_module(&model, "bert.pooler"), "BertForMaskedLM has no pooler");
    assert!(has_module(&model, "bert.encoder.layer.0.output.LayerNorm"));
    assert_eq!(shape(&model, "cls.predictions.bias"), vec![30522]);
    assert_eq!(
        model.tied_groups(),
        vec![
            vec![
                "bert.embeddings.word_embeddings.weight".to_string(),
                "cls.predictions.decoder.weight".to_string()
            ],
            vec!["cls.predictions.bias".to_string(), "cls.predictions.decoder.bias".to_string()],
        ]
    );
    assert!(model.facts.layers.iter().all(|l| l.stack == StackKind::Encoder));
}

#[test]
fn bert_sequence_classification_counts_labels() {
    let three = shared_config("google-bert__bert-base-uncased").replace(
        "\"BertForMaskedLM\"",
        "\"BertForSequenceClassification\"], \"id2label\": {\"0\": \"a\", \"1\": \"b\", \"2\": \"c\"}, \"x\": [0",
    );
    let model = import(&three);
    assert_eq!(model.params(), 109_482_240 + linear(768, 3, true));
    assert_eq!(shape(&model, "classifier.weight"), vec![3, 768]);
    assert!(has_module(&model, "bert.pooler.dense"));
    let default = shared_config("google-bert__bert-base-uncased")
        .replace("BertForMaskedLM", "BertForSequenceClassification");
    assert_eq!(import(&default).params(), 109_482_240 + linear(768, 2, true));
    let declared = default.replace("\"vocab_size\"", "\"num_labels\": 5, \"vocab_size\"");
    assert_eq!(import(&declared).params(), 109_482_240 + linear(768, 5, true));
}

#[test]
fn bert_heads_not_dividing_hidden_name_the_key() {
    let json = BERT_LARGE_MODEL.replace("\"num_attention_heads\": 16", "\"num_attention_heads\": 15");
    assert_key_error(try_import(&json, Naming::V5), "num_attention_heads");
    let json = BERT_LARGE_MODEL.replace("\"num_hidden_layers\": 24", "\"num_hidden_layers\": 0");
    assert_key_error(try_import(&json, Naming::V5), "num_hidden_layers");
}

// ---------------------------------------------------------------- XLNet

#[test]
fn xlnet_base_closed_form_from_the_real_config() {
    let model = import(&shared_config("xlnet__xlnet-base-cased"));
    let (d, heads, d_head, inner, layers, vocab) = (768, 12, 64, 3072, 12, 32000);
    let attention = 5 * d * heads * d_head + 3 * heads * d_head + 2 * heads * d_head + layer_norm(d);
    let feed_forward = layer_norm(d) + linear(d, inner, true) + linear(inner, d, true);
    let closed = vocab * d + d + layers * (attention + feed_forward) + vocab;
    assert_eq!(model.params(), closed);
    // xlnet-base-cased is published as a 117M model (110M for the encoder alone).
    assert_eq!(closed / 1_000_000, 116);
    assert_eq!(shape(&model, "transformer.layer.0.rel_attn.q"), vec![768, 12, 64]);
    assert_eq!(shape(&model, "transformer.layer.11.rel_attn.seg_embed"), vec![2, 12, 64]);
    assert_eq!(shape(&model, "transformer.mask_emb"), vec![1, 1, 768]);
    assert!(has_module(&model, "transformer.layer.11.ff.layer_2"));
    assert_eq!(
        model.tied_groups(),
        vec![vec!["transformer.word_embedding.weight".to_string(), "lm_loss.weight".to_string()]]
    );
    assert_eq!(shape(&model, "lm_loss.bias"), vec![32000]);
    assert!(model.facts.no_split_classes.is_empty(), "XLNet has no _no_split_modules");
}

#[test]
fn xlnet_inconsistent_head_width_names_the_key() {
    let json = shared_config("xlnet__xlnet-base-cased").replace("\"d_head\": 64", "\"d_head\": 60");
    assert_key_error(try_import(&json, Naming::V5), "d_head");
}

// ---------------------------------------------------------------- shared errors

#[test]
fn gpt2_bad_values_name_the_key() {
    assert_key_error(try_import(&GPT2.replace("\"n_layer\": 12", "\"n_layer\": 0"), Naming::V5), "n_layer");
    assert_key_error(try_import(&GPT2.replace("\"n_head\": 12", "\"n_head\": 10"), Naming::V5), "n_head");
    assert_key_error(
        try_import(
            &BLOOM_560M.replace("\"num_attention_heads\": 16", "\"num_attention_heads\": 15"),
            Naming::V5,
        ),
        "num_attention_heads",
    );
    assert_key_error(
        try_import(&OPT_125M.replace("\"hidden_size\": 768", "\"hidden_size\": 0"), Naming::V5),
        "hidden_size",
    );
}
